package casq

import (
	"context"
	"sync"

	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc/codes"
)

// Merging of concurrent Producer.Enqueue calls (see Options.NoEnqueueBatching).
//
// Why: the client's cost of an RPC (HTTP/2, protobuf, a goroutine per call)
// is far above the cost of one more message in a request, and the broker
// commits a batch in one write; 64 goroutines calling Enqueue at once need a
// few RPCs, not 64.
//
// How (group commit, no timer): each queue has a lane. A call joins the
// lane's pending list; while fewer than enqueueLaneFlights requests of the
// lane are in flight, a sender takes everything pending (up to
// EnqueueBatchMaxMessages / EnqueueBatchMaxBytes) and sends it as one
// Enqueue at once. So a lone call goes out immediately, as it would unmerged,
// and calls that come while the lane's requests are in flight wait for the
// next free one and go out together: the batch size follows the load, and no
// call waits longer than one round trip more than it would alone (the broker
// commits one write per shard at a time; two requests in flight keep it
// fed: one being written, one buffered for the next write).
//
// A lane holds either messages that all have a dedup id, or messages that
// have neither dedup id nor key (calls with a key and no dedup id are not
// merged). With dedup ids, a retried or split batch, and the per-message
// resend below, store each message once. Without them, the broker puts every
// message of the request on one shard, so the request is stored all or none:
// it is never resent after it may have landed, and it is resent message by
// message only after a refusal that stored nothing (nothingStoredFault). A
// merged request that fails with an error that may be about one of its
// messages (mayBeOneMessagesFault) is resent as one request per message, so
// that each caller sees the outcome it would have seen alone and one bad
// message does not fail the others; messages with one key go one after
// another, in call order. Other failures (outages after the client's
// retries, a missing queue, auth) are about the request as a whole and reach
// every caller of it.
//
// A merged request runs with none of its callers' contexts (it carries the
// callers' trace context: the call's when they share one, else each message
// its own), within Options.RetryTimeout. A caller whose ctx ends first
// returns ctx's error at once; its message may still be stored, as with any
// call cut short.

// Defaults of Options.EnqueueBatchMaxMessages and EnqueueBatchMaxBytes.
const (
	defaultBatchMessages = 1000 // the broker's most messages per Enqueue
	defaultBatchBytes    = 4 << 20
)

// enqueueLaneFlights is how many merged requests of one queue may be in
// flight at once.
const enqueueLaneFlights = 2

// mayBeOneMessagesFault reports whether a failed Enqueue may be caused by one
// of its messages (a bad field, a payload over a limit, a batch above the
// queue's max_batch, a shard too full for all of them but not for each), or
// by the shard of some of them only (a shard refused as unreadable,
// DATA_LOSS; a fault of one shard's write, INTERNAL) while the other shards
// stored their parts.
func mayBeOneMessagesFault(code codes.Code) bool {
	switch code {
	case codes.InvalidArgument, codes.ResourceExhausted, codes.FailedPrecondition, codes.AlreadyExists, codes.OutOfRange,
		codes.DataLoss, codes.Internal:
		return true
	}
	return false
}

// nothingStoredFault reports whether a failed Enqueue applied on one shard
// stored nothing: mayBeOneMessagesFault's codes but INTERNAL, which does not
// say so. After one of these a merged request without dedup ids is resent
// message by message.
func nothingStoredFault(code codes.Code) bool {
	return code != codes.Internal && mayBeOneMessagesFault(code)
}

// enqueueWaiter is one caller waiting in a lane.
type enqueueWaiter struct {
	msg           *casqv1.NewMessage
	parent, state string // the caller's trace context
	bytes         int
	done          chan enqueueOutcome // buffered: the sender never blocks on a caller that left
}

type enqueueOutcome struct {
	res EnqueueResult
	err error
}

// enqueueLane collects the calls of one queue whose messages have dedup ids,
// or those whose messages have neither dedup id nor key.
type enqueueLane struct {
	queue        string
	deduplicated bool
	pending      []*enqueueWaiter
	flights      int
}

// laneKey names the lane of queue for messages with (or without) dedup ids.
func laneKey(queue string, deduplicated bool) string {
	if deduplicated {
		return "d" + queue
	}
	return "u" + queue
}

// enqueueBatcher holds the lanes of one Client.
type enqueueBatcher struct {
	c        *Client
	maxMsgs  int
	maxBytes int
	mu       sync.Mutex
	lanes    map[string]*enqueueLane
}

func newEnqueueBatcher(c *Client) *enqueueBatcher {
	b := &enqueueBatcher{c: c, maxMsgs: c.opts.EnqueueBatchMaxMessages, maxBytes: c.opts.EnqueueBatchMaxBytes, lanes: map[string]*enqueueLane{}}
	if b.maxMsgs <= 0 || b.maxMsgs > defaultBatchMessages {
		b.maxMsgs = defaultBatchMessages
	}
	if b.maxBytes <= 0 {
		b.maxBytes = defaultBatchBytes
	}
	return b
}

// approxMessageBytes is a message's rough size in a request.
func approxMessageBytes(m *casqv1.NewMessage) int {
	n := 32 + len(m.GetPayload()) + len(m.GetKey()) + len(m.GetDedupId())
	for k, v := range m.GetHeaders() {
		n += len(k) + len(v) + 4
	}
	return n
}

// mergeable reports whether msg may share a merged request: it has a dedup
// id, or neither dedup id nor key (see above).
func mergeable(msg *casqv1.NewMessage) bool {
	return msg.GetDedupId() != "" || msg.GetKey() == ""
}

// enqueue adds msg (mergeable) to its queue's lane and waits for its own
// outcome, or for ctx.
func (b *enqueueBatcher) enqueue(ctx context.Context, queue string, msg *casqv1.NewMessage) (EnqueueResult, error) {
	parent, state := traceHeaders(ctx)
	w := &enqueueWaiter{msg: msg, parent: parent, state: state, bytes: approxMessageBytes(msg), done: make(chan enqueueOutcome, 1)}
	deduplicated := msg.GetDedupId() != ""
	key := laneKey(queue, deduplicated)
	b.mu.Lock()
	lane := b.lanes[key]
	if lane == nil {
		lane = &enqueueLane{queue: queue, deduplicated: deduplicated}
		b.lanes[key] = lane
	}
	lane.pending = append(lane.pending, w)
	if lane.flights < enqueueLaneFlights {
		lane.flights++
		go b.sender(lane)
	}
	b.mu.Unlock()
	select {
	case o := <-w.done:
		return o.res, o.err
	case <-ctx.Done():
		return EnqueueResult{}, toError(ctx.Err(), nil)
	}
}

// sender sends the lane's pending calls, a request at a time, until none is
// left.
func (b *enqueueBatcher) sender(lane *enqueueLane) {
	for {
		b.mu.Lock()
		if len(lane.pending) == 0 {
			lane.flights--
			if lane.flights == 0 {
				delete(b.lanes, laneKey(lane.queue, lane.deduplicated))
			}
			b.mu.Unlock()
			return
		}
		n, bytes := 0, 0
		for n < len(lane.pending) && n < b.maxMsgs {
			w := lane.pending[n]
			if n > 0 && bytes+w.bytes > b.maxBytes {
				break
			}
			bytes += w.bytes
			n++
		}
		take := lane.pending[:n:n]
		lane.pending = lane.pending[n:]
		b.mu.Unlock()
		b.settle(lane, take)
	}
}

// settle sends one request for waiters of lane and gives each its outcome.
func (b *enqueueBatcher) settle(lane *enqueueLane, waiters []*enqueueWaiter) {
	queue := lane.queue
	res, err := b.sendMerged(queue, waiters)
	if err == nil {
		for i, w := range waiters {
			w.done <- enqueueOutcome{res: res[i]}
		}
		return
	}
	resendable := nothingStoredFault
	if lane.deduplicated {
		resendable = mayBeOneMessagesFault
	}
	if len(waiters) == 1 || !resendable(Code(err)) {
		for _, w := range waiters {
			w.done <- enqueueOutcome{err: err}
		}
		return
	}
	b.sendEach(queue, waiters)
}

// sendMerged sends waiters' messages in one request. Callers with one trace
// context (the usual case) share it as the call's; otherwise each message
// carries its caller's in trace_context, and the call has none.
func (b *enqueueBatcher) sendMerged(queue string, waiters []*enqueueWaiter) ([]EnqueueResult, error) {
	first := waiters[0]
	same := true
	for _, w := range waiters[1:] {
		if w.parent != first.parent || w.state != first.state {
			same = false
			break
		}
	}
	msgs := make([]*casqv1.NewMessage, len(waiters))
	// The request runs in no caller's context: a background one carries no trace.
	ctx := context.Background()
	if same && first.parent != "" {
		ctx = WithTraceParent(context.Background(), first.parent, first.state)
	}
	for i, w := range waiters {
		// The message is the batcher's own (made for this call): it can carry its caller's trace.
		if !same && w.parent != "" && w.msg.GetTraceContext() == nil {
			w.msg.TraceContext = &casqv1.TraceContext{Traceparent: w.parent, Tracestate: w.state}
		}
		msgs[i] = w.msg
	}
	return b.c.send(ctx, queue, msgs)
}

// resendParallel is the most requests in flight at once while a refused
// merged request is resent message by message.
const resendParallel = 16

// sendEach sends one request per waiter: messages with one key one after
// another in call order (their order in the shard); unkeyed messages and
// different keys side by side, at most resendParallel at a time (one bad
// message among 1,000 unkeyed ones costs ~1,000 / 16 round trips, not 1,000).
func (b *enqueueBatcher) sendEach(queue string, waiters []*enqueueWaiter) {
	lanes := make(chan []*enqueueWaiter, len(waiters))
	byKey := map[string]int{}
	var order [][]*enqueueWaiter
	for _, w := range waiters {
		k := w.msg.GetKey()
		if i, ok := byKey[k]; ok && k != "" {
			order[i] = append(order[i], w)
			continue
		}
		if k != "" {
			byKey[k] = len(order)
		}
		order = append(order, []*enqueueWaiter{w})
	}
	for _, lane := range order {
		lanes <- lane
	}
	close(lanes)
	var wg sync.WaitGroup
	for range min(resendParallel, len(order)) {
		wg.Go(func() {
			for lane := range lanes {
				for _, w := range lane {
					ctx := context.Background()
					if w.parent != "" {
						ctx = WithTraceParent(context.Background(), w.parent, w.state)
					}
					res, err := b.c.send(ctx, queue, []*casqv1.NewMessage{w.msg})
					if err != nil {
						w.done <- enqueueOutcome{err: err}
					} else {
						w.done <- enqueueOutcome{res: res[0]}
					}
				}
			}
		})
	}
	wg.Wait()
}
