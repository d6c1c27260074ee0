package casq_test

// Worker.Run against fake brokers that each lead one shard: it must keep a
// Work stream to every leader the routing names, settle each job on the
// stream it came from (by unary calls once that stream is gone), and give
// each stream at most prefetch jobs.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// fakeLeader is a broker that leads one shard: its Work streams serve that
// shard and report routes as the other shards' leaders. It checks the
// worker's credit: outstanding credit plus unsettled jobs of a stream never
// exceed prefetch.
type fakeLeader struct {
	casqv1.UnimplementedQueueServiceServer
	name     string
	shard    uint32
	prefetch int
	addr     string
	stop     func() // stops the server: the broker is gone

	mu          sync.Mutex
	routes      []*casqv1.ShardRoute
	lookup      []*casqv1.ShardRoute // LookupShards' answer; nil: UNIMPLEMENTED
	lookups     int
	payloads    []string // still to deliver
	sent        int
	opens       int
	halfCloses  int
	streamAcks  []string
	ackSizes    []int // receipts in each ack request of the streams
	unaryAcks   []string
	streamNacks []string
	unaryNacks  []string
	// shardOf is the shard of each payload's message that is not in the
	// fake's own shard (it led that shard too when it delivered it).
	shardOf map[string]uint32
	// elsewhere names the leader of each receipt whose shard another broker
	// leads now: a unary Ack or Nack settles the other receipts and answers
	// with a redirect to it, as a broker does; a unary Heartbeat naming one
	// is answered with the redirect alone.
	elsewhere   map[string]string
	losing      []string // receipts the next stream to look announces lost
	unaryBeats  int
	beatCalls   [][]string // receipts of each unary heartbeat, redirected or not
	beatWorkers []string   // worker_id of each unary heartbeat
	beatErr     error      // when set, unary heartbeats fail with it
	violation   string
	kill        chan struct{} // closing it ends the open streams with UNAVAILABLE
	// drain, closed, has the open streams send draining and no more jobs;
	// they still answer requests and stay open.
	drain       chan struct{}
	routeGen    int           // bumped by reroute: the open streams send routing
	beatEvery   time.Duration // heartbeat interval of its streams; 0: 100 ms
	streamsOpen int
}

func startFakeLeader(t *testing.T, name string, shard uint32, prefetch int, payloads ...string) *fakeLeader {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeLeader{name: name, shard: shard, prefetch: prefetch, addr: lis.Addr().String(), payloads: payloads, kill: make(chan struct{}), drain: make(chan struct{})}
	srv := grpc.NewServer()
	casqv1.RegisterQueueServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	f.stop = srv.Stop
	t.Cleanup(srv.Stop)
	return f
}

func (f *fakeLeader) snapshot(fn func(f *fakeLeader)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// killStreams ends the open streams with UNAVAILABLE; later streams live on.
func (f *fakeLeader) killStreams() {
	f.mu.Lock()
	old := f.kill
	f.kill = make(chan struct{})
	f.mu.Unlock()
	close(old)
}

// drainStreams has the open streams announce draining (as a broker handing
// its shards over does) and send no more jobs; later streams are not drained.
func (f *fakeLeader) drainStreams() {
	f.mu.Lock()
	old := f.drain
	f.drain = make(chan struct{})
	f.mu.Unlock()
	close(old)
}

// reroute sets the routes and has the open streams send them in a routing
// event.
func (f *fakeLeader) reroute(routes []*casqv1.ShardRoute) {
	f.snapshot(func(f *fakeLeader) {
		f.routes = routes
		f.routeGen++
	})
}

func (f *fakeLeader) Work(stream grpc.BidiStreamingServer[casqv1.WorkRequest, casqv1.WorkResponse]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	open := first.GetOpen()
	f.mu.Lock()
	f.opens++
	f.streamsOpen++
	routes, kill, drain, gen, beatEvery := f.routes, f.kill, f.drain, f.routeGen, f.beatEvery
	f.mu.Unlock()
	if beatEvery == 0 {
		beatEvery = 100 * time.Millisecond
	}
	defer f.snapshot(func(f *fakeLeader) { f.streamsOpen-- })
	err = stream.Send(&casqv1.WorkResponse{Event: &casqv1.WorkResponse_Opened{Opened: &casqv1.WorkOpened{
		Queue: open.GetQueue(), HeartbeatInterval: durationpb.New(beatEvery), MaxCredits: 1000,
		Routing: &casqv1.WorkRouting{ServingShards: []uint32{f.shard}, Shards: routes},
	}}})
	if err != nil {
		return err
	}
	credits, unsettled := int(open.GetCredits()), 0
	reqs := make(chan *casqv1.WorkRequest)
	ended := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				ended <- err
				return
			}
			select {
			case reqs <- req:
			case <-stream.Context().Done():
				return
			}
		}
	}()
	tick := time.NewTicker(10 * time.Millisecond) // picks up payloads added later
	defer tick.Stop()
	draining := false
	for {
		select {
		case <-drain:
			if !draining {
				draining = true
				err := stream.Send(&casqv1.WorkResponse{Event: &casqv1.WorkResponse_Draining{Draining: &casqv1.WorkDraining{
					Grace: durationpb.New(5 * time.Second),
				}}})
				if err != nil {
					return err
				}
			}
		default:
		}
		f.mu.Lock()
		if credits+unsettled > f.prefetch && f.violation == "" {
			f.violation = fmt.Sprintf("%s: credit %d + unsettled %d > prefetch %d", f.name, credits, unsettled, f.prefetch)
		}
		var jobs []*casqv1.ClaimedMessage
		for !draining && credits > 0 && len(f.payloads) > 0 {
			p := f.payloads[0]
			f.payloads = f.payloads[1:]
			shard, ok := f.shardOf[p]
			if !ok {
				shard = f.shard
			}
			jobs = append(jobs, &casqv1.ClaimedMessage{
				Receipt: fmt.Sprintf("%s-%d", f.name, f.sent), Attempt: 1,
				Message: &casqv1.Message{Id: p, Queue: open.GetQueue(), Payload: []byte(p), Shard: shard},
			})
			f.sent++
			credits--
			unsettled++
		}
		lost := f.losing
		f.losing = nil
		unsettled -= len(lost)
		var routing *casqv1.WorkRouting
		if f.routeGen != gen {
			gen = f.routeGen
			routing = &casqv1.WorkRouting{ServingShards: []uint32{f.shard}, Shards: f.routes}
		}
		f.mu.Unlock()
		if routing != nil {
			if err := stream.Send(&casqv1.WorkResponse{Event: &casqv1.WorkResponse_Routing{Routing: routing}}); err != nil {
				return err
			}
		}
		for _, j := range jobs {
			if err := stream.Send(&casqv1.WorkResponse{Event: &casqv1.WorkResponse_Job{Job: j}}); err != nil {
				return err
			}
		}
		if len(lost) > 0 {
			err := stream.Send(&casqv1.WorkResponse{Event: &casqv1.WorkResponse_LeasesLost{LeasesLost: &casqv1.WorkLeasesLost{
				Receipts: lost, Reason: "lease expired",
			}}})
			if err != nil {
				return err
			}
		}
		var reply *casqv1.WorkResponse
		select {
		case req := <-reqs:
			switch c := req.GetCommand().(type) {
			case *casqv1.WorkRequest_Credit:
				credits += int(c.Credit.GetCredits())
			case *casqv1.WorkRequest_Ack:
				f.snapshot(func(f *fakeLeader) {
					f.streamAcks = append(f.streamAcks, c.Ack.GetReceipts()...)
					f.ackSizes = append(f.ackSizes, len(c.Ack.GetReceipts()))
				})
				unsettled -= len(c.Ack.GetReceipts())
				reply = &casqv1.WorkResponse{Event: &casqv1.WorkResponse_Acked{Acked: &casqv1.WorkAcked{Results: acked(c.Ack.GetReceipts())}}}
			case *casqv1.WorkRequest_Nack:
				f.snapshot(func(f *fakeLeader) { f.streamNacks = append(f.streamNacks, c.Nack.GetReceipts()...) })
				unsettled -= len(c.Nack.GetReceipts())
				reply = &casqv1.WorkResponse{Event: &casqv1.WorkResponse_Nacked{Nacked: &casqv1.WorkNacked{Results: nacked(c.Nack.GetReceipts())}}}
			case *casqv1.WorkRequest_Heartbeat:
				reply = &casqv1.WorkResponse{Event: &casqv1.WorkResponse_Heartbeated{Heartbeated: &casqv1.WorkHeartbeated{}}}
			}
			if reply != nil {
				reply.RequestId = req.GetRequestId()
			}
		case err := <-ended:
			if errors.Is(err, io.EOF) {
				f.snapshot(func(f *fakeLeader) { f.halfCloses++ })
				return nil
			}
			return err
		case <-kill:
			return status.Error(codes.Unavailable, "fake broker shutting down")
		case <-tick.C:
		}
		if reply != nil {
			if err := stream.Send(reply); err != nil {
				return err
			}
		}
	}
}

func (f *fakeLeader) Ack(_ context.Context, req *casqv1.AckRequest) (*casqv1.AckResponse, error) {
	if err := f.settleHere(req.GetReceipts(), &f.unaryAcks); err != nil {
		return nil, err
	}
	return &casqv1.AckResponse{Results: acked(req.GetReceipts())}, nil
}

func (f *fakeLeader) Nack(_ context.Context, req *casqv1.NackRequest) (*casqv1.NackResponse, error) {
	if err := f.settleHere(req.GetReceipts(), &f.unaryNacks); err != nil {
		return nil, err
	}
	return &casqv1.NackResponse{Results: nacked(req.GetReceipts())}, nil
}

// settleHere adds to settled the receipts of a unary Ack or Nack whose
// shard the fake leads, and returns a redirect to the leader of the others
// if there are any (nil when it settled them all).
func (f *fakeLeader) settleHere(receipts []string, settled *[]string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	leader := ""
	for _, r := range receipts {
		if l, ok := f.elsewhere[r]; ok {
			leader = l
		} else {
			*settled = append(*settled, r)
		}
	}
	if leader == "" {
		return nil
	}
	st, _ := status.New(codes.Unavailable, "shard led by another broker").
		WithDetails(&casqv1.LeaderRedirect{LeaderAddress: leader})
	return st.Err()
}

// loseLeases has the next stream to look announce the leases of receipts
// lost (leases_lost), as a broker does when they expire.
func (f *fakeLeader) loseLeases(receipts ...string) {
	f.snapshot(func(f *fakeLeader) { f.losing = append(f.losing, receipts...) })
}

func acked(receipts []string) []*casqv1.AckResult {
	out := make([]*casqv1.AckResult, len(receipts))
	for i, r := range receipts {
		out[i] = &casqv1.AckResult{Receipt: r, Outcome: casqv1.AckOutcome_ACK_OUTCOME_ACKED}
	}
	return out
}

func nacked(receipts []string) []*casqv1.NackResult {
	out := make([]*casqv1.NackResult, len(receipts))
	for i, r := range receipts {
		out[i] = &casqv1.NackResult{Receipt: r, Outcome: casqv1.NackOutcome_NACK_OUTCOME_RETRY_SCHEDULED}
	}
	return out
}

func (f *fakeLeader) LookupShards(context.Context, *casqv1.LookupShardsRequest) (*casqv1.LookupShardsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lookups++
	if f.lookup == nil {
		return nil, status.Error(codes.Unimplemented, "no lookup")
	}
	return &casqv1.LookupShardsResponse{Shards: f.lookup}, nil
}

func (f *fakeLeader) Heartbeat(_ context.Context, req *casqv1.HeartbeatRequest) (*casqv1.HeartbeatResponse, error) {
	res := &casqv1.HeartbeatResponse{}
	for _, r := range req.GetReceipts() {
		res.Results = append(res.Results, &casqv1.HeartbeatResult{Receipt: r, Outcome: casqv1.HeartbeatOutcome_HEARTBEAT_OUTCOME_EXTENDED})
	}
	var fail error
	f.snapshot(func(f *fakeLeader) {
		f.unaryBeats++
		f.beatWorkers = append(f.beatWorkers, req.GetWorkerId())
		f.beatCalls = append(f.beatCalls, slices.Clone(req.GetReceipts()))
		fail = f.beatErr
		for _, r := range req.GetReceipts() {
			if l, ok := f.elsewhere[r]; ok && fail == nil {
				st, _ := status.New(codes.Unavailable, "shard led by another broker").
					WithDetails(&casqv1.LeaderRedirect{LeaderAddress: l})
				fail = st.Err()
			}
		}
	})
	if fail != nil {
		return nil, fail
	}
	return res, nil
}

// twoLeaders starts fake leaders of shards 0 and 1 whose routes name each
// other.
func twoLeaders(t *testing.T, prefetch int, a, b []string) (*fakeLeader, *fakeLeader) {
	fa := startFakeLeader(t, "A", 0, prefetch, a...)
	fb := startFakeLeader(t, "B", 1, prefetch, b...)
	routes := []*casqv1.ShardRoute{
		{Shard: 0, Leader: &casqv1.ShardLeader{Address: fa.addr}},
		{Shard: 1, Leader: &casqv1.ShardLeader{Address: fb.addr}},
	}
	fa.routes, fb.routes = routes, routes
	return fa, fb
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWorkerStreamPerLeader(t *testing.T) {
	const prefetch = 2
	fa, fb := twoLeaders(t, prefetch, []string{"a0", "a1", "a2", "a3", "a4"}, []string{"b0", "b1", "b2", "b3", "b4"})
	// The client knows only A: B is found through A's routing.
	c, err := casq.Dial(context.Background(), casq.Options{Brokers: []string{fa.addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var mu sync.Mutex
	var seen []string
	var running, maxRunning atomic.Int32
	stop := runWorker(t, c, "q", func(_ context.Context, job *casq.Job) error {
		n := running.Add(1)
		defer running.Add(-1)
		for m := maxRunning.Load(); n > m && !maxRunning.CompareAndSwap(m, n); m = maxRunning.Load() {
		}
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		seen = append(seen, string(job.Payload))
		mu.Unlock()
		return nil
	}, casq.WithConcurrency(1), casq.WithPrefetch(prefetch), casq.WithErrorHandler(func(err error, _ *casq.Job) { t.Log(err) }))

	acked := func(f *fakeLeader) (n int) {
		f.snapshot(func(f *fakeLeader) { n = len(f.streamAcks) })
		return n
	}
	eventually(t, "every job acked", func() bool { return acked(fa) == 5 && acked(fb) == 5 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	slices.Sort(seen)
	mu.Unlock()
	if want := []string{"a0", "a1", "a2", "a3", "a4", "b0", "b1", "b2", "b3", "b4"}; !slices.Equal(seen, want) {
		t.Fatalf("handled %q, want %q", seen, want)
	}
	if m := maxRunning.Load(); m != 1 {
		t.Errorf("%d handlers ran at once with concurrency 1", m)
	}
	for _, f := range []*fakeLeader{fa, fb} {
		f.snapshot(func(f *fakeLeader) {
			for _, r := range f.streamAcks {
				if r[:1] != f.name {
					t.Errorf("%s's stream got the ack of %s", f.name, r)
				}
			}
			if len(f.unaryAcks) != 0 {
				t.Errorf("%s: unary acks %q, want all on the streams", f.name, f.unaryAcks)
			}
			if f.violation != "" {
				t.Error(f.violation)
			}
			if f.opens != 1 || f.halfCloses != 1 {
				t.Errorf("%s: %d streams opened, %d half-closed; want 1 and 1", f.name, f.opens, f.halfCloses)
			}
		})
	}
}

func TestWorkerSecondaryStreamLost(t *testing.T) {
	fa, fb := twoLeaders(t, 1, nil, []string{"b0"})
	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers: []string{fa.addr}, BackoffInitial: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	started := make(chan struct{})
	release := make(chan struct{})
	var handled atomic.Int32
	// Prefetch fixed at the fake's 1: an adaptive window may grow past it.
	stop := runWorker(t, c, "q", func(context.Context, *casq.Job) error {
		handled.Add(1)
		close(started)
		<-release
		return nil
	}, casq.WithPrefetch(1))
	wait(t, started)
	// B's stream ends while its job runs. The worker opens B again (A's
	// routing still names it) and acks the job by a unary call, which goes
	// to the client's broker, A.
	fb.killStreams()
	eventually(t, "B's stream opened again", func() (ok bool) {
		fb.snapshot(func(f *fakeLeader) { ok = f.opens == 2 && f.streamsOpen == 1 })
		return ok
	})
	eventually(t, "a unary heartbeat of the held job", func() (ok bool) {
		fa.snapshot(func(f *fakeLeader) { ok = f.unaryBeats > 0 })
		return ok
	})
	close(release)
	eventually(t, "the unary ack", func() (ok bool) {
		fa.snapshot(func(f *fakeLeader) { ok = len(f.unaryAcks) == 1 })
		return ok
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	fa.snapshot(func(f *fakeLeader) {
		if !slices.Equal(f.unaryAcks, []string{"B-0"}) || len(f.streamAcks) != 0 {
			t.Errorf("A: unary acks %q, stream acks %q; want [B-0] by a unary call only", f.unaryAcks, f.streamAcks)
		}
	})
	fb.snapshot(func(f *fakeLeader) {
		if len(f.streamAcks) != 0 || len(f.unaryAcks) != 0 {
			t.Errorf("B: acks %q %q after its stream was gone", f.streamAcks, f.unaryAcks)
		}
		if f.violation != "" {
			t.Error(f.violation)
		}
	})
	if n := handled.Load(); n != 1 {
		t.Errorf("%d handlers ran, want 1", n)
	}
}

func TestWorkerFindsLeaderNoRoutingNamed(t *testing.T) {
	// A leads shard 0, B shard 1. B goes away and C takes shard 1 over: A's
	// stream sends no routing event (its own shards did not change), so the
	// worker learns of C by LookupShards.
	fa, fb := twoLeaders(t, 1, nil, nil)
	fc := startFakeLeader(t, "C", 1, 1, "c0")
	moved := []*casqv1.ShardRoute{
		{Shard: 0, Leader: &casqv1.ShardLeader{Address: fa.addr}},
		{Shard: 1, Leader: &casqv1.ShardLeader{Address: fc.addr}},
	}
	fc.routes = moved
	fa.snapshot(func(f *fakeLeader) { f.lookup = moved })
	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers: []string{fa.addr}, BackoffInitial: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := make(chan string, 1)
	stop := runWorker(t, c, "q", func(_ context.Context, job *casq.Job) error {
		got <- string(job.Payload)
		return nil
	})
	eventually(t, "a stream to B", func() (ok bool) {
		fb.snapshot(func(f *fakeLeader) { ok = f.opens == 1 })
		return ok
	})
	fb.stop()
	if p := wait(t, got); p != "c0" {
		t.Fatalf("handled %q, want c0", p)
	}
	eventually(t, "the ack on C's stream", func() (ok bool) {
		fc.snapshot(func(f *fakeLeader) { ok = slices.Equal(f.streamAcks, []string{"C-0"}) })
		return ok
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	fa.snapshot(func(f *fakeLeader) {
		if f.lookups == 0 {
			t.Error("C was found without LookupShards")
		}
	})
}

func TestWorkerUnaryHeartbeatNotFoundCancelsHandler(t *testing.T) {
	fa, fb := twoLeaders(t, 1, nil, []string{"b0"})
	// The queue is gone by the time the job is heartbeated by a unary call.
	fa.snapshot(func(f *fakeLeader) { f.beatErr = status.Error(codes.NotFound, "queue q not found") })
	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers: []string{fa.addr}, BackoffInitial: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	started := make(chan struct{})
	cancelled := make(chan struct{})
	lost := make(chan string, 1)
	runWorker(t, c, "q", func(ctx context.Context, _ *casq.Job) error {
		close(started)
		<-ctx.Done()
		close(cancelled)
		return ctx.Err()
	}, casq.WithWorkerID("w-1"), casq.WithErrorHandler(func(err error, job *casq.Job) {
		if job != nil {
			lost <- err.Error()
		}
	}))
	wait(t, started)
	fb.killStreams()
	wait(t, cancelled)
	if msg := wait(t, lost); msg != "casq: lease lost: heartbeat: queue q not found" {
		t.Errorf("reported %q", msg)
	}
	fa.snapshot(func(f *fakeLeader) {
		if len(f.beatWorkers) == 0 || f.beatWorkers[0] != "w-1" {
			t.Errorf("unary heartbeats carried worker ids %q, want w-1", f.beatWorkers)
		}
	})
}

// The primary's broker breaks its stream while a secondary is open at the
// other broker: the reconnect loop moves to that stream and stays there. The
// shard the broken stream served must still get a stream again, although no
// routing changes (its leader restarted at the same address; found in the
// TypeScript SDK by simulation seed 941057).
func TestWorkerPrimaryLostWhileSecondaryOpen(t *testing.T) {
	fa, fb := twoLeaders(t, 1, nil, nil)
	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers: []string{fa.addr, fb.addr}, BackoffInitial: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stop := runWorker(t, c, "q", func(context.Context, *casq.Job) error { return nil })
	eventually(t, "a stream to each leader", func() (ok bool) {
		fa.snapshot(func(f *fakeLeader) { ok = f.streamsOpen == 1 })
		fb.snapshot(func(f *fakeLeader) { ok = ok && f.streamsOpen == 1 })
		return ok
	})
	fa.killStreams()
	eventually(t, "A's stream opened again", func() (ok bool) {
		fa.snapshot(func(f *fakeLeader) { ok = f.opens == 2 && f.streamsOpen == 1 })
		return ok
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	fb.snapshot(func(f *fakeLeader) {
		if f.opens != 1 {
			t.Errorf("B: %d streams opened, want 1 (the secondary became the primary)", f.opens)
		}
	})
}

// A broker that hands its shard over drains its stream: no more jobs from
// it, but it still answers the settles of the jobs it sent, up to its grace.
// The worker opens a stream to the shard's new leader as soon as the routing
// names it, not once the draining stream ends (the draining stream no longer
// serves the shard), and acks the job it still holds on the draining stream.
func TestWorkerDrainingStreamDoesNotCoverItsShards(t *testing.T) {
	fa, fb := twoLeaders(t, 2, []string{"a0"}, nil)
	fc := startFakeLeader(t, "C", 0, 2, "c0")
	c, err := casq.Dial(context.Background(), casq.Options{Brokers: []string{fa.addr}})
	if err != nil {
		t.Fatal(err)
	}
	// Closed after the worker stopped (cleanups run last first).
	t.Cleanup(func() { _ = c.Close() })
	started := make(chan string, 2)
	release := make(chan struct{})
	var releaseOnce sync.Once
	stop := runWorker(t, c, "q", func(_ context.Context, job *casq.Job) error {
		started <- string(job.Payload)
		if string(job.Payload) == "a0" {
			<-release
		}
		return nil
	}, casq.WithConcurrency(2), casq.WithPrefetch(2), casq.WithErrorHandler(func(err error, _ *casq.Job) { t.Log(err) }))
	// A failed test still lets the worker stop.
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	if got := wait(t, started); got != "a0" {
		t.Fatalf("first job %q, want a0", got)
	}
	eventually(t, "a stream to B", func() (ok bool) {
		fb.snapshot(func(f *fakeLeader) { ok = f.streamsOpen == 1 })
		return ok
	})

	// A hands shard 0 over to C: its stream drains (and stays open, as the
	// worker holds a0 from it), and B's routing names C.
	moved := []*casqv1.ShardRoute{
		{Shard: 0, Leader: &casqv1.ShardLeader{Address: fc.addr}},
		{Shard: 1, Leader: &casqv1.ShardLeader{Address: fb.addr}},
	}
	fc.snapshot(func(f *fakeLeader) { f.routes = moved })
	fa.drainStreams()
	fb.reroute(moved)
	if got := wait(t, started); got != "c0" {
		t.Fatalf("second job %q, want c0", got)
	}
	fa.snapshot(func(f *fakeLeader) {
		if f.streamsOpen != 1 {
			t.Fatalf("A: %d streams open when C's job came, want its draining stream", f.streamsOpen)
		}
	})
	releaseOnce.Do(func() { close(release) })
	eventually(t, "a0 acked", func() (ok bool) {
		fa.snapshot(func(f *fakeLeader) { ok = len(f.streamAcks)+len(f.unaryAcks) == 1 })
		return ok
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	fa.snapshot(func(f *fakeLeader) {
		if !slices.Equal(f.streamAcks, []string{"A-0"}) || len(f.unaryAcks) != 0 {
			t.Errorf("A: stream acks %q, unary acks %q; want A-0 on its draining stream", f.streamAcks, f.unaryAcks)
		}
		if f.opens != 1 {
			t.Errorf("A: %d streams opened, want 1", f.opens)
		}
	})
	for _, f := range []*fakeLeader{fa, fb, fc} {
		f.snapshot(func(f *fakeLeader) {
			if f.violation != "" {
				t.Error(f.violation)
			}
		})
	}
	fc.snapshot(func(f *fakeLeader) {
		if !slices.Equal(f.streamAcks, []string{"C-0"}) || f.opens != 1 {
			t.Errorf("C: %d streams opened, stream acks %q; want 1 and C-0", f.opens, f.streamAcks)
		}
	})
}

// TestWorkerAcksFinishedJobsTogether: handlers that finish together are
// acked in one request, not one each.
func TestWorkerAcksFinishedJobsTogether(t *testing.T) {
	const jobs = 20
	payloads := make([]string, jobs)
	for i := range payloads {
		payloads[i] = fmt.Sprintf("a%d", i)
	}
	f := startFakeLeader(t, "a", 0, jobs, payloads...)
	c, err := casq.Dial(context.Background(), casq.Options{Brokers: []string{f.addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	gate := make(chan struct{})
	var started atomic.Int32
	stop := runWorker(t, c, "q", func(context.Context, *casq.Job) error {
		started.Add(1)
		<-gate
		return nil
	}, casq.WithConcurrency(jobs), casq.WithPrefetch(jobs), casq.WithErrorHandler(func(err error, _ *casq.Job) { t.Log(err) }))

	eventually(t, "every handler running", func() bool { return started.Load() == jobs })
	close(gate)
	acked := func() (n int) {
		f.snapshot(func(f *fakeLeader) { n = len(f.streamAcks) })
		return n
	}
	eventually(t, "every job acked", func() bool { return acked() == jobs })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	f.snapshot(func(f *fakeLeader) {
		if len(f.ackSizes) >= jobs {
			t.Errorf("%d ack requests for %d jobs that finished together (sizes %v), want them batched", len(f.ackSizes), jobs, f.ackSizes)
		}
		if f.violation != "" {
			t.Error(f.violation)
		}
	})
}

// TestWorkerDropsJobLostBeforeStart: a job whose lease is lost while it
// waits for a handler slot never runs and is not settled (another worker
// may hold it now), and its credit goes back to the stream at once.
func TestWorkerDropsJobLostBeforeStart(t *testing.T) {
	f := startFakeLeader(t, "A", 0, 2, "j0", "j1", "j2")
	c, err := casq.Dial(context.Background(), casq.Options{Brokers: []string{f.addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var mu sync.Mutex
	var handled []string
	release := make(chan struct{})
	var errs errorLog
	stop := runWorker(t, c, "q", func(_ context.Context, job *casq.Job) error {
		mu.Lock()
		handled = append(handled, string(job.Payload))
		mu.Unlock()
		if string(job.Payload) == "j0" {
			<-release
		}
		return nil
	}, casq.WithConcurrency(1), casq.WithPrefetch(2), casq.WithLogger(nil), casq.WithErrorHandler(errs.add))
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock) // before the worker's stop, should the test fail first

	// j0 holds the only slot; j1 waits behind it.
	eventually(t, "j0 running and j1 delivered", func() (ok bool) {
		f.snapshot(func(f *fakeLeader) { ok = f.sent == 2 })
		mu.Lock()
		defer mu.Unlock()
		return ok && slices.Equal(handled, []string{"j0"})
	})
	f.loseLeases("A-1")
	// j1's credit came back: j2 is delivered while j0 still runs.
	eventually(t, "j2 delivered with j1's credit", func() (ok bool) {
		f.snapshot(func(f *fakeLeader) { ok = f.sent == 3 })
		return ok
	})
	unblock()
	eventually(t, "j0 and j2 acked", func() (ok bool) {
		f.snapshot(func(f *fakeLeader) { ok = len(f.streamAcks) == 2 })
		return ok
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	if !slices.Equal(handled, []string{"j0", "j2"}) {
		t.Errorf("handled %q, want [j0 j2]: j1's lease was lost before it started", handled)
	}
	mu.Unlock()
	f.snapshot(func(f *fakeLeader) {
		if !slices.Equal(f.streamAcks, []string{"A-0", "A-2"}) || len(f.streamNacks)+len(f.unaryAcks)+len(f.unaryNacks) != 0 {
			t.Errorf("acks %q (unary %q), nacks %q (unary %q); want acks [A-0 A-2] on the stream only", f.streamAcks, f.unaryAcks, f.streamNacks, f.unaryNacks)
		}
		if f.violation != "" {
			t.Error(f.violation)
		}
	})
	if got := errs.matching(""); !slices.Equal(got, []string{"j1: casq: lease lost: lease expired"}) {
		t.Errorf("reported %q, want j1's lost lease once", got)
	}
}

// splitShardLeaders starts brokers A and B for the split-by-shard tests: A
// delivers x0 (shard 0, receipt A-0) and x1 (shard 1, receipt A-1), and each
// settles and heartbeats only its own shard's receipt, redirecting for the
// other (A led shard 1 too when it delivered x1; B leads it now). The client
// knows only A.
func splitShardLeaders(t *testing.T) (fa, fb *fakeLeader, c *casq.Client) {
	t.Helper()
	fa, fb = twoLeaders(t, 2, []string{"x0", "x1"}, nil)
	fa.snapshot(func(f *fakeLeader) {
		f.shardOf = map[string]uint32{"x1": 1}
		f.elsewhere = map[string]string{"A-1": fb.addr}
	})
	fb.snapshot(func(f *fakeLeader) { f.elsewhere = map[string]string{"A-0": fa.addr} })
	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers: []string{fa.addr}, MaxAttempts: 6, BackoffInitial: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return fa, fb, c
}

// TestWorkerUnaryAckSplitByShard: the acks batched for a stream that is gone
// go by unary call one shard at a time. A broker settles the receipts of
// the shards it leads and redirects for the others, so one call carrying
// the receipts of shards led by two brokers would bounce between them until
// it gave up, and both jobs would be reported unacked.
func TestWorkerUnaryAckSplitByShard(t *testing.T) {
	fa, fb, c := splitShardLeaders(t)
	defer c.Close()
	var running atomic.Int32
	gate := make(chan struct{})
	returning := make(chan struct{}, 2)
	var errs errorLog
	var once sync.Once
	stop := runWorker(t, c, "q", func(context.Context, *casq.Job) error {
		running.Add(1)
		<-gate
		returning <- struct{}{}
		return nil
	}, casq.WithConcurrency(2), casq.WithPrefetch(2), casq.WithLogger(nil), casq.WithErrorHandler(func(err error, job *casq.Job) {
		errs.add(err, job)
		if job != nil || !strings.Contains(err.Error(), "fake broker shutting down") {
			return
		}
		// A's stream is gone, and the run's loop is in here: both
		// handlers finish before it handles either, so their acks go in
		// one batch.
		once.Do(func() {
			close(gate)
			<-returning
			<-returning
			// Their results are handed to the loop just after they
			// return. (Were one late, the acks would go one by one: the
			// test would pass without testing the split.)
			time.Sleep(50 * time.Millisecond)
		})
	}))
	eventually(t, "both handlers running", func() bool { return running.Load() == 2 })
	fa.killStreams()
	eventually(t, "each ack at its shard's leader", func() (ok bool) {
		fa.snapshot(func(f *fakeLeader) { ok = slices.Contains(f.unaryAcks, "A-0") })
		fb.snapshot(func(f *fakeLeader) { ok = ok && slices.Contains(f.unaryAcks, "A-1") })
		return ok
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	fa.snapshot(func(f *fakeLeader) {
		if !slices.Equal(f.unaryAcks, []string{"A-0"}) {
			t.Errorf("A: unary acks %q, want [A-0]", f.unaryAcks)
		}
	})
	fb.snapshot(func(f *fakeLeader) {
		if !slices.Equal(f.unaryAcks, []string{"A-1"}) {
			t.Errorf("B: unary acks %q, want [A-1]", f.unaryAcks)
		}
	})
	if got := errs.matching("x"); len(got) != 0 {
		t.Errorf("jobs reported: %q", got)
	}
}

// TestWorkerUnaryReleaseSplitByShard: the jobs a stopping worker hands back
// for a stream that is gone are released by unary call one shard at a time,
// as acks are.
func TestWorkerUnaryReleaseSplitByShard(t *testing.T) {
	fa, fb := twoLeaders(t, 3, []string{"j", "x0", "x1"}, nil)
	// A led shard 1 too when it delivered x1; B leads it now.
	fa.snapshot(func(f *fakeLeader) {
		f.shardOf = map[string]uint32{"x1": 1}
		f.elsewhere = map[string]string{"A-2": fb.addr}
	})
	fb.snapshot(func(f *fakeLeader) { f.elsewhere = map[string]string{"A-0": fa.addr, "A-1": fa.addr} })
	c, err := casq.Dial(context.Background(), casq.Options{
		Brokers: []string{fa.addr}, MaxAttempts: 6, BackoffInitial: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	started := make(chan struct{})
	release := make(chan struct{})
	var errs errorLog
	stop := runWorker(t, c, "q", func(_ context.Context, job *casq.Job) error {
		if string(job.Payload) != "j" {
			t.Errorf("%s ran: it was to be handed back", job.Payload)
			return nil
		}
		close(started)
		<-release
		return nil
	}, casq.WithConcurrency(1), casq.WithPrefetch(3), casq.WithLogger(nil), casq.WithErrorHandler(errs.add))
	// j runs; x0 (shard 0) and x1 (shard 1) wait behind it.
	wait(t, started)
	eventually(t, "x0 and x1 delivered", func() (ok bool) {
		fa.snapshot(func(f *fakeLeader) { ok = f.sent == 3 })
		return ok
	})
	fa.killStreams()
	eventually(t, "A's stream opened again", func() (ok bool) {
		fa.snapshot(func(f *fakeLeader) { ok = f.opens == 2 && f.streamsOpen == 1 })
		return ok
	})
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	eventually(t, "each release at its shard's leader", func() (ok bool) {
		fa.snapshot(func(f *fakeLeader) { ok = slices.Contains(f.unaryNacks, "A-1") })
		fb.snapshot(func(f *fakeLeader) { ok = ok && slices.Contains(f.unaryNacks, "A-2") })
		return ok
	})
	close(release)
	if err := wait(t, stopped); err != nil {
		t.Fatalf("Run: %v", err)
	}
	fa.snapshot(func(f *fakeLeader) {
		if !slices.Equal(f.unaryNacks, []string{"A-1"}) || !slices.Equal(f.unaryAcks, []string{"A-0"}) {
			t.Errorf("A: unary nacks %q, acks %q; want [A-1] and [A-0]", f.unaryNacks, f.unaryAcks)
		}
	})
	fb.snapshot(func(f *fakeLeader) {
		if !slices.Equal(f.unaryNacks, []string{"A-2"}) {
			t.Errorf("B: unary nacks %q, want [A-2]", f.unaryNacks)
		}
	})
	if got := errs.matching("x"); len(got) != 0 {
		t.Errorf("jobs reported: %q", got)
	}
}

// TestWorkerUnaryHeartbeatSplitByShard: the jobs of a stream that is gone
// are heartbeated by unary call one shard at a time, as acks are. A broker
// heartbeats the receipts of the shards it leads and redirects for the
// others, so one call carrying the receipts of shards led by two brokers
// would bounce between them until it gave up, and no lease would be
// extended.
func TestWorkerUnaryHeartbeatSplitByShard(t *testing.T) {
	fa, fb, c := splitShardLeaders(t)
	defer c.Close()
	var running atomic.Int32
	release := make(chan struct{})
	var errs errorLog
	stop := runWorker(t, c, "q", func(context.Context, *casq.Job) error {
		running.Add(1)
		<-release
		return nil
	}, casq.WithConcurrency(2), casq.WithPrefetch(2), casq.WithLogger(nil), casq.WithErrorHandler(errs.add))
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock) // before the worker's stop, should the test fail first

	eventually(t, "both handlers running", func() bool { return running.Load() == 2 })
	// The stream that delivered both jobs is gone: they are heartbeated by
	// unary calls (every 100ms, the fake's heartbeat interval).
	fa.killStreams()
	// mixed is a unary heartbeat naming the receipts of both shards: each
	// broker redirects it to the other.
	mixed := func(call []string) bool { return len(call) > 1 }
	count := func(calls [][]string, want string) (n int, mixes bool) {
		for _, call := range calls {
			mixes = mixes || mixed(call)
			if slices.Equal(call, []string{want}) {
				n++
			}
		}
		return n, mixes
	}
	eventually(t, "unary heartbeats at each shard's leader", func() bool {
		var na, nb int
		var ma, mb bool
		fa.snapshot(func(f *fakeLeader) { na, ma = count(f.beatCalls, "A-0") })
		fb.snapshot(func(f *fakeLeader) { nb, mb = count(f.beatCalls, "A-1") })
		return ma || mb || (na >= 3 && nb >= 3) // a mixed call fails below
	})
	unblock()
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// Each part may go first to the other broker and follow its redirect,
	// but no call names both shards' receipts.
	for _, f := range []*fakeLeader{fa, fb} {
		f.snapshot(func(f *fakeLeader) {
			for _, call := range f.beatCalls {
				if mixed(call) {
					t.Errorf("%s: unary heartbeat of %q, want one shard's receipts per call", f.name, call)
				}
			}
		})
	}
	var reported []string
	for _, e := range errs.matching("") {
		if !strings.Contains(e, "fake broker shutting down") {
			reported = append(reported, e)
		}
	}
	if len(reported) != 0 {
		t.Errorf("reported %q", reported)
	}
}
