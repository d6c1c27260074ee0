package casq_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// staleBroker answers Enqueue with a redirect to a dead leader until its
// lease "runs out" after `redirects` calls, as a surviving broker does while
// a killed leader's shard lease is still valid.
type staleBroker struct {
	casqv1.UnimplementedQueueServiceServer
	deadLeader string
	redirects  int32
	calls      atomic.Int32
}

func (b *staleBroker) Enqueue(_ context.Context, req *casqv1.EnqueueRequest) (*casqv1.EnqueueResponse, error) {
	if b.calls.Add(1) <= b.redirects {
		st, _ := status.New(codes.Unavailable, "shard is led by a dead broker").
			WithDetails(&casqv1.LeaderRedirect{LeaderAddress: b.deadLeader})
		return nil, st.Err()
	}
	return &casqv1.EnqueueResponse{Messages: []*casqv1.EnqueuedMessage{{Id: "m1"}}}, nil
}

func TestRedirectToDeadLeaderWaitsInsteadOfBouncing(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	_ = dead.Close() // connection refused from now on

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Five stale redirects: following each one to the dead broker would
	// take ten attempts, more than the default eight.
	b := &staleBroker{deadLeader: deadAddr, redirects: 5}
	srv := grpc.NewServer()
	casqv1.RegisterQueueServiceServer(srv, b)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers: []string{lis.Addr().String()}, BackoffInitial: time.Millisecond, BackoffMax: 5 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Producer().Enqueue(context.Background(), "q", []byte("x"))
	if err != nil {
		t.Fatalf("enqueue during a takeover: %v (broker saw %d calls)", err, b.calls.Load())
	}
	if res.ID != "m1" || b.calls.Load() != 6 {
		t.Fatalf("result %+v after %d calls", res, b.calls.Load())
	}
}
