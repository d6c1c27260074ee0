package casq_test

// A worker whose Work stream breaks while a job runs keeps the job's lease by
// unary heartbeats, cancels the handler when a heartbeat finds the lease
// lost, and reports no loss for jobs it acked. Real casq serve, with a TCP
// proxy between the worker and the broker that the tests cut.

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
)

// shortLease is the lease TTL of the tests' workers: the broker asks for a
// heartbeat every third of it, so a job outlives many leases.
const shortLease = 600 * time.Millisecond

// errorLog collects what a worker's error handler received.
type errorLog struct {
	mu   sync.Mutex
	errs []string
}

func (l *errorLog) add(err error, job *casq.Job) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id := ""
	if job != nil {
		id = job.ID
	}
	l.errs = append(l.errs, id+": "+err.Error())
}

func (l *errorLog) matching(sub string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.errs {
		if strings.Contains(e, sub) {
			out = append(out, e)
		}
	}
	return out
}

// proxiedClient dials the broker through a new proxy only.
func proxiedClient(t *testing.T) (*casq.Client, *tcpProxy) {
	t.Helper()
	p := startProxy(t, serverAddr)
	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers: []string{p.addr}, Timeout: 2 * time.Second,
		BackoffInitial: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, p
}

// drained waits until every message of queue is acked.
func drained(t *testing.T, c *casq.Client, queue string) {
	t.Helper()
	eventually(t, "the queue drained", func() bool {
		q, err := c.Admin().GetQueue(context.Background(), queue)
		return err == nil && q.GetTotals().GetMessages() == 0 && q.GetTotals().GetInFlight() == 0
	})
}

func TestWorkerKeepsLeaseAfterStreamDrop(t *testing.T) {
	direct := dial(t)
	queue := queueName(t)
	fastRetries(t, direct, queue)
	if _, err := direct.Producer().Enqueue(context.Background(), queue, []byte("long job")); err != nil {
		t.Fatal(err)
	}
	c, proxy := proxiedClient(t)
	var errs errorLog
	started := make(chan *casq.Job, 1)
	release := make(chan struct{})
	cancelled := make(chan struct{})
	runWorker(t, c, queue, func(ctx context.Context, job *casq.Job) error {
		started <- job
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			close(cancelled)
			return ctx.Err()
		}
	}, casq.WithLeaseTTL(shortLease), casq.WithErrorHandler(errs.add))
	job := wait(t, started)
	// A second worker, straight to the broker, gets the job if its lease
	// runs out.
	var again atomic.Int32
	runWorker(t, direct, queue, func(context.Context, *casq.Job) error {
		again.Add(1)
		return nil
	}, casq.WithLeaseTTL(shortLease))

	proxy.drop()
	eventually(t, "the worker connected again", func() bool { return proxy.connections() > 1 })
	// The job runs for several leases after its stream is gone.
	end := time.Now().Add(6 * shortLease)
	for time.Now().Before(end) {
		if n := again.Load(); n > 0 {
			t.Fatalf("the job was delivered again while its handler ran (errors: %q)", errs.matching(""))
		}
		select {
		case <-cancelled:
			t.Fatalf("the handler was cancelled (errors: %q)", errs.matching(""))
		case <-time.After(20 * time.Millisecond):
		}
	}
	close(release)
	drained(t, direct, queue)
	if n := again.Load(); n > 0 {
		t.Fatalf("the job was delivered %d more times", n)
	}
	if lost := errs.matching("lease lost"); len(lost) > 0 {
		t.Fatalf("job %s: lease lost reported: %q", job.ID, lost)
	}
}

func TestWorkerCancelsHandlerWhenHeartbeatFindsLeaseLost(t *testing.T) {
	direct := dial(t)
	queue := queueName(t)
	fastRetries(t, direct, queue)
	if _, err := direct.Producer().Enqueue(context.Background(), queue, []byte("long job")); err != nil {
		t.Fatal(err)
	}
	c, proxy := proxiedClient(t)
	var errs errorLog
	started := make(chan *casq.Job, 1)
	cancelled := make(chan struct{})
	stop := runWorker(t, c, queue, func(ctx context.Context, job *casq.Job) error {
		started <- job
		<-ctx.Done()
		close(cancelled)
		return ctx.Err()
	}, casq.WithLeaseTTL(shortLease), casq.WithErrorHandler(errs.add))
	job := wait(t, started)
	// Cut the worker off until its lease has run out and another worker
	// took the job and acked it.
	proxy.block()
	other := make(chan *casq.Job, 1)
	stopOther := runWorker(t, direct, queue, func(_ context.Context, j *casq.Job) error {
		other <- j
		return nil
	}, casq.WithLeaseTTL(shortLease))
	if j := wait(t, other); j.ID != job.ID || j.Attempt != 2 {
		t.Fatalf("other worker got %s attempt %d, want %s attempt 2", j.ID, j.Attempt, job.ID)
	}
	drained(t, direct, queue)
	if err := stopOther(); err != nil {
		t.Fatal(err)
	}
	proxy.unblock()
	// The first worker's next heartbeat finds the lease gone.
	wait(t, cancelled)
	eventually(t, "the loss reported", func() bool { return len(errs.matching(job.ID+": casq: lease lost")) > 0 })
	// The nack of the cancelled handler, answered LEASE_LOST, is not a
	// second report of the same loss.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if lost := errs.matching(job.ID + ": casq: lease lost"); len(lost) != 1 {
		t.Fatalf("want the loss reported once, got %q", lost)
	}
}
