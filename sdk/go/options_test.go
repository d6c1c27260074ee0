package casq_test

// Client options a user brings: gRPC dial options (interceptors here) reach
// every call, unary and stream; and a Job carries where its message is and
// how long its lease runs.

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
	"google.golang.org/grpc"
)

func TestDialOptionsInterceptorsSeeCalls(t *testing.T) {
	var mu sync.Mutex
	var unary, streams []string
	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers: []string{serverAddr},
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				mu.Lock()
				unary = append(unary, method)
				mu.Unlock()
				return invoker(ctx, method, req, reply, cc, opts...)
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				mu.Lock()
				streams = append(streams, method)
				mu.Unlock()
				return streamer(ctx, desc, cc, method, opts...)
			}),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	queue := queueName(t)
	if _, err := c.Producer().Enqueue(context.Background(), queue, []byte("x")); err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{}, 1)
	stop := runWorker(t, c, queue, func(context.Context, *casq.Job) error {
		got <- struct{}{}
		return nil
	})
	wait(t, got)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(unary, "/casq.v1.QueueService/Enqueue") {
		t.Errorf("unary interceptor saw %q, want Enqueue among them", unary)
	}
	if !slices.Contains(streams, "/casq.v1.QueueService/Work") {
		t.Errorf("stream interceptor saw %q, want Work among them", streams)
	}
}

func TestJobLocationDedupAndLeaseDeadline(t *testing.T) {
	c := dial(t)
	queue := queueName(t)
	// The second message, so that its offset is not the zero value.
	if _, err := c.Producer().Enqueue(context.Background(), queue, []byte("first")); err != nil {
		t.Fatal(err)
	}
	res, err := c.Producer().Enqueue(context.Background(), queue, []byte("x"), casq.WithDedupID("order-7"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Offset == 0 {
		t.Fatalf("second message at offset 0: %+v", res)
	}
	got := make(chan *casq.Job, 2)
	before := time.Now()
	stop := runWorker(t, c, queue, func(_ context.Context, job *casq.Job) error {
		got <- job
		return nil
	}, casq.WithLeaseTTL(time.Minute))
	wait(t, got)
	job := wait(t, got)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if job.ID != res.ID || job.Shard != res.Shard || job.Offset != res.Offset || job.DedupID != "order-7" {
		t.Errorf("job id %s shard %d offset %d dedup %q; enqueued %+v with dedup order-7", job.ID, job.Shard, job.Offset, job.DedupID, res)
	}
	// A one-minute lease granted after the worker started ends after that
	// start plus most of a minute (clocks of one machine).
	if !job.LeaseDeadline.After(before.Add(50 * time.Second)) {
		t.Errorf("lease deadline %v, want about a minute after %v", job.LeaseDeadline, before)
	}
}
