package casq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The Work streams of one run: one per shard leader (a primary that reconnects,
// secondaries opened from routing), their handshakes, credits and settling.

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
		win:     newCreditWindow(r.window, maxCreditsDefault, time.Now),
		pending: map[uint64]pendingReq{}, serving: map[uint32]bool{},
	}
	// The jobs of lost streams it will adopt use part of its window.
	s.adopting = min(orphans, s.win.size)
	s.win.adopt(s.adopting)
	s.credits = uint32(s.win.takeGrant())
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
		BatchedJobs: true,
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
// the jobs of lost streams, and its send and receive goroutines.
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
	if m := res.opened.GetMaxCredits(); m > 0 {
		s.win.maxOutstanding = int(m)
	}
	// Open counted the orphans there were then as held; adopt that many
	// now, and give back the credit of those that finished meanwhile.
	want := s.adopting
	for _, h := range r.jobs {
		if want == 0 {
			break
		}
		if h.owner == nil {
			h.owner = s
			want--
		}
	}
	for ; want > 0; want-- {
		s.win.returned()
	}
	s.adopting = 0
	s.out = make(chan *casqv1.WorkRequest, 2*s.win.max+sendQueueSlack)
	r.senders.Add(1)
	go r.sendLoop(s)
	if s.halfClosed {
		close(s.out)
	}
	r.grant(s)
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
// r.reconcile for what is not due yet. A draining session serves nothing:
// it gets no more jobs (as in the TypeScript SDK), so the new leader of its
// shards gets a stream at once rather than once it ends.
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
		if s.open && !s.draining {
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
			// After the requests queued before it.
			s.halfClosed = true
			close(s.out)
		}
		live++
	}
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	for live > 0 {
		select {
		case m := <-r.inbox:
			if jobs := claimedJobs(m.ev); len(jobs) > 0 {
				// Not expected after a half-close: give them back.
				r.unarySettle(giveBack(jobs...))
			}
			if m.s.gone || m.ev != nil {
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

func giveBack(jobs ...*Job) pendingReq {
	receipts := make([]string, len(jobs))
	for i, j := range jobs {
		receipts[i] = j.Receipt
	}
	// A release: claimable again at once, and the delivery does not count as an attempt.
	return pendingReq{kind: reqNack, receipts: receipts, jobs: jobs, nack: &casqv1.WorkNack{Release: true, Reason: "worker stopping"}}
}

// sendQueueSlack is the room in a stream's send queue beyond two requests
// (a settle and a credit) per job its window can hold: heartbeats and the
// like.
const sendQueueSlack = 256

// send queues req for s's sender, or (p given) re-sends it as a unary call
// when s can no longer carry it. It never blocks: a broker that stops
// reading (a frozen process, a full flow-control window) would block a gRPC
// Send, and with it the loop's timers, the other streams and the handlers.
func (r *run) send(s *session, req *casqv1.WorkRequest, p *pendingReq) {
	if s == nil || s.gone || !s.open || s.halfClosed || s.brokenBy != nil {
		if p != nil {
			r.unarySettle(*p)
		}
		return
	}
	if p != nil {
		r.nextID++
		req.RequestId = r.nextID
		p.sent = time.Now()
		s.pending[req.RequestId] = *p
	}
	select {
	case s.out <- req:
	default:
		// Its broker left a full queue unread: given up as a broken stream.
		// Cancelled, it ends; the receive goroutine reports that, and the
		// pending requests (this one too) are re-sent then, by unary calls
		// that start at the next broker (as after a StreamTimeoutError).
		s.brokenBy = &Error{Code: codes.Unavailable, Message: fmt.Sprintf(
			"casq: broker %s left %d Work stream requests unread (hung?): stream ended, going elsewhere", s.addr, cap(s.out))}
		s.cancel()
		if r.c.current() == s.addr {
			r.c.next(s.addr)
		}
	}
}

// sendLoop sends the requests queued on s.out in order, on a goroutine of
// its own (see send); the half-close follows the requests queued before it.
// It returns at the half-close or once s is cancelled (which also ends a
// Send that blocks), so it never outlives its session. A Send that fails
// ends the stream, and the receive goroutine reports the end; the requests
// queued meanwhile are dropped (pending ones are re-sent then).
func (r *run) sendLoop(s *session) {
	defer r.senders.Done()
	failed := false
	for {
		select {
		case req, ok := <-s.out:
			switch {
			case !ok:
				if !failed {
					_ = s.stream.CloseSend()
				}
				return
			case !failed:
				failed = s.stream.Send(req) != nil
			}
		case <-s.ctx.Done():
			return
		}
	}
}

// maxCreditsDefault is the most credit a stream may have outstanding until
// Opened says (the protocol's max_credits).
const maxCreditsDefault = 1000

// grant sends s the credit its window allows now, if any.
func (r *run) grant(s *session) {
	if s == nil || s.gone || !s.open || s.halfClosed || s.draining || s.brokenBy != nil {
		return
	}
	n := s.win.takeGrant()
	if n <= 0 {
		return
	}
	r.send(s, &casqv1.WorkRequest{Command: &casqv1.WorkRequest_Credit{Credit: &casqv1.WorkCredit{Credits: uint32(n)}}}, nil)
}

func (r *run) settle(s *session, p pendingReq) {
	switch p.kind {
	case reqAck:
		r.send(s, &casqv1.WorkRequest{Command: &casqv1.WorkRequest_Ack{Ack: &casqv1.WorkAck{Receipts: p.receipts}}}, &p)
	case reqNack:
		n := &casqv1.WorkNack{Receipts: p.receipts, Delay: p.nack.GetDelay(), DeadLetter: p.nack.GetDeadLetter(), Reason: p.nack.GetReason(), Release: p.nack.GetRelease()}
		r.send(s, &casqv1.WorkRequest{Command: &casqv1.WorkRequest_Nack{Nack: n}}, &p)
	case reqHeartbeat:
		r.send(s, &casqv1.WorkRequest{Command: &casqv1.WorkRequest_Heartbeat{Heartbeat: &casqv1.WorkHeartbeat{Receipts: p.receipts}}}, &p)
	}
}

// unarySettle re-sends an ack, nack or heartbeat as the unary RPC (with
// redirects and failover). An ack whose delivery was no longer current is
// reported, as on a stream.
//
// An ack or nack goes in one call per shard of its jobs (as in the
// TypeScript SDK), and so does a heartbeat (see unaryHeartbeat): a broker
// applies the receipts of the shards it leads and answers the call with a
// redirect for the others, so one call over shards of two leaders would
// bounce between them until it gives up, and every job of it would be
// reported unsettled.
func (r *run) unarySettle(p pendingReq) {
	if len(p.receipts) == 0 {
		return
	}
	if p.kind == reqHeartbeat {
		r.unaryHeartbeat(p.receipts)
		return
	}
	for _, part := range byShard(p) {
		r.unarySettlePart(part)
	}
}

// byShard splits an ack or nack into one request per shard of its jobs,
// each in the order of p.
func byShard(p pendingReq) []pendingReq {
	var parts []pendingReq
	index := map[uint32]int{}
	for i, receipt := range p.receipts {
		job := p.jobs[i]
		k, ok := index[job.Shard]
		if !ok {
			k = len(parts)
			index[job.Shard] = k
			part := p
			part.receipts, part.jobs = nil, nil
			parts = append(parts, part)
		}
		parts[k].receipts = append(parts[k].receipts, receipt)
		parts[k].jobs = append(parts[k].jobs, job)
	}
	return parts
}

// unarySettlePart sends the ack or nack of one shard's receipts by the unary
// RPC, in the background, and checks the outcome of each.
func (r *run) unarySettlePart(p pendingReq) {
	r.unary.Add(1)
	go func() {
		defer r.unary.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 30*time.Second)
		defer cancel()
		var acks []*casqv1.AckResult
		var nacks []*casqv1.NackResult
		err := r.c.call(ctx, func(ctx context.Context, qs casqv1.QueueServiceClient, _ casqv1.AdminServiceClient, o ...grpc.CallOption) error {
			if p.kind == reqAck {
				res, err := qs.Ack(ctx, &casqv1.AckRequest{Queue: r.queue, Subscription: r.cfg.subscription, Receipts: p.receipts}, o...)
				acks = res.GetResults()
				return err
			}
			res, err := qs.Nack(ctx, &casqv1.NackRequest{Queue: r.queue, Subscription: r.cfg.subscription, Receipts: p.receipts,
				Delay: p.nack.GetDelay(), DeadLetter: p.nack.GetDeadLetter(), Reason: p.nack.GetReason(), Release: p.nack.GetRelease()}, o...)
			nacks = res.GetResults()
			return err
		})
		if err != nil {
			r.reportFailed(p, err)
			return
		}
		r.checkSettled(p, acks, nacks)
	}()
}

// reportFailed reports an ack or nack that failed as a whole, once per job
// it carried (once with no job when none is known): not settled, the jobs'
// leases run out and they are delivered again.
func (r *run) reportFailed(p pendingReq, err error) {
	reported := false
	for _, j := range p.jobs {
		if j != nil {
			r.report(err, j)
			reported = true
		}
	}
	if !reported {
		r.report(err, nil)
	}
}

// checkSettled reports each receipt of an ack or nack that did not do what
// the worker asked: a *LeaseLostError for LEASE_LOST, an UNKNOWN *Error for
// a receipt the broker gave no known outcome for. ALREADY_ACKED (an ack
// retried after a lost answer) is a success.
func (r *run) checkSettled(p pendingReq, acks []*casqv1.AckResult, nacks []*casqv1.NackResult) {
	op := "ack"
	if p.kind == reqNack {
		op = "nack"
	}
	type outcome struct{ ok, lost bool }
	got := map[string]outcome{}
	for _, a := range acks {
		o := a.GetOutcome()
		got[a.GetReceipt()] = outcome{
			ok:   o == casqv1.AckOutcome_ACK_OUTCOME_ACKED || o == casqv1.AckOutcome_ACK_OUTCOME_ALREADY_ACKED,
			lost: o == casqv1.AckOutcome_ACK_OUTCOME_LEASE_LOST,
		}
	}
	for _, n := range nacks {
		o := n.GetOutcome()
		got[n.GetReceipt()] = outcome{
			ok:   o == casqv1.NackOutcome_NACK_OUTCOME_RETRY_SCHEDULED || o == casqv1.NackOutcome_NACK_OUTCOME_DEAD_LETTERED,
			lost: o == casqv1.NackOutcome_NACK_OUTCOME_LEASE_LOST,
		}
	}
	for i, receipt := range p.receipts {
		var job *Job
		if i < len(p.jobs) {
			job = p.jobs[i]
		}
		o, found := got[receipt]
		switch {
		case o.ok:
		case o.lost && p.lossReported:
			// The loss was reported when the worker learnt of it.
		case o.lost:
			e := &LeaseLostError{Op: op, Queue: r.queue, Receipt: receipt,
				Reason: "its lease was lost (the message was delivered again or dead-lettered meanwhile)"}
			if job != nil {
				e.JobID, e.Attempt = job.ID, job.Attempt
			}
			r.report(e, job)
		case found:
			r.report(&Error{Code: codes.Unknown, Message: fmt.Sprintf("%s of receipt %s got an unknown outcome", op, receipt)}, job)
		default:
			r.report(&Error{Code: codes.Unknown, Message: fmt.Sprintf("%s of receipt %s got no outcome", op, receipt)}, job)
		}
	}
}

// unaryHeartbeat heartbeats, by the unary RPC, the jobs whose stream is
// gone. At most one call per job is in flight, so that a broker that does
// not answer does not pile them up; the outcome goes back to the loop (see
// heartbeated), which cancels the handlers of the leases found lost.
//
// It goes in one call per shard of the jobs, as acks and nacks do (see
// unarySettle): a broker heartbeats the receipts of the shards it leads and
// redirects for the others, so one call over shards of two leaders would
// bounce between them and extend no lease. The split is made here, on the
// loop, which owns r.jobs.
func (r *run) unaryHeartbeat(receipts []string) {
	var parts [][]string
	index := map[uint32]int{}
	for _, receipt := range receipts {
		h, ok := r.jobs[receipt]
		if !ok || h.beating || h.lost {
			continue
		}
		h.beating = true
		k, seen := index[h.job.Shard]
		if !seen {
			k = len(parts)
			index[h.job.Shard] = k
			parts = append(parts, nil)
		}
		parts[k] = append(parts[k], receipt)
	}
	for _, send := range parts {
		r.unaryHeartbeatPart(send)
	}
}

// unaryHeartbeatPart heartbeats one shard's receipts by the unary RPC, in
// the background, and hands the outcome to the loop.
func (r *run) unaryHeartbeatPart(send []string) {
	r.unary.Add(1)
	go func() {
		defer r.unary.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 30*time.Second)
		defer cancel()
		var lost []string
		err := r.c.call(ctx, func(ctx context.Context, qs casqv1.QueueServiceClient, _ casqv1.AdminServiceClient, o ...grpc.CallOption) error {
			res, err := qs.Heartbeat(ctx, &casqv1.HeartbeatRequest{
				Queue: r.queue, Subscription: r.cfg.subscription, WorkerId: r.cfg.workerID, Receipts: send,
			}, o...)
			lost = lost[:0]
			for _, x := range res.GetResults() {
				if x.GetOutcome() == casqv1.HeartbeatOutcome_HEARTBEAT_OUTCOME_LOST {
					lost = append(lost, x.GetReceipt())
				}
			}
			return err
		})
		select {
		case r.beats <- beatResult{receipts: send, lost: lost, err: err}:
		case <-r.quit:
		}
	}()
}

// heartbeated handles the outcome of a unary heartbeat. A missing queue or
// subscription (NOT_FOUND) means every lease of the call is gone.
func (r *run) heartbeated(b beatResult) {
	for _, receipt := range b.receipts {
		if h, ok := r.jobs[receipt]; ok {
			h.beating = false
		}
	}
	switch {
	case b.err == nil:
		r.leasesLost(b.lost, "lease lost (found by a heartbeat)")
	case Code(b.err) == codes.NotFound:
		r.leasesLost(b.receipts, "heartbeat: "+toError(b.err, nil).Message)
	default:
		r.report(b.err, nil)
	}
}
