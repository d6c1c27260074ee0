package casq_test

// HTTP/2 keepalive: a worker with no job sends nothing on its Work stream,
// so a broker that hangs with the connection up (a frozen process, a
// stalled proxy) would hold it forever. A PING unanswered within
// KeepaliveTimeout closes the connection; the stream fails and the worker
// reconnects to the next broker, where it gets the jobs enqueued since.
//
// The hang is a TCP proxy that stops forwarding in both directions while
// keeping both sockets open, as the kernel does for a SIGSTOPped broker
// (the scenario idle-worker-follows-frozen-leader does it with real
// processes), except that the broker behind the proxy is alive and sends the
// next job down the dead stream: it comes again once its short lease ran
// out, to whichever stream has credit. grpc-go pings no sooner than 10 s,
// so each test takes ~11 s.

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// freezableProxy forwards TCP connections to target until freeze, after
// which it forwards nothing and closes nothing.
type freezableProxy struct {
	addr   string
	frozen atomic.Bool
}

func startFreezableProxy(t *testing.T, target string) *freezableProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezableProxy{addr: lis.Addr().String()}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = lis.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if err != nil {
				_ = dst.Close()
				return
			}
			if p.frozen.Load() {
				continue // read and dropped: the broker seems hung
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				_ = src.Close()
				return
			}
		}
	}
	go func() {
		for {
			in, err := lis.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			go pipe(out, in)
			go pipe(in, out)
		}
	}()
	return p
}

// workerFollowsAfterFreeze runs a worker on [proxy, broker], freezes the
// proxy while the worker holds no job, and waits for a job enqueued after.
func workerFollowsAfterFreeze(t *testing.T, opts casq.Options) {
	proxy := startFreezableProxy(t, serverAddr)
	opts.Brokers = []string{proxy.addr, serverAddr}
	opts.BackoffInitial, opts.BackoffMax = 50*time.Millisecond, 500*time.Millisecond
	// Only keepalive may notice the hang: a Work stream request (an ack
	// whose answer the freeze swallowed) would break the stream after Timeout.
	opts.Timeout = time.Hour
	ctx := context.Background()
	c, err := casq.Dial(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	direct := dial(t)
	producer := direct.Producer()
	queue := queueName(t)
	if _, err := direct.Admin().CreateQueue(ctx, queue, 1, nil); err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 10)
	runWorker(t, c, queue, func(_ context.Context, job *casq.Job) error {
		seen <- string(job.Payload)
		return nil
	}, casq.WithErrorHandler(func(error, *casq.Job) {}),
		// The broker behind the proxy is alive: it sends the next job down
		// the dead stream, where it is lost until its lease runs out.
		casq.WithLeaseTTL(2*time.Second))
	if _, err := producer.Enqueue(ctx, queue, []byte("before")); err != nil {
		t.Fatal(err)
	}
	if got := wait(t, seen); got != "before" {
		t.Fatalf("first job %q, want before", got)
	}
	// Its ack has landed: the stream has no request open that could time out.
	deadline := time.Now().Add(15 * time.Second)
	for {
		q, err := direct.Admin().GetQueue(ctx, queue)
		if err == nil && q.GetTotals().GetMessages() == 0 && q.GetTotals().GetInFlight() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first job was not acked within 15 s (last error %v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The worker holds no job: it sends nothing, and the proxy answers nothing.
	proxy.frozen.Store(true)
	if _, err := producer.Enqueue(ctx, queue, []byte("after")); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-seen:
		if got != "after" {
			t.Fatalf("second job %q, want after", got)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("the job enqueued after the freeze never reached the worker: its idle stream is still on the hung connection")
	}
}

func TestKeepaliveLeavesIdleStreamToHungBroker(t *testing.T) {
	t.Parallel()
	workerFollowsAfterFreeze(t, casq.Options{KeepaliveTimeout: time.Second})
}

func TestKeepaliveOfDialOptionsWins(t *testing.T) {
	t.Parallel()
	// The SDK's own keepalive would wait an hour for the PING's answer; the
	// user's dial option, applied after it, waits a second.
	workerFollowsAfterFreeze(t, casq.Options{
		KeepaliveTimeout: time.Hour,
		DialOptions: []grpc.DialOption{grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: 10 * time.Second, Timeout: time.Second, PermitWithoutStream: true,
		})},
	})
}
