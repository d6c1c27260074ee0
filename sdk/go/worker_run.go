package casq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	otelcodes "go.opentelemetry.io/otel/codes"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// The state of one Worker.Run: its event loop, handler slots, settling and heartbeats.

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
	// within each open stream's credit window across reconnects.
	owner *session
	// beating is set while a unary heartbeat of the job is in flight.
	beating bool
	// lost is set once the worker learned that it no longer holds the
	// lease: the handler's context is cancelled and heartbeats stop.
	lost bool
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
	// jobs are the jobs of receipts (same order), for the reports of what
	// the broker answered and to resend it by shard (see unarySettle); nil
	// for heartbeats.
	jobs []*Job
	// sent is when it went on the stream: unanswered for Options.Timeout, it
	// marks the stream as hung (see hungSessions).
	sent time.Time
	// lossReported: the settle of a job whose lost lease was already
	// reported; a LEASE_LOST answer to it is not reported a second time.
	lossReported bool
}

// session is one Work stream to one broker. A run keeps at most one session
// per broker address: the primary (the broker the client prefers; it
// reconnects with backoff and follows redirects) and secondaries, one per
// leader of shards that no open session serves.
type session struct {
	addr    string
	primary bool
	credits uint32 // asked for in Open
	// win is the stream's credit window (jobs held plus credit outstanding).
	win *creditWindow
	// adopting: jobs of lost streams counted as held in win at open, to be
	// adopted once it is open (see activate).
	adopting int
	ctx      context.Context
	cancel   context.CancelFunc
	stream   grpc.BidiStreamingClient[casqv1.WorkRequest, casqv1.WorkResponse] // set once open
	// out queues the requests for the stream's sender goroutine (see
	// sendLoop), set once open; closed by the half-close.
	out chan *casqv1.WorkRequest
	// brokenBy is set when the worker gives the stream up because its
	// broker reads no more of it (see send): it is cancelled, and its end
	// is reported with this error.
	brokenBy *Error

	open       bool // Opened received (false while the handshake runs)
	gone       bool // dropped or closed: nothing more is sent on it
	halfClosed bool
	draining   bool
	pending    map[uint64]pendingReq
	serving    map[uint32]bool // routing.serving_shards
}

// inboxMsg is what a session's receive goroutine hands the run loop: an
// event, or (ev nil) the stream's end.
type inboxMsg struct {
	s   *session
	ev  *casqv1.WorkResponse
	err error
}

// beatResult is the outcome of a unary heartbeat: the receipts it carried and
// those the broker answered LOST.
type beatResult struct {
	receipts []string
	lost     []string
	err      error
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
	window  windowBounds // of each stream's credit window
	handler Handler

	jobs    map[string]*held
	waiting []string // receipts held but not started, in arrival order
	running int
	done    chan result
	// acks are the acks of the results handled in this turn of the loop, by
	// stream: sent together once the results that are in have been handled;
	// then regrant's streams get the credit those jobs gave back.
	acks    map[*session]*pendingReq
	regrant map[*session]struct{}
	nextID  uint64

	sessions map[string]*session // open or opening, by broker address
	primary  *session            // open or opening; nil while reconnecting
	inbox    chan inboxMsg
	opens    chan openResult
	beats    chan beatResult
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

	unary   sync.WaitGroup
	senders sync.WaitGroup // the sessions' sendLoops
	tracer  trace.Tracer
}

// report logs a failure that does not end Run (at Warn) and hands it to the
// error handler.
func (r *run) report(err error, job *Job) {
	if err == nil {
		return
	}
	r.log(slog.LevelWarn, "casq worker: "+err.Error(), err, job)
	if r.cfg.onError != nil {
		r.cfg.onError(err, job)
	}
}

// handlerFailed reports a handler's error or panic, saying what happens to
// the job next: retried (Warn) or dead-lettered (Error).
func (r *run) handlerFailed(err error, job *Job) {
	dead := errors.Is(err, ErrDeadLetter) || (job.MaxAttempts > 0 && job.Attempt >= job.MaxAttempts)
	attempts := fmt.Sprintf("attempt %d", job.Attempt)
	if job.MaxAttempts > 0 {
		attempts = fmt.Sprintf("attempt %d of %d", job.Attempt, job.MaxAttempts)
	}
	level, next := slog.LevelWarn, "it will be retried"
	if dead {
		level, next = slog.LevelError, "it is dead-lettered"
	}
	r.log(level, fmt.Sprintf("casq worker: job %s of queue %s failed (%s), %s: %v", job.ID, r.queue, attempts, next, err), err, job)
	if r.cfg.onError != nil {
		r.cfg.onError(err, job)
	}
}

func (r *run) log(level slog.Level, msg string, err error, job *Job) {
	if r.cfg.logger == nil {
		return
	}
	attrs := []slog.Attr{slog.String("queue", r.queue), slog.String("error", err.Error())}
	if job != nil {
		attrs = append(attrs, slog.String("job_id", job.ID), slog.Int64("attempt", int64(job.Attempt)))
	}
	r.cfg.logger.LogAttrs(context.Background(), level, msg, attrs...)
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
	// Stream requests are checked for a late answer a few times per Timeout.
	watchdog := time.NewTicker(min(max(r.c.opts.Timeout/4, 50*time.Millisecond), time.Second))
	defer func() {
		watchdog.Stop()
		if abandonAfter != nil {
			abandonAfter.Stop()
		}
		if r.hb != nil {
			r.hb.Stop()
		}
		stopLookups()
		close(r.quit)
		r.closeAll()
		r.senders.Wait()
		r.stopHandlers()
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
					// The shards the lost primary served may have their
					// leader back at the same address: no routing event
					// would ask for it (an opening s reconciles once open).
					r.reconcileStreams()
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
			// half-close it at once (activate does), so that it sends no job.
			s.halfClosed = stopping
			r.activate(s, res)
			if s.primary {
				failures = 0
				r.c.prefer(s.addr)
			}
			if !stopping {
				r.reconcileStreams()
			}
		case m := <-r.inbox:
			s := m.s
			switch {
			case s.gone:
				// Sent before the session was dropped. A job still arrives
				// leased to this worker: give it back rather than let its
				// lease run out.
				if jobs := claimedJobs(m.ev); len(jobs) > 0 {
					r.unarySettle(giveBack(jobs...))
				}
			case m.ev != nil:
				r.event(s, m.ev, stopping)
			default:
				e := toError(m.err, s.stream.Trailer())
				if s.brokenBy != nil {
					// Cancelled by the worker: say why.
					e, m.err = s.brokenBy, s.brokenBy
				}
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
		case now := <-watchdog.C:
			for _, s := range r.hungSessions(now) {
				// Given up like a broken stream; the unary resends and the
				// reconnect start at the next broker.
				err := &StreamTimeoutError{Broker: s.addr, Timeout: r.c.opts.Timeout}
				r.report(err, nil)
				if r.c.current() == s.addr {
					r.c.next(s.addr)
				}
				r.dropSession(s)
				switch {
				case stopping:
				case !s.primary:
					r.secondaryLost(s.addr, toError(err, nil), nil)
				default:
					addr = r.c.current()
					reconnect.Reset(r.c.backoff(failures))
					failures++
				}
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
		case b := <-r.beats:
			r.heartbeated(b)
		case res := <-r.done:
			r.finished(res, stopping)
			// Handlers that finished meanwhile: their acks go in the same requests.
			for more := true; more; {
				select {
				case res := <-r.done:
					r.finished(res, stopping)
				default:
					more = false
				}
			}
			r.flushAcks()
		}
		if !stopping {
			r.startWaiting()
		}
	}
}

// stopHandlers cancels the handlers still running as Run returns early (a
// fatal error; a graceful stop has none left) and waits for them to return,
// at most the shutdown timeout. Their jobs are not settled (the broker
// refused the stream for good): their leases run out.
func (r *run) stopHandlers() {
	running := 0
	for _, h := range r.jobs {
		if h.started {
			h.cancel()
			running++
		}
	}
	if running == 0 {
		return
	}
	t := time.NewTimer(r.cfg.shutdownTimeout)
	defer t.Stop()
	for running > 0 {
		select {
		case res := <-r.done:
			if _, ok := r.jobs[res.receipt]; ok {
				delete(r.jobs, res.receipt)
				running--
			}
		case <-t.C:
			for _, h := range r.jobs {
				if h.started {
					r.report(errors.New("casq: handler still running as Run returned; job abandoned without ack"), h.job)
				}
			}
			return
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

// hungSessions returns the open sessions with a request unanswered for
// longer than Options.Timeout. (The handshake has a deadline of its own.)
func (r *run) hungSessions(now time.Time) []*session {
	var out []*session
	for _, s := range r.sessions {
		if !s.open || s.gone {
			continue
		}
		for _, p := range s.pending {
			if now.Sub(p.sent) > r.c.opts.Timeout {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// claimedJobs returns the jobs a job or jobs event carries (none for other events).
func claimedJobs(ev *casqv1.WorkResponse) []*Job {
	if job := ev.GetJob(); job != nil {
		return []*Job{toJob(job)}
	}
	claimed := ev.GetJobs().GetJobs()
	jobs := make([]*Job, len(claimed))
	for i, c := range claimed {
		jobs[i] = toJob(c)
	}
	return jobs
}

// event handles one message of session s.
func (r *run) event(s *session, ev *casqv1.WorkResponse, stopping bool) {
	switch e := ev.GetEvent().(type) {
	case *casqv1.WorkResponse_Job, *casqv1.WorkResponse_Jobs:
		jobs := claimedJobs(ev)
		if stopping {
			r.settle(s, giveBack(jobs...))
			return
		}
		for _, job := range jobs {
			s.win.arrived()
			r.jobs[job.Receipt] = &held{job: job, from: s, owner: s}
			r.waiting = append(r.waiting, job.Receipt)
		}
		// A window that grew, or waited for the broker's max_credits, grants now.
		r.grant(s)
	case *casqv1.WorkResponse_LeasesLost:
		r.leasesLost(e.LeasesLost.GetReceipts(), e.LeasesLost.GetReason())
	case *casqv1.WorkResponse_Acked, *casqv1.WorkResponse_Nacked, *casqv1.WorkResponse_Heartbeated:
		if p, ok := s.pending[ev.GetRequestId()]; ok && p.kind != reqHeartbeat {
			r.checkSettled(p, ev.GetAcked().GetResults(), ev.GetNacked().GetResults())
		}
		delete(s.pending, ev.GetRequestId())
		var lost []string
		for _, x := range ev.GetHeartbeated().GetResults() {
			if x.GetOutcome() == casqv1.HeartbeatOutcome_HEARTBEAT_OUTCOME_LOST {
				lost = append(lost, x.GetReceipt())
			}
		}
		r.leasesLost(lost, "lease lost (found by a heartbeat)")
	case *casqv1.WorkResponse_RequestFailed:
		p, ok := s.pending[ev.GetRequestId()]
		delete(s.pending, ev.GetRequestId())
		err := statusError(e.RequestFailed.GetStatus())
		if ok && (err.LeaderAddress != "" || err.Code == codes.Unavailable) {
			r.unarySettle(p)
		} else {
			r.reportFailed(p, err)
		}
	case *casqv1.WorkResponse_Draining:
		// Its jobs still settle on it; its shards need a stream to their
		// new leader, which routing may have named already.
		s.draining = true
		if !stopping {
			r.reconcileStreams()
		}
	case *casqv1.WorkResponse_Routing:
		r.applyRouting(s, e.Routing)
		if !stopping {
			r.reconcileStreams()
		}
	}
}

// leasesLost cancels the handlers of jobs whose lease the worker no longer
// holds, and reports each loss once. Receipts of jobs already settled are
// ignored: a heartbeat answered after the job's ack finds its lease gone.
//
// A job that had not started is dropped: another worker may hold it now, so
// it never starts and is not settled (as in the TypeScript and Python SDKs),
// and its credit goes back to its stream at once.
func (r *run) leasesLost(receipts []string, reason string) {
	dropped := false
	for _, receipt := range receipts {
		h, ok := r.jobs[receipt]
		if !ok || h.lost {
			continue
		}
		h.lost = true
		if h.started {
			h.cancel()
		} else {
			delete(r.jobs, receipt)
			r.creditBack(h)
			dropped = true
		}
		r.report(&LeaseLostError{Op: "heartbeat", JobID: h.job.ID, Queue: r.queue, Attempt: h.job.Attempt, Receipt: receipt, Reason: reason}, h.job)
	}
	if dropped {
		// startWaiting would skip them, but the credit windows measure the
		// jobs buffered by len(r.waiting).
		r.waiting = slices.DeleteFunc(r.waiting, func(receipt string) bool { return r.jobs[receipt] == nil })
		r.grantReturned()
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
		for _, s := range r.sessions {
			if s.win != nil {
				s.win.noteStarted(len(r.waiting))
			}
		}
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
	if r.running < r.cfg.concurrency {
		// The handlers are starved: every stream's window hears of it.
		for _, s := range r.sessions {
			if s.win != nil {
				s.win.noteStarved()
			}
		}
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
	if res.err == nil && !h.lost {
		r.gatherAck(h.from, res.receipt, h.job)
	} else if res.err == nil {
		r.settle(h.from, pendingReq{kind: reqAck, receipts: []string{res.receipt}, jobs: []*Job{h.job}, lossReported: true})
	} else {
		if !h.lost || !errors.Is(res.err, context.Canceled) {
			// (A handler that stopped because its lease was lost: that
			// loss was reported.)
			r.handlerFailed(res.err, h.job)
		}
		r.settle(h.from, pendingReq{kind: reqNack, receipts: []string{res.receipt}, jobs: []*Job{h.job}, lossReported: h.lost, nack: &casqv1.WorkNack{
			DeadLetter: errors.Is(res.err, ErrDeadLetter), Reason: reason(res.err)}})
	}
	if !stopping {
		// Granted after the acks of this turn (flushAcks): credit plus unsettled jobs stay within the window.
		r.creditBack(h)
	}
}

// creditBack gives the credit of a job the worker no longer holds back to
// the stream that owns it; grantReturned grants it.
func (r *run) creditBack(h *held) {
	if h.owner == nil || h.owner.gone {
		return
	}
	h.owner.win.returned()
	if r.regrant == nil {
		r.regrant = map[*session]struct{}{}
	}
	r.regrant[h.owner] = struct{}{}
}

// grantReturned grants the streams the credit given back to them.
func (r *run) grantReturned() {
	for s := range r.regrant {
		r.grant(s)
	}
	clear(r.regrant)
}

// ackBatch is the most receipts in one ack request (as the TypeScript and
// Python SDKs; within the broker's default max_batch of 1000).
const ackBatch = 500

// gatherAck adds the ack of a finished job to its stream's batch of this
// turn of the loop (see flushAcks).
func (r *run) gatherAck(s *session, receipt string, job *Job) {
	if r.acks == nil {
		r.acks = map[*session]*pendingReq{}
	}
	p := r.acks[s]
	if p == nil {
		p = &pendingReq{kind: reqAck}
		r.acks[s] = p
	}
	p.receipts = append(p.receipts, receipt)
	p.jobs = append(p.jobs, job)
}

// flushAcks sends the acks gathered this turn: one request of up to ackBatch
// receipts per stream instead of one per job (by unary call for a stream
// that is gone, as any settle); then the credit the finished jobs gave back.
func (r *run) flushAcks() {
	for s, p := range r.acks {
		for len(p.receipts) > 0 {
			n := min(len(p.receipts), ackBatch)
			r.settle(s, pendingReq{kind: reqAck, receipts: p.receipts[:n], jobs: p.jobs[:n]})
			p.receipts, p.jobs = p.receipts[n:], p.jobs[n:]
		}
		delete(r.acks, s)
	}
	r.grantReturned()
}

// handBack nacks the jobs that arrived but had not started, each on the
// stream it came from.
func (r *run) handBack() {
	bySession := map[*session][]*Job{}
	for _, receipt := range r.waiting {
		if h, ok := r.jobs[receipt]; ok && !h.started {
			bySession[h.from] = append(bySession[h.from], h.job)
			delete(r.jobs, receipt)
		}
	}
	r.waiting = nil
	for s, jobs := range bySession {
		for len(jobs) > 0 {
			n := min(len(jobs), 100)
			r.settle(s, giveBack(jobs[:n]...))
			jobs = jobs[n:]
		}
	}
}

// heartbeat keeps every held job's lease alive, on the stream it came from
// (by unary calls for the jobs of lost streams).
func (r *run) heartbeat() {
	bySession := map[*session][]string{}
	for receipt, h := range r.jobs {
		if !h.lost {
			bySession[h.from] = append(bySession[h.from], receipt)
		}
	}
	for s, receipts := range bySession {
		for len(receipts) > 0 {
			n := min(len(receipts), 100)
			r.settle(s, pendingReq{kind: reqHeartbeat, receipts: receipts[:n]})
			receipts = receipts[n:]
		}
	}
}
