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

type held struct {
	job     *Job
	cancel  context.CancelFunc
	started bool
}

type result struct {
	receipt string
	err     error
}

type pendingReq struct {
	ack      bool // else nack
	receipts []string
	nack     *casqv1.WorkNack
}

type session struct {
	stream   grpc.BidiStreamingClient[casqv1.WorkRequest, casqv1.WorkResponse]
	cancel   context.CancelFunc
	events   chan *casqv1.WorkResponse
	ended    chan error
	pending  map[uint64]pendingReq
	hb       *time.Ticker
	draining bool
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
	sess    *session
	unary   sync.WaitGroup
	tracer  trace.Tracer
}

// Run consumes queue until ctx is cancelled, then shuts down gracefully: it
// stops taking jobs, hands back jobs that had not started, waits up to the
// shutdown timeout for running handlers and settles them, and returns nil.
// Handlers still running then are cancelled and never acked. Run returns an
// *Error early only for failures retrying cannot fix (NOT_FOUND,
// INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED, FAILED_PRECONDITION).
// The stream reconnects with backoff (at once after a redirect or a drain).
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
		jobs:   map[string]*held{},
		done:   make(chan result, cfg.prefetch),
		tracer: w.c.tracer(),
	}
	return r.loop(ctx)
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

func (r *run) loop(ctx context.Context) error {
	addr := r.c.current()
	failures := 0
	reconnect := time.NewTimer(0)
	defer reconnect.Stop()
	var deadline <-chan time.Time
	stopping := false
	var abandonAfter *time.Timer
	defer func() {
		if abandonAfter != nil {
			abandonAfter.Stop()
		}
		r.closeSession()
		r.unary.Wait()
	}()
	stopC := ctx.Done()

	for {
		if stopping && len(r.jobs) == 0 && (r.sess == nil || len(r.sess.pending) == 0) {
			r.finishSession()
			return nil
		}
		var events <-chan *casqv1.WorkResponse
		var ended <-chan error
		var hb <-chan time.Time
		if r.sess != nil {
			events, ended, hb = r.sess.events, r.sess.ended, r.sess.hb.C
		}
		var reconnectC <-chan time.Time
		if r.sess == nil && !stopping {
			reconnectC = reconnect.C
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
				h.cancel()
				delete(r.jobs, receipt)
				r.report(errors.New("casq: shutdown timeout; job abandoned without ack"), h.job)
			}
			r.waiting = nil
			if r.sess != nil {
				// Give outstanding replies a moment, then give up.
				for id := range r.sess.pending {
					delete(r.sess.pending, id)
				}
			}
		case <-reconnectC:
			err := r.open(ctx, addr)
			if err == nil {
				failures = 0
				continue
			}
			e := toError(err, nil)
			if fatal(e.Code) {
				return e
			}
			r.report(e, nil)
			delay := time.Duration(0)
			if e.LeaderAddress != "" {
				addr = e.LeaderAddress
				r.c.prefer(addr)
			} else {
				addr = r.c.next(addr)
				delay = r.c.backoff(failures)
				failures++
			}
			reconnect.Reset(delay)
		case ev := <-events:
			r.event(ev, stopping)
		case err := <-ended:
			e := toError(err, r.sess.stream.Trailer())
			draining := r.sess.draining
			r.dropSession()
			if stopping {
				continue
			}
			if err == nil || errors.Is(err, io.EOF) {
				reconnect.Reset(0)
				continue
			}
			if fatal(e.Code) {
				return e
			}
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
		case <-hb:
			r.heartbeat()
		case res := <-r.done:
			r.finished(res, stopping)
		}
		if !stopping {
			r.startWaiting()
		}
	}
}

// open starts a session on addr and waits for Opened.
func (r *run) open(ctx context.Context, addr string) error {
	conn, err := r.c.conn(addr)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(r.c.outgoing(context.WithoutCancel(ctx)))
	stream, err := casqv1.NewQueueServiceClient(conn).Work(sctx)
	if err != nil {
		cancel()
		return err
	}
	open := &casqv1.WorkOpen{
		Queue: r.queue, Subscription: r.cfg.subscription, WorkerId: r.cfg.workerID,
		Credits: uint32(max(r.cfg.prefetch-len(r.jobs), 0)),
	}
	if r.cfg.leaseTTL > 0 {
		open.LeaseTtl = durationpb.New(r.cfg.leaseTTL)
	}
	if err := stream.Send(&casqv1.WorkRequest{Command: &casqv1.WorkRequest_Open{Open: open}}); err != nil {
		_, rerr := stream.Recv()
		cancel()
		if rerr != nil {
			return toError(rerr, stream.Trailer())
		}
		return err
	}
	timer := time.AfterFunc(r.c.opts.Timeout, cancel)
	first, err := stream.Recv()
	timer.Stop()
	if err != nil {
		cancel()
		return toError(err, stream.Trailer())
	}
	opened := first.GetOpened()
	if opened == nil {
		cancel()
		return &Error{Code: codes.Internal, Message: "casq: first Work response is not opened"}
	}
	interval := opened.GetHeartbeatInterval().AsDuration()
	if interval <= 0 {
		interval = 10 * time.Second
	}
	s := &session{
		stream: stream, cancel: cancel,
		events: make(chan *casqv1.WorkResponse), ended: make(chan error, 1),
		pending: map[uint64]pendingReq{}, hb: time.NewTicker(interval),
	}
	r.c.prefer(addr)
	go func() {
		for {
			ev, err := stream.Recv()
			if err != nil {
				s.ended <- err
				return
			}
			select {
			case s.events <- ev:
			case <-sctx.Done():
				s.ended <- sctx.Err()
				return
			}
		}
	}()
	r.sess = s
	// Settlements that finished while disconnected were re-sent by unary
	// calls already; jobs still held get heartbeats on this stream.
	return nil
}

// dropSession forgets a broken session; its unanswered requests are re-sent
// as unary calls.
func (r *run) dropSession() {
	s := r.sess
	if s == nil {
		return
	}
	r.sess = nil
	s.hb.Stop()
	s.cancel()
	for _, p := range s.pending {
		r.unarySettle(p)
	}
}

func (r *run) closeSession() {
	if r.sess != nil {
		r.sess.hb.Stop()
		r.sess.cancel()
		r.sess = nil
	}
}

// finishSession half-closes and waits (briefly) for the broker's OK.
func (r *run) finishSession() {
	s := r.sess
	if s == nil {
		return
	}
	_ = s.stream.CloseSend()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case ev := <-s.events:
			if job := ev.GetJob(); job != nil {
				// Not expected after a half-close: give it back.
				r.unarySettle(pendingReq{receipts: []string{job.GetReceipt()}, nack: &casqv1.WorkNack{Delay: durationpb.New(0), Reason: "worker stopping"}})
			}
		case <-s.ended:
			r.closeSession()
			return
		case <-t.C:
			r.closeSession()
			return
		}
	}
}

func (r *run) send(req *casqv1.WorkRequest, p *pendingReq) {
	if r.sess == nil {
		if p != nil {
			r.unarySettle(*p)
		}
		return
	}
	if p != nil {
		r.nextID++
		req.RequestId = r.nextID
		r.sess.pending[req.RequestId] = *p
	}
	if err := r.sess.stream.Send(req); err != nil {
		// The receive goroutine reports the stream's end; pending requests
		// are re-sent then.
		return
	}
}

func (r *run) credit(n int) {
	if n <= 0 || r.sess == nil || r.sess.draining {
		return
	}
	r.send(&casqv1.WorkRequest{Command: &casqv1.WorkRequest_Credit{Credit: &casqv1.WorkCredit{Credits: uint32(n)}}}, nil)
}

func (r *run) settle(p pendingReq) {
	if p.ack {
		r.send(&casqv1.WorkRequest{Command: &casqv1.WorkRequest_Ack{Ack: &casqv1.WorkAck{Receipts: p.receipts}}}, &p)
		return
	}
	n := &casqv1.WorkNack{Receipts: p.receipts, Delay: p.nack.GetDelay(), DeadLetter: p.nack.GetDeadLetter(), Reason: p.nack.GetReason()}
	r.send(&casqv1.WorkRequest{Command: &casqv1.WorkRequest_Nack{Nack: n}}, &p)
}

// unarySettle re-sends an ack or nack as the unary RPC (with redirects and
// failover).
func (r *run) unarySettle(p pendingReq) {
	if p.receipts == nil {
		return // a heartbeat: the next one will do
	}
	r.unary.Add(1)
	go func() {
		defer r.unary.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 30*time.Second)
		defer cancel()
		err := r.c.call(ctx, func(ctx context.Context, qs casqv1.QueueServiceClient, _ casqv1.AdminServiceClient, o ...grpc.CallOption) error {
			if p.ack {
				_, err := qs.Ack(ctx, &casqv1.AckRequest{Queue: r.queue, Subscription: r.cfg.subscription, Receipts: p.receipts}, o...)
				return err
			}
			_, err := qs.Nack(ctx, &casqv1.NackRequest{Queue: r.queue, Subscription: r.cfg.subscription, Receipts: p.receipts,
				Delay: p.nack.GetDelay(), DeadLetter: p.nack.GetDeadLetter(), Reason: p.nack.GetReason()}, o...)
			return err
		})
		r.report(err, nil)
	}()
}

func (r *run) event(ev *casqv1.WorkResponse, stopping bool) {
	switch e := ev.GetEvent().(type) {
	case *casqv1.WorkResponse_Job:
		job := toJob(e.Job)
		if stopping {
			r.settle(pendingReq{receipts: []string{job.Receipt}, nack: &casqv1.WorkNack{Delay: durationpb.New(0), Reason: "worker stopping"}})
			return
		}
		r.jobs[job.Receipt] = &held{job: job}
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
		delete(r.sess.pending, ev.GetRequestId())
		for _, a := range ev.GetAcked().GetResults() {
			if a.GetOutcome() == casqv1.AckOutcome_ACK_OUTCOME_LEASE_LOST {
				r.report(fmt.Errorf("casq: ack of %s: lease lost", a.GetReceipt()), nil)
			}
		}
	case *casqv1.WorkResponse_RequestFailed:
		p, ok := r.sess.pending[ev.GetRequestId()]
		delete(r.sess.pending, ev.GetRequestId())
		err := statusError(e.RequestFailed.GetStatus())
		if ok && (err.LeaderAddress != "" || err.Code == codes.Unavailable) {
			r.unarySettle(p)
		} else {
			r.report(err, nil)
		}
	case *casqv1.WorkResponse_Draining:
		r.sess.draining = true
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
		r.settle(pendingReq{ack: true, receipts: []string{res.receipt}})
	} else {
		r.report(res.err, h.job)
		r.settle(pendingReq{receipts: []string{res.receipt}, nack: &casqv1.WorkNack{
			DeadLetter: errors.Is(res.err, ErrDeadLetter), Reason: reason(res.err)}})
	}
	if !stopping {
		r.credit(1)
	}
}

// handBack nacks the jobs that arrived but had not started.
func (r *run) handBack() {
	var receipts []string
	for _, receipt := range r.waiting {
		if h, ok := r.jobs[receipt]; ok && !h.started {
			receipts = append(receipts, receipt)
			delete(r.jobs, receipt)
		}
	}
	r.waiting = nil
	if len(receipts) > 0 {
		r.settle(pendingReq{receipts: receipts, nack: &casqv1.WorkNack{Delay: durationpb.New(0), Reason: "worker stopping"}})
	}
}

func (r *run) heartbeat() {
	var receipts []string
	for receipt := range r.jobs {
		receipts = append(receipts, receipt)
	}
	for len(receipts) > 0 {
		n := min(len(receipts), 100)
		r.send(&casqv1.WorkRequest{Command: &casqv1.WorkRequest_Heartbeat{Heartbeat: &casqv1.WorkHeartbeat{Receipts: receipts[:n]}}}, &pendingReq{})
		receipts = receipts[n:]
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
