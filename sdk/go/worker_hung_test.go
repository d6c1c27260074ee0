package casq_test

// A worker whose broker hangs (SIGSTOP keeps its connections open, so the
// Work stream does not break) gives the stream up once a request on it goes
// unanswered for the client's Timeout, and settles by unary call at the
// broker that takes the shards over. Two real casq serve processes on one
// file store.

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
)

func TestWorkerAckLandsWhenLeaderHangs(t *testing.T) {
	bs := startBrokers(t, 2, "--leader-lease", "2s")
	ctx := context.Background()
	queue := queueName(t)
	// The first broker leads the queue's shard.
	first, err := casq.Dial(ctx, casq.Options{Brokers: []string{bs[0].addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if _, err := first.Admin().CreateQueue(ctx, queue, 1, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Producer().Enqueue(ctx, queue, []byte("job")); err != nil {
		t.Fatal(err)
	}

	c, err := casq.Dial(ctx, casq.Options{
		Brokers: []string{bs[0].addr, bs[1].addr}, Timeout: time.Second,
		BackoffInitial: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Closed after the worker stopped (cleanups run last first).
	t.Cleanup(func() { _ = c.Close() })
	var errs errorLog
	var hung atomic.Int32
	var runs atomic.Int32
	started := make(chan *casq.Job, 10)
	release := make(chan struct{})
	runWorker(t, c, queue, func(ctx context.Context, job *casq.Job) error {
		runs.Add(1)
		started <- job
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, casq.WithLeaseTTL(40*time.Second), casq.WithErrorHandler(func(err error, job *casq.Job) {
		var st *casq.StreamTimeoutError
		if errors.As(err, &st) && st.Broker == bs[0].addr {
			hung.Add(1)
		}
		errs.add(err, job)
	}))
	job := wait(t, started)

	// The leader hangs while the job runs; the handler then finishes, so
	// its ack goes on the stream to the hung broker.
	if err := bs[0].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	close(release)

	// The ack lands through the other broker once it has taken the shard
	// over, long before the job's lease (40 s) could run out.
	other, err := casq.Dial(ctx, casq.Options{Brokers: []string{bs[1].addr}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	end := time.Now().Add(30 * time.Second)
	for {
		q, err := other.Admin().GetQueue(ctx, queue)
		if err == nil && q.GetTotals().GetMessages() == 0 && q.GetTotals().GetInFlight() == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("job %s not acked with its leader hung: %+v %v (errors: %q)", job.ID, q.GetTotals(), err, errs.matching(""))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the job ran %d times, want once", n)
	}
	if hung.Load() == 0 {
		t.Fatalf("no StreamTimeoutError naming %s reported (errors: %q)", bs[0].addr, errs.matching(""))
	}
	if lost := errs.matching("lease lost"); len(lost) > 0 {
		t.Fatalf("lease lost reported: %q", lost)
	}
}
