package casq_test

import (
	"context"
	"sync"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc"
)

// creditLog records the credit of every Open and Credit a worker sends.
type creditLog struct {
	mu     sync.Mutex
	grants []uint32
}

func (l *creditLog) largest() uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var m uint32
	for _, g := range l.grants {
		m = max(m, g)
	}
	return m
}

type creditStream struct {
	grpc.ClientStream
	log *creditLog
}

func (s creditStream) SendMsg(m any) error {
	if req, ok := m.(*casqv1.WorkRequest); ok {
		n, sent := req.GetCredit().GetCredits(), req.GetCredit() != nil
		if req.GetOpen() != nil {
			n, sent = req.GetOpen().GetCredits(), true
		}
		if sent {
			s.log.mu.Lock()
			s.log.grants = append(s.log.grants, n)
			s.log.mu.Unlock()
		}
	}
	return s.ClientStream.SendMsg(m)
}

func dialCounting(t *testing.T) (*casq.Client, *creditLog) {
	t.Helper()
	log := &creditLog{}
	intercept := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return creditStream{ClientStream: s, log: log}, nil
	}
	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers: []string{serverAddr}, Timeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainStreamInterceptor(intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, log
}

// drain enqueues n jobs, runs a worker with fast handlers until all are
// handled, and returns its credit log.
func drain(t *testing.T, n int, opts ...casq.WorkerOption) *creditLog {
	t.Helper()
	c, log := dialCounting(t)
	ctx := context.Background()
	queue := queueName(t)
	for i := 0; i < n; i += 100 {
		msgs := make([]casq.Message, min(100, n-i))
		for j := range msgs {
			msgs[j] = casq.Message{Payload: []byte("x")}
		}
		if _, err := c.Producer().EnqueueBatch(ctx, queue, msgs); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	all := make(chan struct{})
	stop := runWorker(t, c, queue, func(ctx context.Context, job *casq.Job) error {
		mu.Lock()
		defer mu.Unlock()
		seen[job.ID] = true
		if len(seen) == n {
			close(all)
		}
		return nil
	}, opts...)
	wait(t, all)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	return log
}

// Fast handlers wait for the broker's round trip, not for jobs: the window
// grows past the concurrency, up to the maximum.
func TestAdaptivePrefetchGrows(t *testing.T) {
	log := drain(t, 400, casq.WithConcurrency(2), casq.WithMaxPrefetch(16))
	if m := log.largest(); m <= 2 || m > 16 {
		t.Fatalf("largest grant %d, want in (2, 16]", m)
	}
}

// WithPrefetch fixes the window: no grant passes it.
func TestFixedPrefetch(t *testing.T) {
	log := drain(t, 200, casq.WithConcurrency(2), casq.WithPrefetch(4))
	if m := log.largest(); m != 4 {
		t.Fatalf("largest grant %d, want 4", m)
	}
}
