package casq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Worker runs a handler over the Work stream. Get one from Client.Worker.
type Worker struct{ c *Client }

// Job is one delivery handed to a handler.
type Job struct {
	ID           string
	Queue        string
	Subscription string
	Payload      []byte
	Headers      map[string]string
	Key          string
	Priority     int32
	// Attempt is 1 on the first delivery.
	Attempt     uint32
	MaxAttempts uint32
	// Receipt names this delivery; opaque.
	Receipt string
	// TraceParent and TraceState are the producer's W3C trace context.
	TraceParent string
	TraceState  string
	EnqueuedAt  time.Time
}

// Handler processes one job: nil acks it, an error nacks it (retried with
// the queue's backoff), an error wrapping ErrDeadLetter dead-letters it. Its
// context is cancelled when the lease is lost or the shutdown deadline passed,
// and carries the job's "process <queue>" span (see Options.TracerProvider).
type Handler func(ctx context.Context, job *Job) error

// WorkerOption configures Run.
type WorkerOption func(*workerConfig)

type workerConfig struct {
	concurrency     int
	prefetch        int
	subscription    string
	workerID        string
	leaseTTL        time.Duration
	shutdownTimeout time.Duration
	onError         func(error, *Job)
}

// WithConcurrency sets how many handlers run at once (default 1).
func WithConcurrency(n int) WorkerOption { return func(c *workerConfig) { c.concurrency = n } }

// WithPrefetch sets how many jobs the worker holds at most, running or
// waiting (default: the concurrency; at most 1000).
func WithPrefetch(n int) WorkerOption { return func(c *workerConfig) { c.prefetch = n } }

// WithSubscription selects the consumer group (default "default").
func WithSubscription(s string) WorkerOption { return func(c *workerConfig) { c.subscription = s } }

// WithWorkerID sets the worker's identity (default "host/pid-N").
func WithWorkerID(id string) WorkerOption { return func(c *workerConfig) { c.workerID = id } }

// WithLeaseTTL overrides the queue's lease TTL for this worker's jobs.
func WithLeaseTTL(d time.Duration) WorkerOption { return func(c *workerConfig) { c.leaseTTL = d } }

// WithShutdownTimeout bounds how long Run waits for running handlers once
// its context is cancelled (default 30 s).
func WithShutdownTimeout(d time.Duration) WorkerOption {
	return func(c *workerConfig) { c.shutdownTimeout = d }
}

// WithErrorHandler receives failures that do not end Run (a handler error,
// a failed ack, a lost lease, a broken stream); job may be nil.
func WithErrorHandler(f func(err error, job *Job)) WorkerOption {
	return func(c *workerConfig) { c.onError = f }
}

// held is one job the worker holds, from its delivery until it is settled.
type held struct {
	job     *Job
	cancel  context.CancelFunc
	started bool
	// from is the session that delivered the job: its ack, nack and
	// heartbeats go on that stream while it is open, by unary calls once it
	// is gone (a receipt is valid on any stream or call).
	from *session
	// owner is the session whose credit the job uses, given back to it when
	// the job finishes. nil once that session is gone, until a new session
	// adopts the job (see activate), so that the worker's holdings stay
	// within prefetch per open stream across reconnects.
	owner *session
}

type result struct {
	receipt string
	err     error
}

type reqKind int

const (
	reqHeartbeat reqKind = iota
	reqAck
	reqNack
)

// pendingReq is a request sent on a stream and not answered yet, kept so
// that it can be re-sent as a unary call if the stream is lost.
type pendingReq struct {
	kind     reqKind
	receipts []string
	nack     *casqv1.WorkNack
}

// session is one Work stream to one broker. A run keeps at most one session
// per broker address: the primary (the broker the client prefers; it
// reconnects with backoff and follows redirects) and secondaries, one per
// leader of shards that no open session serves.
type session struct {
	addr    string
	primary bool
	credits uint32 // asked for in Open
	ctx     context.Context
	cancel  context.CancelFunc
	stream  grpc.BidiStreamingClient[casqv1.WorkRequest, casqv1.WorkResponse] // set once open

	open       bool // Opened received (false while the handshake runs)
	gone       bool // dropped or closed: nothing more is sent on it
	halfClosed bool
	draining   bool
	pending    map[uint64]pendingReq
	serving    map[uint32]bool // routing.serving_shards
}

// inboxMsg is what a session's receive goroutine hands the run loop: an
// event, or (ev nil) the stream's end. s is nil for the lost leases a unary
// heartbeat found.
type inboxMsg struct {
	s   *session
	ev  *casqv1.WorkResponse
	err error
}

type lookupResult struct {
	routes []*casqv1.ShardRoute
	err    error
}

type openResult struct {
	s      *session
	stream grpc.BidiStreamingClient[casqv1.WorkRequest, casqv1.WorkResponse]
	opened *casqv1.WorkOpened
	err    error
}

type run struct {
	c       *Client
	ctx     context.Context // the caller's, for values only after a stop
	queue   string
	cfg     workerConfig
	handler Handler

	jobs    map[string]*held
	waiting []string // receipts held but not started, in arrival order
	running int
	done    chan result
	nextID  uint64

	sessions map[string]*session // open or opening, by broker address
	primary  *session            // open or opening; nil while reconnecting
	inbox    chan inboxMsg
	opens    chan openResult
	quit     chan struct{} // closed as the loop returns: goroutines stop handing it things

	hb      *time.Ticker // made by the first Opened
	hbEvery time.Duration

	// leaders maps each shard to its leader's address ("" for none), as the
	// latest routing event or LookupShards answer naming the shard said.
	leaders map[uint32]string
	// Backoff of secondary sessions, by address: a leader whose stream failed
	// is tried again (if leaders still names it) no sooner than retryAt.
	failures  map[string]int
	retryAt   map[string]time.Time
	reconcile *time.Timer
	// A secondary lost without a redirect may mean its shards moved to a
	// broker no routing event names (streams announce changes of their own
	// shards only), so leaders is refreshed by LookupShards at lookupAt.
	lookupAt  time.Time
	looking   bool
	looked    chan lookupResult
	lookupCtx context.Context // cancelled as the loop returns

	unary  sync.WaitGroup
	tracer trace.Tracer
}

// Run consumes queue until ctx is cancelled, then shuts down gracefully: it
// stops taking jobs, hands back jobs that had not started, waits up to the
// shutdown timeout for running handlers and settles them, and returns nil.
// Handlers still running then are cancelled and never acked. Run returns an
// *Error early only for failures retrying cannot fix (NOT_FOUND,
// INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED, FAILED_PRECONDITION).
//
// A Work stream delivers jobs only from the shards its broker leads, so Run
// keeps one stream per shard leader: the primary stream, to the preferred
// broker, reconnects with backoff (at once after a redirect or a drain); the
// routing each stream reports names the leaders of the other shards, and Run
// opens a stream to each of them (again, with backoff, while routing still
// names one whose stream failed; LookupShards refreshes the leaders when a
// stream is lost without a redirect). Every stream has its own prefetch
// credits, so the worker may hold up to prefetch jobs per stream;
// WithConcurrency bounds the handlers running at once over all of them.
func (w *Worker) Run(ctx context.Context, queue string, handler Handler, opts ...WorkerOption) error {
	cfg := workerConfig{concurrency: 1, shutdownTimeout: 30 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	cfg.concurrency = max(cfg.concurrency, 1)
	if cfg.prefetch <= 0 {
		cfg.prefetch = cfg.concurrency
	}
	cfg.prefetch = min(max(cfg.prefetch, cfg.concurrency), 1000)
	if cfg.workerID == "" {
		host, _ := os.Hostname()
		cfg.workerID = fmt.Sprintf("%s/pid-%d", host, os.Getpid())
	}
	r := &run{
		c: w.c, ctx: ctx, queue: queue, cfg: cfg, handler: handler,
		jobs: map[string]*held{},
		// At most concurrency handlers report at once, so they never block
		// on a loop that has returned.
		done:     make(chan result, cfg.concurrency),
		sessions: map[string]*session{},
		inbox:    make(chan inboxMsg),
		opens:    make(chan openResult),
		quit:     make(chan struct{}),
		leaders:  map[uint32]string{},
		failures: map[string]int{},
		retryAt:  map[string]time.Time{},
		looked:   make(chan lookupResult),
		tracer:   w.c.tracer(),
	}
	return r.loop()
}

func (r *run) report(err error, job *Job) {
	if r.cfg.onError != nil && err != nil {
		r.cfg.onError(err, job)
	}
}

func fatal(code codes.Code) bool {
	switch code {
	case codes.NotFound, codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.FailedPrecondition:
		return true
	}
	return false
}

func (r *run) loop() error {
	addr := r.c.current() // where the primary (re)connects
	failures := 0
	reconnect := time.NewTimer(0)
	defer reconnect.Stop()
	r.reconcile = time.NewTimer(time.Hour)
	r.reconcile.Stop()
	defer r.reconcile.Stop()
	var deadline <-chan time.Time
	stopping := false
	var abandonAfter *time.Timer
	var stopLookups context.CancelFunc
	r.lookupCtx, stopLookups = context.WithCancel(context.WithoutCancel(r.ctx))
	defer func() {
		if abandonAfter != nil {
			abandonAfter.Stop()
		}
		if r.hb != nil {
			r.hb.Stop()
		}
		stopLookups()
		close(r.quit)
		r.closeAll()
		r.unary.Wait()
	}()
	stopC := r.ctx.Done()

	// retry schedules the primary's next attempt after it failed on addr.
	retry := func(e *Error, draining bool) {
		r.report(e, nil)
		delay := time.Duration(0)
		switch {
		case e.LeaderAddress != "":
			addr = e.LeaderAddress
			r.c.prefer(addr)
		case draining:
			addr = r.c.next(addr)
		default:
			addr = r.c.next(addr)
			delay = r.c.backoff(failures)
			failures++
		}
		reconnect.Reset(delay)
	}

	for {
		if stopping && len(r.jobs) == 0 && r.quiet() {
			r.finishAll()
			return nil
		}
		var reconnectC, reconcileC, hbC <-chan time.Time
		if r.primary == nil && !stopping {
			reconnectC = reconnect.C
		}
		if !stopping {
			reconcileC = r.reconcile.C
		}
		if r.hb != nil {
			hbC = r.hb.C
		}
		select {
		case <-stopC:
			stopC = nil
			stopping = true
			abandonAfter = time.NewTimer(r.cfg.shutdownTimeout)
			deadline = abandonAfter.C
			r.handBack()
		case <-deadline:
			deadline = nil
			for receipt, h := range r.jobs {
				if h.cancel != nil {
					h.cancel()
				}
				delete(r.jobs, receipt)
				r.report(errors.New("casq: shutdown timeout; job abandoned without ack"), h.job)
			}
			r.waiting = nil
			// Give outstanding replies no more time.
			for _, s := range r.sessions {
				clear(s.pending)
			}
		case <-reconnectC:
			if s := r.sessions[addr]; s != nil {
				// A secondary stream to that broker is open (or opening)
				// already: it becomes the primary rather than a second
				// stream to the same broker.
				s.primary = true
				r.primary = s
				if s.open {
					failures = 0
					r.c.prefer(addr)
				}
				continue
			}
			r.primary = r.startOpen(addr, true)
		case res := <-r.opens:
			s := res.s
			if res.err != nil {
				if r.sessions[s.addr] == s {
					delete(r.sessions, s.addr)
				}
				s.gone = true
				s.cancel()
				e := toError(res.err, nil)
				if !s.primary {
					if !stopping {
						r.secondaryLost(s.addr, e, res.err)
					}
					continue
				}
				r.primary = nil
				if stopping {
					continue
				}
				if fatal(e.Code) {
					return e
				}
				addr = s.addr
				retry(e, false)
				continue
			}
			// Opened as the worker was stopping: grant it nothing and
			// half-close it at once, so that it sends no job.
			s.halfClosed = stopping
			r.activate(s, res)
			if s.primary {
				failures = 0
				r.c.prefer(s.addr)
			}
			if stopping {
				_ = s.stream.CloseSend()
			} else {
				r.reconcileStreams()
			}
		case m := <-r.inbox:
			s := m.s
			switch {
			case s == nil:
				r.event(nil, m.ev, stopping)
			case s.gone:
				// Sent before the session was dropped. A job still arrives
				// leased to this worker: give it back rather than let its
				// lease run out.
				if job := m.ev.GetJob(); job != nil {
					r.unarySettle(giveBack([]string{job.GetReceipt()}))
				}
			case m.ev != nil:
				r.event(s, m.ev, stopping)
			default:
				e := toError(m.err, s.stream.Trailer())
				draining := s.draining
				r.dropSession(s)
				if stopping {
					break
				}
				if !s.primary {
					r.secondaryLost(s.addr, e, m.err)
					break
				}
				addr = s.addr
				if m.err == nil || errors.Is(m.err, io.EOF) {
					reconnect.Reset(0)
					break
				}
				if fatal(e.Code) {
					return e
				}
				retry(e, draining)
			}
		case <-reconcileC:
			r.reconcileStreams()
		case res := <-r.looked:
			r.looking = false
			if res.err != nil {
				r.report(res.err, nil)
				r.lookupAt = time.Now().Add(r.c.opts.BackoffMax)
			}
			r.learn(res.routes)
			if !stopping {
				r.reconcileStreams()
			}
		case <-hbC:
			r.heartbeat()
		case res := <-r.done:
			r.finished(res, stopping)
		}
		if !stopping {
			r.startWaiting()
		}
	}
}

// quiet reports whether no session is opening and no stream request awaits
// its answer.
func (r *run) quiet() bool {
	for _, s := range r.sessions {
		if !s.open || len(s.pending) > 0 {
			return false
		}
	}
	return true
}

// startOpen registers a session to addr and runs its handshake in the
// background (so that other streams keep flowing meanwhile); the result
// comes back on r.opens.
func (r *run) startOpen(addr string, primary bool) *session {
	orphans := 0
	for _, h := range r.jobs {
		if h.owner == nil {
			orphans++
		}
	}
	sctx, cancel := context.WithCancel(r.c.outgoing(context.WithoutCancel(r.ctx)))
	s := &session{
		addr: addr, primary: primary, ctx: sctx, cancel: cancel,
		// The jobs of lost streams it will adopt use part of its credit.
		credits: uint32(r.cfg.prefetch - min(orphans, r.cfg.prefetch)),
		pending: map[uint64]pendingReq{}, serving: map[uint32]bool{},
	}
	r.sessions[addr] = s
	go func() {
		res := r.handshake(s)
		res.s = s
		select {
		case r.opens <- res:
		case <-r.quit:
			s.cancel()
		}
	}()
	return s
}

// handshake opens the stream of s and waits for Opened. It runs on its own
// goroutine and only reads s.
func (r *run) handshake(s *session) openResult {
	timer := time.AfterFunc(r.c.opts.Timeout, s.cancel)
	defer timer.Stop()
	conn, err := r.c.conn(s.addr)
	if err != nil {
		return openResult{err: err}
	}
	stream, err := casqv1.NewQueueServiceClient(conn).Work(s.ctx)
	if err != nil {
		return openResult{err: err}
	}
	open := &casqv1.WorkOpen{
		Queue: r.queue, Subscription: r.cfg.subscription, WorkerId: r.cfg.workerID, Credits: s.credits,
	}
	if r.cfg.leaseTTL > 0 {
		open.LeaseTtl = durationpb.New(r.cfg.leaseTTL)
	}
	if err := stream.Send(&casqv1.WorkRequest{Command: &casqv1.WorkRequest_Open{Open: open}}); err != nil {
		if _, rerr := stream.Recv(); rerr != nil {
			return openResult{err: toError(rerr, stream.Trailer())}
		}
		return openResult{err: err}
	}
	first, err := stream.Recv()
	if err != nil {
		return openResult{err: toError(err, stream.Trailer())}
	}
	opened := first.GetOpened()
	if opened == nil {
		return openResult{err: &Error{Code: codes.Internal, Message: "casq: first Work response is not opened"}}
	}
	return openResult{stream: stream, opened: opened}
}

// activate makes an opened session live: routing, heartbeats, adoption of
// the jobs of lost streams, and its receive goroutine.
func (r *run) activate(s *session, res openResult) {
	s.stream, s.open = res.stream, true
	r.applyRouting(s, res.opened.GetRouting())
	interval := res.opened.GetHeartbeatInterval().AsDuration()
	if interval <= 0 {
		interval = 10 * time.Second
	}
	switch {
	case r.hb == nil:
		r.hb, r.hbEvery = time.NewTicker(interval), interval
	case interval < r.hbEvery:
		r.hb.Reset(interval)
		r.hbEvery = interval
	}
	// Open asked for prefetch minus the orphans there were then; adopt that
	// many now, and ask for the credit of those that finished meanwhile.
	want := r.cfg.prefetch - int(s.credits)
	for _, h := range r.jobs {
		if want == 0 {
			break
		}
		if h.owner == nil {
			h.owner = s
			want--
		}
	}
	r.credit(s, want)
	delete(r.failures, s.addr)
	delete(r.retryAt, s.addr)
	go func() {
		for {
			ev, err := s.stream.Recv()
			// Every message, the end included, reaches the loop (which
			// ignores those of a dropped session) unless the loop is over.
			select {
			case r.inbox <- inboxMsg{s: s, ev: ev, err: err}:
			case <-r.quit:
				return
			}
			if err != nil {
				return
			}
		}
	}()
}

func (r *run) applyRouting(s *session, routing *casqv1.WorkRouting) {
	if routing == nil {
		return
	}
	clear(s.serving)
	for _, shard := range routing.GetServingShards() {
		s.serving[shard] = true
	}
	r.learn(routing.GetShards())
}

// learn records the shards' leaders of a routing event or lookup.
func (r *run) learn(routes []*casqv1.ShardRoute) {
	for _, route := range routes {
		r.leaders[route.GetShard()] = route.GetLeader().GetAddress()
	}
}

// lookup refreshes leaders with LookupShards, in the background.
func (r *run) lookup() {
	r.looking = true
	r.unary.Add(1)
	go func() {
		defer r.unary.Done()
		var routes []*casqv1.ShardRoute
		err := r.c.call(r.lookupCtx, func(ctx context.Context, qs casqv1.QueueServiceClient, _ casqv1.AdminServiceClient, o ...grpc.CallOption) error {
			res, err := qs.LookupShards(ctx, &casqv1.LookupShardsRequest{Queue: r.queue}, o...)
			routes = res.GetShards()
			return err
		})
		select {
		case r.looked <- lookupResult{routes: routes, err: err}:
		case <-r.quit:
		}
	}()
}

// reconcileStreams opens a secondary session to the leader of every shard
// that no open session serves, unless a session to that broker exists or
// its last one failed too recently; it starts a due lookup, and arms
// r.reconcile for what is not due yet.
func (r *run) reconcileStreams() {
	now := time.Now()
	var wake time.Time
	later := func(at time.Time) {
		if wake.IsZero() || at.Before(wake) {
			wake = at
		}
	}
	covered := map[uint32]bool{}
	for _, s := range r.sessions {
		if s.open {
			for shard := range s.serving {
				covered[shard] = true
			}
		}
	}
	need := map[string]bool{}
	uncovered := false
	for shard, a := range r.leaders {
		if covered[shard] {
			continue
		}
		uncovered = true
		if a == "" || r.sessions[a] != nil {
			continue
		}
		if at := r.retryAt[a]; now.Before(at) {
			later(at)
			continue
		}
		need[a] = true
	}
	for a := range need {
		r.startOpen(a, false)
	}
	switch {
	case r.lookupAt.IsZero() || r.looking:
	case !uncovered:
		r.lookupAt = time.Time{} // every shard is served: nothing to look up
	case now.Before(r.lookupAt):
		later(r.lookupAt)
	default:
		r.lookupAt = time.Time{}
		r.lookup()
	}
	if !wake.IsZero() {
		r.reconcile.Reset(time.Until(wake))
	}
}

// secondaryLost handles the failed open or the end of a secondary session:
// no reconnect loop of its own, but a backoff before routing may open it
// again, and a redirect names the broker that leads its shards now.
func (r *run) secondaryLost(addr string, e *Error, err error) {
	if err != nil && !errors.Is(err, io.EOF) {
		r.report(e, nil)
	}
	r.failures[addr]++
	delay := r.c.backoff(r.failures[addr] - 1)
	r.retryAt[addr] = time.Now().Add(delay)
	if l := e.LeaderAddress; l != "" {
		if r.sessions[l] == nil && !time.Now().Before(r.retryAt[l]) {
			r.startOpen(l, false)
		}
	} else if r.lookupAt.IsZero() {
		r.lookupAt = time.Now().Add(delay)
	}
	r.reconcileStreams()
}

// dropSession forgets a broken session: its unanswered requests are re-sent
// as unary calls, and the jobs using its credit wait for adoption.
func (r *run) dropSession(s *session) {
	if s.gone {
		return
	}
	s.gone = true
	s.cancel()
	if r.sessions[s.addr] == s {
		delete(r.sessions, s.addr)
	}
	if r.primary == s {
		r.primary = nil
	}
	for _, h := range r.jobs {
		if h.owner == s {
			h.owner = nil
		}
	}
	for id, p := range s.pending {
		delete(s.pending, id)
		r.unarySettle(p)
	}
}

func (r *run) closeAll() {
	for addr, s := range r.sessions {
		s.gone = true
		s.cancel()
		delete(r.sessions, addr)
	}
	r.primary = nil
}

// finishAll half-closes every stream and waits (briefly) for the brokers'
// OKs.
func (r *run) finishAll() {
	live := 0
	for _, s := range r.sessions {
		if !s.halfClosed {
			s.halfClosed = true
			_ = s.stream.CloseSend()
		}
		live++
	}
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	for live > 0 {
		select {
		case m := <-r.inbox:
			if job := m.ev.GetJob(); job != nil {
				// Not expected after a half-close: give it back.
				r.unarySettle(giveBack([]string{job.GetReceipt()}))
			}
			if m.s == nil || m.s.gone || m.ev != nil {
				continue
			}
			m.s.gone = true
			m.s.cancel()
			delete(r.sessions, m.s.addr)
			live--
		case <-t.C:
			return
		}
	}
}

func giveBack(receipts []string) pendingReq {
	return pendingReq{kind: reqNack, receipts: receipts, nack: &casqv1.WorkNack{Delay: durationpb.New(0), Reason: "worker stopping"}}
}

// send sends req on s, or (p given) re-sends it as a unary call when s can
// no longer carry it.
func (r *run) send(s *session, req *casqv1.WorkRequest, p *pendingReq) {
	if s == nil || s.gone || !s.open || s.halfClosed {
		if p != nil {
			r.unarySettle(*p)
		}
		return
	}
	if p != nil {
		r.nextID++
		req.RequestId = r.nextID
		s.pending[req.RequestId] = *p
	}
	if err := s.stream.Send(req); err != nil {
		// The receive goroutine reports the stream's end; pending requests
		// are re-sent then.
		return
	}
}

func (r *run) credit(s *session, n int) {
	if n <= 0 || s == nil || s.gone || !s.open || s.halfClosed || s.draining {
		return
	}
	r.send(s, &casqv1.WorkRequest{Command: &casqv1.WorkRequest_Credit{Credit: &casqv1.WorkCredit{Credits: uint32(n)}}}, nil)
}

func (r *run) settle(s *session, p pendingReq) {
	switch p.kind {
	case reqAck:
		r.send(s, &casqv1.WorkRequest{Command: &casqv1.WorkRequest_Ack{Ack: &casqv1.WorkAck{Receipts: p.receipts}}}, &p)
	case reqNack:
		n := &casqv1.WorkNack{Receipts: p.receipts, Delay: p.nack.GetDelay(), DeadLetter: p.nack.GetDeadLetter(), Reason: p.nack.GetReason()}
		r.send(s, &casqv1.WorkRequest{Command: &casqv1.WorkRequest_Nack{Nack: n}}, &p)
	case reqHeartbeat:
		r.send(s, &casqv1.WorkRequest{Command: &casqv1.WorkRequest_Heartbeat{Heartbeat: &casqv1.WorkHeartbeat{Receipts: p.receipts}}}, &p)
	}
}

// unarySettle re-sends an ack, nack or heartbeat as the unary RPC (with
// redirects and failover). Leases a heartbeat finds lost go back to the loop
// as a leases_lost event.
func (r *run) unarySettle(p pendingReq) {
	if len(p.receipts) == 0 {
		return
	}
	r.unary.Add(1)
	go func() {
		defer r.unary.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 30*time.Second)
		defer cancel()
		var lost []string
		err := r.c.call(ctx, func(ctx context.Context, qs casqv1.QueueServiceClient, _ casqv1.AdminServiceClient, o ...grpc.CallOption) error {
			switch p.kind {
			case reqAck:
				_, err := qs.Ack(ctx, &casqv1.AckRequest{Queue: r.queue, Subscription: r.cfg.subscription, Receipts: p.receipts}, o...)
				return err
			case reqNack:
				_, err := qs.Nack(ctx, &casqv1.NackRequest{Queue: r.queue, Subscription: r.cfg.subscription, Receipts: p.receipts,
					Delay: p.nack.GetDelay(), DeadLetter: p.nack.GetDeadLetter(), Reason: p.nack.GetReason()}, o...)
				return err
			}
			res, err := qs.Heartbeat(ctx, &casqv1.HeartbeatRequest{Queue: r.queue, Subscription: r.cfg.subscription, Receipts: p.receipts}, o...)
			lost = lost[:0]
			for _, x := range res.GetResults() {
				if x.GetOutcome() == casqv1.HeartbeatOutcome_HEARTBEAT_OUTCOME_LOST {
					lost = append(lost, x.GetReceipt())
				}
			}
			return err
		})
		r.report(err, nil)
		if err == nil && len(lost) > 0 {
			ev := &casqv1.WorkResponse{Event: &casqv1.WorkResponse_LeasesLost{LeasesLost: &casqv1.WorkLeasesLost{Receipts: lost, Reason: "heartbeat: lease lost"}}}
			select {
			case r.inbox <- inboxMsg{ev: ev}:
			case <-r.quit:
			}
		}
	}()
}

// event handles one message of session s (nil: a unary heartbeat's lost
// leases).
func (r *run) event(s *session, ev *casqv1.WorkResponse, stopping bool) {
	switch e := ev.GetEvent().(type) {
	case *casqv1.WorkResponse_Job:
		job := toJob(e.Job)
		if stopping {
			r.settle(s, giveBack([]string{job.Receipt}))
			return
		}
		r.jobs[job.Receipt] = &held{job: job, from: s, owner: s}
		r.waiting = append(r.waiting, job.Receipt)
	case *casqv1.WorkResponse_LeasesLost:
		for _, receipt := range e.LeasesLost.GetReceipts() {
			if h, ok := r.jobs[receipt]; ok {
				if h.cancel != nil {
					h.cancel()
				}
				r.report(fmt.Errorf("casq: lease lost: %s", e.LeasesLost.GetReason()), h.job)
			}
		}
	case *casqv1.WorkResponse_Acked, *casqv1.WorkResponse_Nacked, *casqv1.WorkResponse_Heartbeated:
		delete(s.pending, ev.GetRequestId())
		for _, a := range ev.GetAcked().GetResults() {
			if a.GetOutcome() == casqv1.AckOutcome_ACK_OUTCOME_LEASE_LOST {
				r.report(fmt.Errorf("casq: ack of %s: lease lost", a.GetReceipt()), nil)
			}
		}
	case *casqv1.WorkResponse_RequestFailed:
		p, ok := s.pending[ev.GetRequestId()]
		delete(s.pending, ev.GetRequestId())
		err := statusError(e.RequestFailed.GetStatus())
		if ok && (err.LeaderAddress != "" || err.Code == codes.Unavailable) {
			r.unarySettle(p)
		} else {
			r.report(err, nil)
		}
	case *casqv1.WorkResponse_Draining:
		s.draining = true
	case *casqv1.WorkResponse_Routing:
		r.applyRouting(s, e.Routing)
		if !stopping {
			r.reconcileStreams()
		}
	}
}

func (r *run) startWaiting() {
	for r.running < r.cfg.concurrency && len(r.waiting) > 0 {
		receipt := r.waiting[0]
		r.waiting = r.waiting[1:]
		h, ok := r.jobs[receipt]
		if !ok {
			continue
		}
		hctx, span := r.startSpan(h.job)
		hctx, h.cancel = context.WithCancel(hctx)
		h.started = true
		r.running++
		go func(ctx context.Context, job *Job) {
			err := r.safeHandle(ctx, job)
			if err != nil {
				span.RecordError(err)
				span.SetStatus(otelcodes.Error, err.Error())
			}
			span.End()
			r.done <- result{receipt: job.Receipt, err: err}
		}(hctx, h.job)
	}
}

// startSpan starts the "process <queue>" span of a job, a child of the
// producer's trace context stored with the job (a new root without one), so
// that producer, broker and worker spans share one trace.
func (r *run) startSpan(job *Job) (context.Context, trace.Span) {
	ctx, ok := jobParent(context.WithoutCancel(r.ctx), job)
	sub := job.Subscription
	if sub == "" {
		sub = r.cfg.subscription
	}
	if sub == "" {
		sub = "default"
	}
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "casq"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", r.queue),
			attribute.String("messaging.consumer.group.name", sub),
			attribute.String("messaging.message.id", job.ID),
			attribute.Int64("casq.attempt", int64(job.Attempt)),
		),
	}
	if !ok {
		opts = append(opts, trace.WithNewRoot())
	}
	return r.tracer.Start(ctx, "process "+r.queue, opts...)
}

func (r *run) safeHandle(ctx context.Context, job *Job) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("casq: handler panicked: %v", p)
		}
	}()
	return r.handler(ctx, job)
}

func (r *run) finished(res result, stopping bool) {
	h, ok := r.jobs[res.receipt]
	if !ok {
		return // abandoned at the shutdown deadline: never settled
	}
	r.running--
	h.cancel()
	delete(r.jobs, res.receipt)
	if res.err == nil {
		r.settle(h.from, pendingReq{kind: reqAck, receipts: []string{res.receipt}})
	} else {
		r.report(res.err, h.job)
		r.settle(h.from, pendingReq{kind: reqNack, receipts: []string{res.receipt}, nack: &casqv1.WorkNack{
			DeadLetter: errors.Is(res.err, ErrDeadLetter), Reason: reason(res.err)}})
	}
	if !stopping {
		r.credit(h.owner, 1)
	}
}

// handBack nacks the jobs that arrived but had not started, each on the
// stream it came from.
func (r *run) handBack() {
	bySession := map[*session][]string{}
	for _, receipt := range r.waiting {
		if h, ok := r.jobs[receipt]; ok && !h.started {
			bySession[h.from] = append(bySession[h.from], receipt)
			delete(r.jobs, receipt)
		}
	}
	r.waiting = nil
	for s, receipts := range bySession {
		for len(receipts) > 0 {
			n := min(len(receipts), 100)
			r.settle(s, giveBack(receipts[:n]))
			receipts = receipts[n:]
		}
	}
}

// heartbeat keeps every held job's lease alive, on the stream it came from
// (by unary calls for the jobs of lost streams).
func (r *run) heartbeat() {
	bySession := map[*session][]string{}
	for receipt, h := range r.jobs {
		bySession[h.from] = append(bySession[h.from], receipt)
	}
	for s, receipts := range bySession {
		for len(receipts) > 0 {
			n := min(len(receipts), 100)
			r.settle(s, pendingReq{kind: reqHeartbeat, receipts: receipts[:n]})
			receipts = receipts[n:]
		}
	}
}

func toJob(c *casqv1.ClaimedMessage) *Job {
	m := c.GetMessage()
	j := &Job{
		ID: m.GetId(), Queue: m.GetQueue(), Subscription: c.GetSubscription(), Payload: m.GetPayload(),
		Headers: m.GetHeaders(), Key: m.GetKey(), Priority: m.GetPriority(),
		Attempt: c.GetAttempt(), MaxAttempts: c.GetMaxAttempts(), Receipt: c.GetReceipt(),
		TraceParent: m.GetTraceContext().GetTraceparent(), TraceState: m.GetTraceContext().GetTracestate(),
	}
	if m.GetEnqueuedAt() != nil {
		j.EnqueuedAt = m.GetEnqueuedAt().AsTime()
	}
	return j
}
