package casq_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// dialEnqueues dials with opts and counts the client's Enqueue RPCs and the
// messages they carried.
func dialEnqueues(t *testing.T, opts casq.Options) (c *casq.Client, rpcs, msgs *atomic.Int64) {
	t.Helper()
	rpcs, msgs = &atomic.Int64{}, &atomic.Int64{}
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, o ...grpc.CallOption) error {
		if r, ok := req.(*casqv1.EnqueueRequest); ok {
			rpcs.Add(1)
			msgs.Add(int64(len(r.GetMessages())))
		}
		return invoker(ctx, method, req, reply, cc, o...)
	}
	opts.Brokers = []string{serverAddr}
	opts.Timeout = 5 * time.Second
	opts.DialOptions = []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}
	c, err := casq.Dial(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, rpcs, msgs
}

// enqueueAll makes n concurrent Enqueue calls; payload i is "i", and call
// bad (if >= 0) has an invalid priority. It returns each call's result and error.
func enqueueAll(t *testing.T, c *casq.Client, queue string, n, bad int) ([]casq.EnqueueResult, []error) {
	t.Helper()
	res := make([]casq.EnqueueResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			var opts []casq.EnqueueOption
			if i == bad {
				opts = append(opts, casq.WithPriority(5000))
			}
			res[i], errs[i] = c.Producer().Enqueue(context.Background(), queue, []byte{byte(i)}, opts...)
		})
	}
	close(start)
	wg.Wait()
	return res, errs
}

// Concurrent calls share requests, and each caller gets its own message's result.
func TestEnqueueCallsAreMerged(t *testing.T) {
	c, rpcs, msgs := dialEnqueues(t, casq.Options{})
	queue := queueName(t)
	res, errs := enqueueAll(t, c, queue, 64, -1)
	ids := map[string]bool{}
	for i := range res {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		ids[res[i].ID] = true
	}
	if len(ids) != 64 {
		t.Fatalf("%d distinct ids for 64 calls", len(ids))
	}
	if rpcs.Load() >= 64 || msgs.Load() != 64 {
		t.Fatalf("%d Enqueue RPCs carried %d messages, want fewer than 64 RPCs for 64", rpcs.Load(), msgs.Load())
	}
	// Each result is its caller's: the job with payload i has the id call i got.
	got := make(chan *casq.Job, 64)
	stop := runWorker(t, c, queue, func(ctx context.Context, job *casq.Job) error { got <- job; return nil }, casq.WithConcurrency(8))
	for range 64 {
		job := wait(t, got)
		if res[job.Payload[0]].ID != job.ID {
			t.Fatalf("call %d got id %s, its message is %s", job.Payload[0], res[job.Payload[0]].ID, job.ID)
		}
	}
	_ = stop()
}

// onlyBadCallFailed checks that call bad failed INVALID_ARGUMENT and every other call succeeded.
func onlyBadCallFailed(t *testing.T, errs []error, bad int) {
	t.Helper()
	for i, err := range errs {
		switch {
		case i == bad && casq.Code(err) != codes.InvalidArgument:
			t.Fatalf("bad call: %v, want INVALID_ARGUMENT", err)
		case i != bad && err != nil:
			t.Fatalf("call %d: %v", i, err)
		}
	}
}

// One bad message fails its own caller only.
func TestMergedEnqueueErrorReachesItsCaller(t *testing.T) {
	c, _, _ := dialEnqueues(t, casq.Options{})
	_, errs := enqueueAll(t, c, queueName(t), 32, 7)
	onlyBadCallFailed(t, errs, 7)
}

// A failure of the whole request reaches every caller of it.
func TestMergedEnqueueRequestFailureReachesAll(t *testing.T) {
	c, _, _ := dialEnqueues(t, casq.Options{})
	_, errs := enqueueAll(t, c, "Not A Queue Name", 16, -1)
	for i, err := range errs {
		if casq.Code(err) != codes.InvalidArgument {
			t.Fatalf("call %d: %v, want INVALID_ARGUMENT", i, err)
		}
	}
}

// NoEnqueueBatching: one request per call.
func TestEnqueueBatchingOff(t *testing.T) {
	c, rpcs, _ := dialEnqueues(t, casq.Options{NoEnqueueBatching: true})
	_, errs := enqueueAll(t, c, queueName(t), 16, -1)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if rpcs.Load() != 16 {
		t.Fatalf("%d RPCs for 16 calls", rpcs.Load())
	}
}

// The messages of a refused merged request are resent side by side, not
// one after another (one bad message among n unkeyed ones cost n round trips).
func TestRefusedMergedEnqueueIsResentInParallel(t *testing.T) {
	var inFlight, most, requests atomic.Int64
	var refused atomic.Bool
	entered := make(chan struct{}, 2)
	release := make(chan struct{})
	hold := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, o ...grpc.CallOption) error {
		r, ok := req.(*casqv1.EnqueueRequest)
		if ok && requests.Add(1) <= 2 {
			// The lane's two flights, held until the calls below are pending behind them:
			// they then go out merged (a call sent alone would be refused unmerged).
			entered <- struct{}{}
			<-release
		} else if ok && len(r.GetMessages()) == 1 && refused.Load() {
			// A resend: counted, and held so that resends made side by side overlap.
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(20 * time.Millisecond)
		}
		err := invoker(ctx, method, req, reply, cc, o...)
		if ok && len(r.GetMessages()) > 1 && casq.Code(err) == codes.InvalidArgument {
			refused.Store(true)
		}
		return err
	}
	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers:     []string{serverAddr},
		Timeout:     5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(hold)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	queue := queueName(t)
	leads := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := c.Producer().Enqueue(context.Background(), queue, []byte("lead"))
			leads <- err
		}()
		<-entered
	}
	time.AfterFunc(100*time.Millisecond, func() { close(release) })
	_, errs := enqueueAll(t, c, queue, 40, 3)
	for range 2 {
		if err := <-leads; err != nil {
			t.Fatal(err)
		}
	}
	for i, err := range errs {
		if (i == 3) != (err != nil) {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if !refused.Load() {
		t.Fatal("no merged request was refused: nothing was resent")
	}
	if m := most.Load(); m < 2 {
		t.Fatalf("at most %d resend in flight at once, want them side by side", m)
	}
}

// A message whose dedup id the SDK made up is never reported a duplicate:
// when an attempt stored it but its answer was lost, the retry finds it
// stored, and that store was this call's own. A dedup id of the caller's
// still reports duplicates.
func TestOwnDedupIDIsNeverADuplicate(t *testing.T) {
	var lose atomic.Bool
	loseAnswer := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, o ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, o...)
		if _, ok := req.(*casqv1.EnqueueRequest); ok && err == nil && lose.CompareAndSwap(true, false) {
			return status.Error(codes.Unavailable, "test: the answer was lost")
		}
		return err
	}
	for _, batching := range []bool{true, false} {
		c, err := casq.Dial(context.Background(), casq.Options{
			Brokers:           []string{serverAddr},
			Timeout:           5 * time.Second,
			NoEnqueueBatching: !batching,
			DialOptions:       []grpc.DialOption{grpc.WithChainUnaryInterceptor(loseAnswer)},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		queue := queueName(t)
		lose.Store(true)
		res, err := c.Producer().Enqueue(context.Background(), queue, []byte("once"))
		if err != nil || res.Duplicate || lose.Load() {
			t.Fatalf("batching %v: %+v %v; want stored once by this call, not a duplicate (answer lost: %v)", batching, res, err, !lose.Load())
		}
		lose.Store(true)
		batch, err := c.Producer().EnqueueBatch(context.Background(), queue, []casq.Message{{Payload: []byte("b")}})
		if err != nil || batch[0].Duplicate {
			t.Fatalf("batching %v: batch %+v %v; want not a duplicate", batching, batch, err)
		}
		mine, err := c.Producer().Enqueue(context.Background(), queue, []byte("x"), casq.WithDedupID("mine"))
		if err != nil || mine.Duplicate {
			t.Fatal(mine, err)
		}
		again, err := c.Producer().Enqueue(context.Background(), queue, []byte("y"), casq.WithDedupID("mine"))
		if err != nil || !again.Duplicate || again.ID != mine.ID {
			t.Fatalf("batching %v: %+v %v; want a duplicate of %s", batching, again, err, mine.ID)
		}
	}
}

// When one shard of a merged request fails (DATA_LOSS) after the others stored
// their parts, each caller still gets its own outcome: the merged request is
// resent message by message, and a stored message is its caller's own store.
func TestMergedEnqueueShardFaultIsResentPerMessage(t *testing.T) {
	broken := []byte("broken")
	shardFault := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, o ...grpc.CallOption) error {
		r, ok := req.(*casqv1.EnqueueRequest)
		if !ok {
			return invoker(ctx, method, req, reply, cc, o...)
		}
		var healthy []*casqv1.NewMessage
		hit := false
		for _, m := range r.GetMessages() {
			if string(m.GetPayload()) == string(broken) {
				hit = true
			} else {
				healthy = append(healthy, m)
			}
		}
		if !hit {
			return invoker(ctx, method, req, reply, cc, o...)
		}
		if len(healthy) > 0 { // the healthy shard's part is stored, then the broken one fails the call
			part := &casqv1.EnqueueRequest{Queue: r.GetQueue(), Messages: healthy}
			if err := invoker(ctx, method, part, &casqv1.EnqueueResponse{}, cc, o...); err != nil {
				return err
			}
		}
		return status.Error(codes.DataLoss, "test: shard 1 is unreadable")
	}
	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers:     []string{serverAddr},
		Timeout:     5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(shardFault)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	queue := queueName(t)
	payloads := [][]byte{[]byte("h0"), []byte("h1"), broken, []byte("h3")}
	res := make([]casq.EnqueueResult, len(payloads))
	errs := make([]error, len(payloads))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, p := range payloads {
		wg.Go(func() {
			<-start
			res[i], errs[i] = c.Producer().Enqueue(context.Background(), queue, p)
		})
	}
	close(start)
	wg.Wait()
	for i := range payloads {
		switch {
		case i == 2 && casq.Code(errs[i]) != codes.DataLoss:
			t.Fatalf("broken message: %v, want DATA_LOSS", errs[i])
		case i != 2 && (errs[i] != nil || res[i].Duplicate || res[i].ID == ""):
			t.Fatalf("message %d: %+v %v; want stored, not a duplicate", i, res[i], errs[i])
		}
	}
}

// Calls with neither dedup id nor key are merged too (the broker stores such
// a request on one shard, all or none); calls with a key and no dedup id are not.
func TestEnqueueWithoutDedupIDsIsMerged(t *testing.T) {
	c, rpcs, msgs := dialEnqueues(t, casq.Options{NoDefaultDedupIDs: true})
	_, errs := enqueueAll(t, c, queueName(t), 64, -1)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if rpcs.Load() >= 64 || msgs.Load() != 64 {
		t.Fatalf("%d Enqueue RPCs carried %d messages for 64 calls without dedup ids, want them merged", rpcs.Load(), msgs.Load())
	}
	// A refused merged request (nothing stored) is resent message by message: the bad one fails alone.
	_, errs = enqueueAll(t, c, queueName(t), 32, 7)
	onlyBadCallFailed(t, errs, 7)
	rpcs.Store(0)
	msgs.Store(0)
	var wg sync.WaitGroup
	queue := queueName(t)
	for i := range 16 {
		wg.Go(func() {
			if _, err := c.Producer().Enqueue(context.Background(), queue, []byte{byte(i)}, casq.WithKey("k")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if rpcs.Load() != 16 || msgs.Load() != 16 {
		t.Fatalf("%d RPCs carried %d keyed messages without dedup ids, want one each", rpcs.Load(), msgs.Load())
	}
}

// A merged request without dedup ids that fails with INTERNAL (which does not
// say that nothing was stored) is not resent message by message: each of its
// callers gets the error.
func TestMergedEnqueueWithoutDedupIDsIsNotResentAfterInternal(t *testing.T) {
	var mu sync.Mutex
	merged := map[byte]bool{}
	fault := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, o ...grpc.CallOption) error {
		r, ok := req.(*casqv1.EnqueueRequest)
		if !ok || len(r.GetMessages()) < 2 {
			return invoker(ctx, method, req, reply, cc, o...)
		}
		mu.Lock()
		for _, m := range r.GetMessages() {
			merged[m.GetPayload()[0]] = true
		}
		mu.Unlock()
		return status.Error(codes.Internal, "test: a bug")
	}
	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers:           []string{serverAddr},
		Timeout:           5 * time.Second,
		NoDefaultDedupIDs: true,
		DialOptions:       []grpc.DialOption{grpc.WithChainUnaryInterceptor(fault)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_, errs := enqueueAll(t, c, queueName(t), 64, -1)
	if len(merged) == 0 {
		t.Fatal("no merged request was sent")
	}
	for i, err := range errs {
		if merged[byte(i)] && casq.Code(err) != codes.Internal {
			t.Fatalf("call %d of a merged request: %v, want INTERNAL", i, err)
		}
	}
}
