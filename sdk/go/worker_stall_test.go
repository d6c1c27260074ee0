package casq_test

// A broker that stops reading its Work stream (a frozen process, here a
// proxy that forwards nothing) fills the stream's HTTP/2 flow-control
// window, and a gRPC Send on it then blocks until the connection closes.
// The worker's loop must not wait on it: its watchdog gives the stream up
// after the client's Timeout (or at once, when the stream's send queue is
// full), the requests go by unary calls to the next broker, and the
// stream's sender goroutine ends with the stream.

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
	"google.golang.org/grpc/codes"
)

func TestWorkerLoopRunsWhileBrokerStopsReading(t *testing.T) {
	proxy := startFreezableProxy(t, serverAddr)
	ctx := context.Background()
	c, err := casq.Dial(ctx, casq.Options{
		Brokers: []string{proxy.addr, serverAddr}, Timeout: time.Second,
		// Only the watchdog may notice the hang, not keepalive.
		KeepaliveTimeout: time.Hour,
		BackoffInitial:   50 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Closed after the worker stopped (cleanups run last first).
	t.Cleanup(func() { _ = c.Close() })
	direct := dial(t)
	queue := queueName(t)
	if _, err := direct.Admin().CreateQueue(ctx, queue, 1, nil); err != nil {
		t.Fatal(err)
	}
	const jobs = 64
	for range jobs {
		if _, err := direct.Producer().Enqueue(ctx, queue, []byte("job")); err != nil {
			t.Fatal(err)
		}
	}

	var errs errorLog
	var hung atomic.Int32
	started := make(chan struct{}, jobs)
	release := make(chan struct{})
	var releaseOnce sync.Once
	// Each job is dead-lettered with a 4 KiB reason: 64 nacks are far more
	// than the 64 KiB HTTP/2 lets the stream send unread.
	reason := errors.New(strings.Repeat("x", 4096))
	stop := runWorker(t, c, queue, func(context.Context, *casq.Job) error {
		started <- struct{}{}
		<-release
		return casq.DeadLetter(reason)
	}, casq.WithConcurrency(jobs), casq.WithPrefetch(jobs), casq.WithLogger(nil),
		casq.WithErrorHandler(func(err error, job *casq.Job) {
			var st *casq.StreamTimeoutError
			if errors.As(err, &st) && st.Broker == proxy.addr {
				hung.Add(1)
			}
			if job == nil {
				errs.add(err, job)
			}
		}))
	// A failed test still lets the worker stop.
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	for range jobs {
		wait(t, started)
	}

	// The broker stops reading while every job runs; then every handler
	// finishes, and the nacks go on the stream to the frozen broker.
	proxy.frozen.Store(true)
	releaseOnce.Do(func() { close(release) })

	end := time.Now().Add(15 * time.Second)
	for hung.Load() == 0 {
		if time.Now().After(end) {
			t.Fatalf("no StreamTimeoutError naming %s within 15 s: the worker's loop is stuck (errors: %q)", proxy.addr, errs.matching(""))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The nacks land by unary calls at the broker itself.
	for {
		q, err := direct.Admin().GetQueue(ctx, queue)
		if err == nil && q.GetTotals().GetInFlight() == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("jobs still in flight: %+v %v (errors: %q)", q.GetTotals(), err, errs.matching(""))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The frozen stream's sender goroutine ended with it; the stream the
	// worker opened since has one.
	eventually(t, "one stream sender left", func() bool { return senders() <= 1 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := senders(); n != 0 {
		t.Fatalf("%d stream senders still running after Run returned", n)
	}
}

// senders counts the goroutines sending on a worker's Work streams.
func senders() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "casq.(*run).sendLoop") {
			count++
		}
	}
	return count
}

// A stream whose broker reads nothing while the worker has more to send on
// it than its send queue holds (here a heartbeat every millisecond, with
// the watchdog off) is given up at once, as a broken one: reported, opened
// again at the next broker, and the job it delivered is acked by a unary
// call there.
func TestWorkerGivesUpStreamItCannotSendOn(t *testing.T) {
	// Long receipts: HTTP/2 flow control stops the stream after a few dozen
	// heartbeats, and the worker's queue fills soon after.
	fa := startFakeLeader(t, strings.Repeat("A", 1024), 0, 1, "a0")
	fa.snapshot(func(f *fakeLeader) { f.beatEvery = time.Millisecond })
	proxy := startFreezableProxy(t, fa.addr)
	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers: []string{proxy.addr, fa.addr}, Timeout: time.Hour, KeepaliveTimeout: time.Hour,
		BackoffInitial: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Closed after the worker stopped (cleanups run last first).
	t.Cleanup(func() { _ = c.Close() })
	unread := make(chan error, 1)
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	var releaseOnce sync.Once
	stop := runWorker(t, c, "q", func(context.Context, *casq.Job) error {
		started <- struct{}{}
		<-release
		return nil
	}, casq.WithPrefetch(1), casq.WithLogger(nil), casq.WithErrorHandler(func(err error, _ *casq.Job) {
		if strings.Contains(err.Error(), "requests unread") {
			select {
			case unread <- err:
			default:
			}
		}
	}))
	// A failed test still lets the worker stop.
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	wait(t, started)

	proxy.frozen.Store(true)
	if err := wait(t, unread); casq.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), proxy.addr) {
		t.Fatalf("reported %v (code %v), want UNAVAILABLE naming %s", err, casq.Code(err), proxy.addr)
	}
	eventually(t, "a stream straight to the broker", func() (ok bool) {
		fa.snapshot(func(f *fakeLeader) { ok = f.opens == 2 })
		return ok
	})
	releaseOnce.Do(func() { close(release) })
	eventually(t, "the unary ack", func() (ok bool) {
		fa.snapshot(func(f *fakeLeader) { ok = len(f.unaryAcks) == 1 })
		return ok
	})
	eventually(t, "one stream sender left", func() bool { return senders() <= 1 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := senders(); n != 0 {
		t.Fatalf("%d stream senders still running after Run returned", n)
	}
}
