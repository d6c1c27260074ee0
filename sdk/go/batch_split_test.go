package casq_test

// EnqueueBatch against fake brokers that each know (their view of) which
// broker leads which key: a batch spanning several leaders is answered with
// a BatchRedirect, and the producer must split it, send each part to its
// broker with the same messages and metadata, follow further redirects, and
// give back one result per message in request order.

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

const testTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// received is one Enqueue as a fake broker saw it.
type received struct {
	payloads    []string
	dedupIDs    []string
	traceparent string
	token       string
}

// splitBroker leads the keys its table maps to its own address; it stores a
// batch of only those, redirects a batch led by one other broker, and
// answers a batch led by several with a BatchRedirect, as a casq broker
// does.
type splitBroker struct {
	casqv1.UnimplementedQueueServiceServer
	addr string

	mu    sync.Mutex
	table map[string]string // key -> leader address; "" means this broker
	// answer, when set, replaces the behaviour above for every call.
	answer func(ctx context.Context, req *casqv1.EnqueueRequest) (*casqv1.EnqueueResponse, error)
	got    []received
	calls  atomic.Int32
	dedup  map[string]string
}

func (b *splitBroker) leader(key string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l := b.table[key]; l != "" {
		return l
	}
	return b.addr
}

func (b *splitBroker) Enqueue(ctx context.Context, req *casqv1.EnqueueRequest) (*casqv1.EnqueueResponse, error) {
	b.calls.Add(1)
	if b.answer != nil {
		return b.answer(ctx, req)
	}
	var routes []*casqv1.BatchRoute
	byLeader := map[string]*casqv1.BatchRoute{}
	for i, m := range req.GetMessages() {
		l := b.leader(m.GetKey())
		r := byLeader[l]
		if r == nil {
			r = &casqv1.BatchRoute{LeaderAddress: l}
			byLeader[l] = r
			routes = append(routes, r)
		}
		r.MessageIndexes = append(r.MessageIndexes, uint32(i))
	}
	switch {
	case len(routes) > 1:
		st, _ := status.New(codes.Unavailable, "batch spans several leaders; split it").
			WithDetails(&casqv1.BatchRedirect{Queue: req.GetQueue(), Routes: routes})
		return nil, st.Err()
	case routes[0].GetLeaderAddress() != b.addr:
		st, _ := status.New(codes.Unavailable, "led by another broker").
			WithDetails(&casqv1.LeaderRedirect{LeaderAddress: routes[0].GetLeaderAddress(), Queue: req.GetQueue()})
		return nil, st.Err()
	}
	md, _ := metadata.FromIncomingContext(ctx)
	rec := received{traceparent: first(md.Get("traceparent")), token: first(md.Get("authorization"))}
	resp := &casqv1.EnqueueResponse{}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range req.GetMessages() {
		rec.payloads = append(rec.payloads, string(m.GetPayload()))
		rec.dedupIDs = append(rec.dedupIDs, m.GetDedupId())
		id, dup := b.dedup[m.GetDedupId()]
		if !dup {
			id = b.addr + "/" + string(m.GetPayload())
			if m.GetDedupId() != "" {
				b.dedup[m.GetDedupId()] = id
			}
		}
		resp.Messages = append(resp.Messages, &casqv1.EnqueuedMessage{Id: id, Duplicate: dup})
	}
	b.got = append(b.got, rec)
	return resp, nil
}

func (b *splitBroker) received() []received {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.got)
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// startSplitBrokers starts n fake brokers; setup, which knows all their
// addresses, sets their tables and answers before they serve.
func startSplitBrokers(t *testing.T, n int, setup func(bs []*splitBroker)) []*splitBroker {
	t.Helper()
	var out []*splitBroker
	var liss []net.Listener
	for range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		liss = append(liss, lis)
		out = append(out, &splitBroker{addr: lis.Addr().String(), table: map[string]string{}, dedup: map[string]string{}})
	}
	setup(out)
	for i, b := range out {
		srv := grpc.NewServer()
		casqv1.RegisterQueueServiceServer(srv, b)
		go func() { _ = srv.Serve(liss[i]) }()
		t.Cleanup(srv.Stop)
	}
	return out
}

func dialSplit(t *testing.T, entry *splitBroker) *casq.Client {
	t.Helper()
	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers: []string{entry.addr}, Token: "s3cret",
		BackoffInitial: time.Millisecond, BackoffMax: 5 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func keyed(keys ...string) []casq.Message {
	var msgs []casq.Message
	for _, k := range keys {
		msgs = append(msgs, casq.Message{Payload: []byte("p-" + k), Options: []casq.EnqueueOption{casq.WithKey(k), casq.WithDedupID("d-" + k)}})
	}
	return msgs
}

// wantIDs checks that result i is the message with key keys[i] stored on
// the broker at leaders[i].
func wantIDs(t *testing.T, res []casq.EnqueueResult, keys []string, leaders []*splitBroker) {
	t.Helper()
	if len(res) != len(keys) {
		t.Fatalf("%d results for %d messages: %+v", len(res), len(keys), res)
	}
	for i, k := range keys {
		if want := leaders[i].addr + "/p-" + k; res[i].ID != want {
			t.Fatalf("result %d: id %q, want %q (results %+v)", i, res[i].ID, want, res)
		}
	}
}

func TestBatchSplitAcrossLeaders(t *testing.T) {
	bs := startSplitBrokers(t, 3, func(bs []*splitBroker) {
		entry, b, c := bs[0], bs[1], bs[2]
		// The entry broker leads nothing; a and c are B's, b and d are C's.
		entry.table = map[string]string{"a": b.addr, "b": c.addr, "c": b.addr, "d": c.addr}
		b.table = map[string]string{"b": c.addr, "d": c.addr}
		c.table = map[string]string{"a": b.addr, "c": b.addr}
	})
	entry, b, c := bs[0], bs[1], bs[2]

	client := dialSplit(t, entry)
	ctx := casq.WithTraceParent(context.Background(), testTraceParent)
	keys := []string{"a", "b", "c", "d"}
	res, err := client.Producer().EnqueueBatch(ctx, "q", keyed(keys...))
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, res, keys, []*splitBroker{b, c, b, c})
	for _, x := range []struct {
		broker   *splitBroker
		payloads []string
	}{{b, []string{"p-a", "p-c"}}, {c, []string{"p-b", "p-d"}}} {
		got := x.broker.received()
		if len(got) != 1 {
			t.Fatalf("broker got %d enqueues, want one part: %+v", len(got), got)
		}
		r := got[0]
		var dedup []string
		for _, p := range x.payloads {
			dedup = append(dedup, "d-"+p[2:])
		}
		if !slices.Equal(r.payloads, x.payloads) || !slices.Equal(r.dedupIDs, dedup) {
			t.Fatalf("part %+v, want payloads %v with dedup ids %v in order", r, x.payloads, dedup)
		}
		if r.traceparent != testTraceParent || r.token != "Bearer s3cret" {
			t.Fatalf("part lost its metadata: %+v", r)
		}
	}
	if entry.calls.Load() != 1 {
		t.Fatalf("entry broker saw %d calls, want 1 (the split is not retried there)", entry.calls.Load())
	}

	// Same batch again: dedup ids make every part a duplicate, still in order.
	res, err = client.Producer().EnqueueBatch(ctx, "q", keyed(keys...))
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, res, keys, []*splitBroker{b, c, b, c})
	for i, r := range res {
		if !r.Duplicate {
			t.Fatalf("result %d of the retried batch is not a duplicate: %+v", i, res)
		}
	}
}

func TestBatchSplitFollowsRedirectsOfParts(t *testing.T) {
	bs := startSplitBrokers(t, 3, func(bs []*splitBroker) {
		entry, b, c := bs[0], bs[1], bs[2]
		// Leadership moved while the entry broker answered: B's part [a c]
		// is split again (c went to C), and C's part [b] is redirected to B.
		entry.table = map[string]string{"a": b.addr, "b": c.addr, "c": b.addr}
		b.table = map[string]string{"c": c.addr}
		c.table = map[string]string{"a": b.addr, "b": b.addr}
	})
	entry, b, c := bs[0], bs[1], bs[2]

	client := dialSplit(t, entry)
	keys := []string{"a", "b", "c"}
	res, err := client.Producer().EnqueueBatch(context.Background(), "q", keyed(keys...))
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, res, keys, []*splitBroker{b, b, c})
}

func TestBatchSplitDepthLimit(t *testing.T) {
	bs := startSplitBrokers(t, 1, func(bs []*splitBroker) {
		flapping := bs[0]
		// Every answer is a BatchRedirect: leadership that never settles.
		flapping.answer = func(_ context.Context, req *casqv1.EnqueueRequest) (*casqv1.EnqueueResponse, error) {
			var all []uint32
			for i := range req.GetMessages() {
				all = append(all, uint32(i))
			}
			st, _ := status.New(codes.Unavailable, "batch spans several leaders").WithDetails(&casqv1.BatchRedirect{
				Queue: req.GetQueue(), Routes: []*casqv1.BatchRoute{{LeaderAddress: flapping.addr, MessageIndexes: all}},
			})
			return nil, st.Err()
		}
	})
	flapping := bs[0]
	client := dialSplit(t, flapping)
	_, err := client.Producer().EnqueueBatch(context.Background(), "q", keyed("a", "b"))
	var se *casq.BatchSplitError
	if !errors.As(err, &se) || !se.TooDeep || se.Depth != 3 || !slices.Equal(se.Indexes, []int{0, 1}) {
		t.Fatalf("err = %v (%#v), want a BatchSplitError for depth 3", err, se)
	}
	var e *casq.Error
	if !errors.As(err, &e) || e.BatchRedirect == nil || casq.Code(err) != codes.Unavailable || casq.IsRedirect(err) {
		t.Fatalf("err = %v: want the last BatchRedirect as an UNAVAILABLE *Error", err)
	}
	if n := flapping.calls.Load(); n != 4 {
		t.Fatalf("broker saw %d calls, want 4 (the batch and three splits)", n)
	}
}

func TestBatchSplitPartFails(t *testing.T) {
	bs := startSplitBrokers(t, 3, func(bs []*splitBroker) {
		entry, b, c := bs[0], bs[1], bs[2]
		entry.table = map[string]string{"a": b.addr, "b": c.addr, "c": b.addr}
		b.table = map[string]string{"b": c.addr}
		c.answer = func(context.Context, *casqv1.EnqueueRequest) (*casqv1.EnqueueResponse, error) {
			return nil, status.Error(codes.FailedPrecondition, "queue is paused")
		}
	})
	entry, b := bs[0], bs[1]
	client := dialSplit(t, entry)
	_, err := client.Producer().EnqueueBatch(context.Background(), "q", keyed("a", "b", "c"))
	var se *casq.BatchSplitError
	if !errors.As(err, &se) || se.TooDeep || !slices.Equal(se.Indexes, []int{1}) || casq.Code(err) != codes.FailedPrecondition {
		t.Fatalf("err = %v (%#v), want the failure of C's part [1]", err, se)
	}
	// B's part ran to its end: it is stored, and a retry with the same
	// dedup ids would not store it twice.
	if got := b.received(); len(got) != 1 || !slices.Equal(got[0].payloads, []string{"p-a", "p-c"}) {
		t.Fatalf("B got %+v", got)
	}
}

func TestBatchSplitKeepsCallerDeadline(t *testing.T) {
	bs := startSplitBrokers(t, 3, func(bs []*splitBroker) {
		entry, b, c := bs[0], bs[1], bs[2]
		entry.table = map[string]string{"a": b.addr, "b": c.addr}
		c.answer = func(ctx context.Context, _ *casqv1.EnqueueRequest) (*casqv1.EnqueueResponse, error) {
			<-ctx.Done() // a part that hangs until the caller gives up
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	})
	entry, c := bs[0], bs[2]
	client := dialSplit(t, entry)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := client.Producer().EnqueueBatch(ctx, "q", keyed("a", "b"))
		done <- err
	}()
	for c.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	err := <-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestBatchSplitMalformedRoutes(t *testing.T) {
	bs := startSplitBrokers(t, 1, func(bs []*splitBroker) {
		bad := bs[0]
		bad.answer = func(_ context.Context, req *casqv1.EnqueueRequest) (*casqv1.EnqueueResponse, error) {
			// Message 1 is in no route.
			st, _ := status.New(codes.Unavailable, "split it").WithDetails(&casqv1.BatchRedirect{
				Queue: req.GetQueue(), Routes: []*casqv1.BatchRoute{{LeaderAddress: bad.addr, MessageIndexes: []uint32{0}}},
			})
			return nil, st.Err()
		}
	})
	bad := bs[0]
	client := dialSplit(t, bad)
	_, err := client.Producer().EnqueueBatch(context.Background(), "q", keyed("a", "b"))
	if casq.Code(err) != codes.Internal {
		t.Fatalf("err = %v, want INTERNAL for a BatchRedirect that drops a message", err)
	}
	if n := bad.calls.Load(); n != 1 {
		t.Fatalf("broker saw %d calls, want 1", n)
	}
}
