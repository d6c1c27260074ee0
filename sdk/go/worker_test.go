package casq_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
)

// fastRetries creates queue with a tiny retry backoff.
func fastRetries(t *testing.T, c *casq.Client, queue string) {
	t.Helper()
	_, err := c.Admin().CreateQueue(context.Background(), queue, 1, &casqv1.QueueConfig{
		Backoff: &casqv1.BackoffPolicy{InitialDelay: durationpb.New(10 * time.Millisecond), MaxDelay: durationpb.New(20 * time.Millisecond)},
	})
	if err != nil {
		t.Fatal(err)
	}
}

// runWorker runs a worker in the background; the returned func stops it and
// returns Run's error.
func runWorker(t *testing.T, c *casq.Client, queue string, h casq.Handler, opts ...casq.WorkerOption) func() error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Worker().Run(ctx, queue, h, opts...) }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(20 * time.Second):
				err = errors.New("worker did not stop")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func wait[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(15 * time.Second):
		t.Fatal("timed out")
		var zero T
		return zero
	}
}

func TestEnqueueAndWorkAck(t *testing.T) {
	c := dial(t)
	ctx := context.Background()
	queue := queueName(t)
	res, err := c.Producer().Enqueue(ctx, queue, []byte("hello"), casq.WithHeaders(map[string]string{"k": "v"}), casq.WithDedupID("d1"))
	if err != nil {
		t.Fatal(err)
	}
	if res.ID == "" || res.Duplicate {
		t.Fatalf("result %+v", res)
	}
	again, err := c.Producer().Enqueue(ctx, queue, []byte("hello"), casq.WithDedupID("d1"))
	if err != nil || !again.Duplicate || again.ID != res.ID {
		t.Fatalf("dedup: %+v %v", again, err)
	}
	got := make(chan *casq.Job, 1)
	stop := runWorker(t, c, queue, func(ctx context.Context, job *casq.Job) error {
		got <- job
		return nil
	})
	job := wait(t, got)
	if string(job.Payload) != "hello" || job.ID != res.ID || job.Attempt != 1 || job.Headers["k"] != "v" {
		t.Fatalf("job %+v", job)
	}
	// The ack lands: the queue drains.
	deadline := time.Now().Add(10 * time.Second)
	for {
		q, err := c.Admin().GetQueue(ctx, queue)
		if err != nil {
			t.Fatal(err)
		}
		if q.GetTotals().GetMessages() == 0 && q.GetTotals().GetInFlight() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not acked: %v", q.GetTotals())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestHandlerErrorRedelivers(t *testing.T) {
	c := dial(t)
	queue := queueName(t)
	fastRetries(t, c, queue)
	if _, err := c.Producer().Enqueue(context.Background(), queue, []byte("x")); err != nil {
		t.Fatal(err)
	}
	attempts := make(chan uint32, 4)
	runWorker(t, c, queue, func(ctx context.Context, job *casq.Job) error {
		attempts <- job.Attempt
		if job.Attempt == 1 {
			return errors.New("boom")
		}
		return nil
	})
	if a := wait(t, attempts); a != 1 {
		t.Fatalf("first attempt %d", a)
	}
	if a := wait(t, attempts); a != 2 {
		t.Fatalf("second attempt %d", a)
	}
}

func TestDeadLetterAndRedrive(t *testing.T) {
	c := dial(t)
	ctx := context.Background()
	queue := queueName(t)
	res, err := c.Producer().Enqueue(ctx, queue, []byte("poison"))
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan *casq.Job, 4)
	stop := runWorker(t, c, queue, func(ctx context.Context, job *casq.Job) error {
		seen <- job
		if job.Attempt == 1 {
			return casq.DeadLetter(errors.New("bad payload"))
		}
		return nil
	})
	wait(t, seen)
	var dead []*casqv1.DeadLetter
	deadline := time.Now().Add(10 * time.Second)
	for len(dead) == 0 {
		if dead, err = c.Admin().ListDeadLetters(ctx, queue, ""); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("no dead letter")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if dead[0].GetMessage().GetId() != res.ID || dead[0].GetReason() != "bad payload" {
		t.Fatalf("dead letter %v", dead[0])
	}
	n, err := c.Admin().Redrive(ctx, queue, "")
	if err != nil || n != 1 {
		t.Fatalf("redrive %d %v", n, err)
	}
	if j := wait(t, seen); j.ID != res.ID {
		t.Fatalf("redriven job %+v", j)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestPriorityOrder(t *testing.T) {
	c := dial(t)
	ctx := context.Background()
	queue := queueName(t)
	_, err := c.Producer().EnqueueBatch(ctx, queue, []casq.Message{
		{Payload: []byte("low"), Options: []casq.EnqueueOption{casq.WithPriority(-5)}},
		{Payload: []byte("mid")},
		{Payload: []byte("high"), Options: []casq.EnqueueOption{casq.WithPriority(10)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 3)
	runWorker(t, c, queue, func(ctx context.Context, job *casq.Job) error {
		got <- string(job.Payload)
		return nil
	})
	for _, want := range []string{"high", "mid", "low"} {
		if p := wait(t, got); p != want {
			t.Fatalf("got %q, want %q", p, want)
		}
	}
}

func TestGracefulShutdownWaitsForHandler(t *testing.T) {
	c := dial(t)
	ctx := context.Background()
	queue := queueName(t)
	if _, err := c.Producer().Enqueue(ctx, queue, []byte("slow")); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	var finished sync.WaitGroup
	finished.Add(1)
	doneAt := make(chan time.Time, 1)
	stop := runWorker(t, c, queue, func(ctx context.Context, job *casq.Job) error {
		defer finished.Done()
		close(started)
		time.Sleep(500 * time.Millisecond)
		doneAt <- time.Now()
		return nil
	}, casq.WithShutdownTimeout(10*time.Second))
	wait(t, started)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	select {
	case at := <-doneAt:
		if at.After(stoppedAt) {
			t.Fatal("Run returned before the handler finished")
		}
	default:
		t.Fatal("Run returned before the handler finished")
	}
	// The job was acked on the way out.
	q, err := c.Admin().GetQueue(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	if q.GetTotals().GetMessages() != 0 {
		t.Fatalf("job not acked: %v", q.GetTotals())
	}
}

func TestShutdownTimeoutNeverAcks(t *testing.T) {
	c := dial(t)
	ctx := context.Background()
	queue := queueName(t)
	if _, err := c.Producer().Enqueue(ctx, queue, []byte("stuck")); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	release := make(chan struct{})
	defer close(release)
	stop := runWorker(t, c, queue, func(ctx context.Context, job *casq.Job) error {
		close(started)
		select {
		case <-ctx.Done():
		case <-release:
		}
		return nil // even a "success" after the deadline must not be acked
	}, casq.WithShutdownTimeout(100*time.Millisecond))
	wait(t, started)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	q, err := c.Admin().GetQueue(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	if q.GetTotals().GetInFlight() != 1 {
		t.Fatalf("abandoned job should stay leased: %v", q.GetTotals())
	}
}

func TestErrors(t *testing.T) {
	c := dial(t)
	ctx := context.Background()
	_, err := c.Admin().GetQueue(ctx, "no-such-queue")
	if !casq.IsNotFound(err) || casq.IsRedirect(err) {
		t.Fatalf("want NOT_FOUND, got %v", err)
	}
	var e *casq.Error
	if !errors.As(err, &e) || e.Code != codes.NotFound {
		t.Fatalf("want *casq.Error, got %T", err)
	}
	// A worker on a missing queue fails fast.
	err = c.Worker().Run(ctx, "no-such-queue", func(context.Context, *casq.Job) error { return nil })
	if !casq.IsNotFound(err) {
		t.Fatalf("worker: %v", err)
	}
	if !errors.Is(casq.DeadLetter(errors.New("x")), casq.ErrDeadLetter) {
		t.Fatal("DeadLetter does not wrap ErrDeadLetter")
	}
}

func TestFailoverToLiveBroker(t *testing.T) {
	// The first broker is down: calls fail over to the second.
	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers: []string{"127.0.0.1:1", serverAddr}, Timeout: 2 * time.Second,
		BackoffInitial: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Producer().Enqueue(context.Background(), queueName(t), []byte("x")); err != nil {
		t.Fatal(err)
	}
}

func TestTraceParentPropagates(t *testing.T) {
	c := dial(t)
	queue := queueName(t)
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if _, err := c.Producer().Enqueue(casq.WithTraceParent(context.Background(), tp), queue, []byte("x")); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	runWorker(t, c, queue, func(ctx context.Context, job *casq.Job) error {
		got <- job.TraceParent + "|" + casq.TraceParent(ctx)
		return nil
	})
	if g := wait(t, got); g != tp+"|"+tp {
		t.Fatalf("trace context %q", g)
	}
}
