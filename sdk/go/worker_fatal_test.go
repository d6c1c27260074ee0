package casq_test

// When Run returns early on a failure retrying cannot fix, the handlers
// still running are cancelled and have returned by the time Run does. Real
// casq serve, with a TCP proxy between the worker and the broker.

import (
	"context"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc/codes"
)

func TestWorkerFatalErrorCancelsRunningHandlers(t *testing.T) {
	direct := dial(t)
	ctx := context.Background()
	queue := queueName(t)
	fastRetries(t, direct, queue)
	if _, err := direct.Admin().CreateSubscription(ctx, queue, "s1", casqv1.SubscriptionStart_SUBSCRIPTION_START_EARLIEST); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Producer().Enqueue(ctx, queue, []byte("long job")); err != nil {
		t.Fatal(err)
	}
	c, proxy := proxiedClient(t)
	started := make(chan *casq.Job, 1)
	returned := make(chan struct{})
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- c.Worker().Run(rctx, queue, func(ctx context.Context, job *casq.Job) error {
			started <- job
			<-ctx.Done()
			close(returned)
			return ctx.Err()
		}, casq.WithSubscription("s1"), casq.WithLogger(nil),
			// No heartbeat (every third of the TTL) falls within the test:
			// the subscription's end is found by the stream's reopen only.
			casq.WithLeaseTTL(time.Minute))
	}()
	wait(t, started)

	// The stream breaks and, while the worker cannot reach the broker, its
	// subscription goes away: the reopen answers NOT_FOUND, which ends Run.
	proxy.block()
	if _, err := direct.Admin().DeleteSubscription(ctx, queue, "s1"); err != nil {
		t.Fatal(err)
	}
	proxy.unblock()
	err := wait(t, errc)
	if casq.Code(err) != codes.NotFound {
		t.Fatalf("Run returned %v, want NOT_FOUND", err)
	}
	select {
	case <-returned:
	default:
		t.Fatal("Run returned while a handler still ran with its context not cancelled")
	}
}
