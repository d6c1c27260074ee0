package casq_test

// Every ack or nack that did not do what the worker asked reaches the error
// handler with its job: one sent after the lease was lost (the message was
// delivered again meanwhile) is a *casq.LeaseLostError. Real casq serve,
// with a TCP proxy between the first worker and the broker.

import (
	"context"
	"errors"
	"sync"
	"testing"

	casq "github.com/casq/casq/sdk/go"
)

func TestWorkerReportsSettleAfterLeaseLost(t *testing.T) {
	for _, op := range []string{"ack", "nack"} {
		t.Run(op, func(t *testing.T) {
			direct := dial(t)
			queue := queueName(t)
			fastRetries(t, direct, queue)
			if _, err := direct.Producer().Enqueue(context.Background(), queue, []byte("job")); err != nil {
				t.Fatal(err)
			}
			c, proxy := proxiedClient(t)
			var mu sync.Mutex
			var lost []*casq.LeaseLostError
			var jobs []*casq.Job
			started := make(chan *casq.Job, 1)
			release := make(chan struct{})
			runWorker(t, c, queue, func(_ context.Context, job *casq.Job) error {
				started <- job
				<-release // deaf to the lease's loss: it settles anyway
				if op == "nack" {
					return errors.New("failed")
				}
				return nil
			}, casq.WithLeaseTTL(shortLease), casq.WithLogger(nil), casq.WithErrorHandler(func(err error, job *casq.Job) {
				var e *casq.LeaseLostError
				if errors.As(err, &e) && e.Op == op {
					mu.Lock()
					lost, jobs = append(lost, e), append(jobs, job)
					mu.Unlock()
				}
			}))
			job := wait(t, started)
			// Cut off, the first worker loses the lease; a second worker
			// gets the job again and keeps it.
			proxy.block()
			other := make(chan *casq.Job, 1)
			hold := make(chan struct{})
			defer close(hold)
			runWorker(t, direct, queue, func(ctx context.Context, j *casq.Job) error {
				other <- j
				select {
				case <-hold:
				case <-ctx.Done():
				}
				return nil
			}, casq.WithLeaseTTL(shortLease))
			if j := wait(t, other); j.ID != job.ID || j.Attempt != 2 {
				t.Fatalf("other worker got %s attempt %d, want %s attempt 2", j.ID, j.Attempt, job.ID)
			}
			proxy.unblock()
			close(release)
			eventually(t, "the "+op+" reported as lease lost", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(lost) > 0
			})
			mu.Lock()
			defer mu.Unlock()
			if e := lost[0]; len(lost) != 1 || e.JobID != job.ID || e.Attempt != 1 || e.Receipt != job.Receipt || jobs[0] == nil || jobs[0].ID != job.ID {
				t.Fatalf("reported %+v with jobs %+v; want one for job %s attempt 1", lost, jobs, job.ID)
			}
			if casq.Code(lost[0]).String() != "Aborted" {
				t.Fatalf("code %v, want Aborted", casq.Code(lost[0]))
			}
		})
	}
}
