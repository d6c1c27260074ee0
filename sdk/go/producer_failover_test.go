package casq_test

// A producer whose broker hangs (SIGSTOP) leaves it after its per-attempt
// timeout and stores the message at the other broker within RetryTimeout,
// and every attempt of the call carries the same default dedup id, so an
// attempt the hung broker stores after all is not stored twice.

import (
	"context"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// startBrokers starts n casq serve processes on one file store, killed when
// the test ends (SIGCONT first, should one be stopped).
func startBrokers(t *testing.T, n int, args ...string) []*broker {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	dir := t.TempDir()
	var out []*broker
	t.Cleanup(func() {
		for _, b := range out {
			_ = b.cmd.Process.Signal(syscall.SIGCONT)
			_ = b.cmd.Process.Signal(syscall.SIGKILL)
			_ = b.cmd.Wait()
			if t.Failed() {
				t.Logf("broker %s output:\n%s", b.addr, b.log)
			}
		}
	})
	for range n {
		b, err := startBroker(root, "file:"+dir, "127.0.0.1:0", &lockedLines{}, args...)
		if b != nil {
			out = append(out, b)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// enqueueAttempt is one Enqueue RPC as the client sent it.
type enqueueAttempt struct {
	target string
	dedup  string
	code   string
}

func TestProducerLeavesHungBroker(t *testing.T) {
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
	if _, err := first.Producer().Enqueue(ctx, queue, []byte("before")); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var attempts []enqueueAttempt
	record := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if r, ok := req.(*casqv1.EnqueueRequest); ok {
			mu.Lock()
			attempts = append(attempts, enqueueAttempt{target: cc.Target(), dedup: r.GetMessages()[0].GetDedupId(), code: status.Code(err).String()})
			mu.Unlock()
		}
		return err
	}
	c, err := casq.Dial(ctx, casq.Options{
		Brokers: []string{bs[0].addr, bs[1].addr}, Timeout: time.Second, RetryTimeout: 20 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(record)},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	if err := bs[0].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	res, err := c.Producer().Enqueue(ctx, queue, []byte("during"))
	mu.Lock()
	got := append([]enqueueAttempt(nil), attempts...)
	mu.Unlock()
	if err != nil {
		t.Fatalf("enqueue with the leader stopped: %v (attempts %+v)", err, got)
	}
	if len(got) < 2 || got[0].target != bs[0].addr || got[0].code != "DeadlineExceeded" || got[len(got)-1].target != bs[1].addr {
		t.Fatalf("attempts %+v: want the stopped broker's timeout, then the other broker", got)
	}
	for _, a := range got {
		if a.dedup == "" || a.dedup != got[0].dedup {
			t.Fatalf("attempts %+v: want one non-empty dedup id in every attempt", got)
		}
	}
	if err := bs[0].cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The message is stored under the call's dedup id: whatever the resumed
	// broker does with the attempt it held, the id finds the stored message.
	again, err := c.Producer().Enqueue(ctx, queue, []byte("during"), casq.WithDedupID(got[0].dedup))
	if err != nil || !again.Duplicate || again.ID != res.ID {
		t.Fatalf("enqueue with the call's dedup id: %+v %v; want a duplicate of %s", again, err, res.ID)
	}
	q, err := c.Admin().GetQueue(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	if n := q.GetTotals().GetMessages(); n != 2 {
		t.Fatalf("%d messages stored, want 2", n)
	}
}
