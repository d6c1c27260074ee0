package casq

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Producer enqueues messages. Get one from Client.Producer.
type Producer struct{ c *Client }

// EnqueueResult is where a message was stored.
type EnqueueResult struct {
	ID     string
	Shard  uint32
	Offset uint64
	// Duplicate is true when the dedup id matched an earlier message; ID,
	// Shard and Offset are then the original's. Never for a message whose
	// dedup id the SDK made up: only this call could have stored it.
	Duplicate bool
}

// EnqueueOption sets a field of one message.
type EnqueueOption func(*casqv1.NewMessage)

// WithKey routes the message by key: same key, same shard, in order.
func WithKey(key string) EnqueueOption { return func(m *casqv1.NewMessage) { m.Key = key } }

// WithPriority sets the claim priority (-1000..1000, higher first).
func WithPriority(p int32) EnqueueOption { return func(m *casqv1.NewMessage) { m.Priority = p } }

// WithDelay makes the message claimable only after d.
func WithDelay(d time.Duration) EnqueueOption {
	return func(m *casqv1.NewMessage) { m.Schedule = &casqv1.NewMessage_Delay{Delay: durationpb.New(d)} }
}

// WithHeaders adds headers to the message.
func WithHeaders(h map[string]string) EnqueueOption {
	return func(m *casqv1.NewMessage) {
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		maps.Copy(m.Headers, h)
	}
}

// WithMaxAttempts overrides the queue's max_attempts for this message.
func WithMaxAttempts(n uint32) EnqueueOption {
	return func(m *casqv1.NewMessage) { m.MaxAttempts = n }
}

// WithDedupID makes retries of the enqueue exactly-once within the queue's
// dedup window, across calls too (by default each call gives messages
// without one a random id, see Options.NoDefaultDedupIDs).
func WithDedupID(id string) EnqueueOption { return func(m *casqv1.NewMessage) { m.DedupId = id } }

// Message is one entry of EnqueueBatch.
type Message struct {
	Payload []byte
	Options []EnqueueOption
}

// Enqueue stores one message durably and returns where it went. The SDK's
// retries of the call store it once (see Options.NoDefaultDedupIDs); a retry
// by the caller does too only with WithDedupID. Concurrent calls for one
// queue are merged into one Enqueue request unless Options.NoEnqueueBatching
// is set; the result and any error are this message's own either way.
func (p *Producer) Enqueue(ctx context.Context, queue string, payload []byte, opts ...EnqueueOption) (EnqueueResult, error) {
	nm, own := p.c.newMessage(Message{Payload: payload, Options: opts})
	// A keyed message without a dedup id could share a merged request with messages of
	// other shards, and a resend after a partial store would store it twice.
	if b := p.c.enqueueBatcher(); b != nil && mergeable(nm) {
		res, err := b.enqueue(ctx, queue, nm)
		return ownStore(res, own), err
	}
	res, err := p.c.send(ctx, queue, []*casqv1.NewMessage{nm})
	if err != nil {
		return EnqueueResult{}, err
	}
	return ownStore(res[0], own), nil
}

// ownStore is the result of a message whose dedup id the SDK made up (own):
// never a duplicate, as only this call could have stored it (a retry found
// its earlier attempt stored, or a merged request refused for another
// caller's message had).
func ownStore(res EnqueueResult, own bool) EnqueueResult {
	if own {
		res.Duplicate = false
	}
	return res
}

// newMessage builds the request message of m, with a random dedup id unless
// it has one or Options.NoDefaultDedupIDs is set; own says it got one.
func (c *Client) newMessage(m Message) (nm *casqv1.NewMessage, own bool) {
	nm = &casqv1.NewMessage{Payload: m.Payload}
	for _, o := range m.Options {
		o(nm)
	}
	if nm.DedupId == "" && !c.opts.NoDefaultDedupIDs {
		// Once per call: every retry of it (and every part of a split
		// batch) carries the same id.
		nm.DedupId = rand.Text()
		own = true
	}
	return nm, own
}

// maxBatchSplits bounds how often one EnqueueBatch splits (a part of) its
// batch: each split answer means leadership moved since the previous one, so
// past a few the cluster is rebalancing and the caller had better retry later.
const maxBatchSplits = 3

// EnqueueBatch stores 1..1000 messages; results are in input order. When the
// messages' shards are led by one broker it is one durable write. When they
// are led by several, the broker answers with a BatchRedirect (nothing
// stored) and EnqueueBatch sends each broker its part in parallel, one write
// per part, at the cost of one extra round trip; a failed part is returned
// as a *BatchSplitError, and other parts may have been stored then.
func (p *Producer) EnqueueBatch(ctx context.Context, queue string, msgs []Message) ([]EnqueueResult, error) {
	nms := make([]*casqv1.NewMessage, 0, len(msgs))
	own := make([]bool, 0, len(msgs))
	for _, m := range msgs {
		nm, o := p.c.newMessage(m)
		nms, own = append(nms, nm), append(own, o)
	}
	res, err := p.c.send(ctx, queue, nms)
	for i := range res {
		res[i] = ownStore(res[i], own[i])
	}
	return res, err
}

// send is one Enqueue of nms with the client's failover, redirects and splits.
func (c *Client) send(ctx context.Context, queue string, nms []*casqv1.NewMessage) ([]EnqueueResult, error) {
	idx := make([]int, len(nms))
	for i := range idx {
		idx[i] = i
	}
	b := batch{c: c, queue: queue, giveUpAt: time.Now().Add(c.opts.RetryTimeout)}
	res, err := b.enqueue(ctx, c.current(), nms, idx, 0)
	if err != nil {
		return nil, err
	}
	out := make([]EnqueueResult, 0, len(res))
	for _, m := range res {
		out = append(out, EnqueueResult{ID: m.GetId(), Shard: m.GetShard(), Offset: m.GetOffset(), Duplicate: m.GetDuplicate()})
	}
	return out, nil
}

// batch is one EnqueueBatch call, possibly split across shard leaders.
type batch struct {
	c     *Client
	queue string
	// giveUpAt is the retry budget of the whole call, shared by its parts.
	giveUpAt time.Time
}

// enqueue sends msgs (the caller's messages at indexes idx) to addr,
// following redirects, and splits them when the answer is a BatchRedirect.
// depth is how often they were split already.
func (b *batch) enqueue(ctx context.Context, addr string, msgs []*casqv1.NewMessage, idx []int, depth int) ([]*casqv1.EnqueuedMessage, error) {
	req := &casqv1.EnqueueRequest{Queue: b.queue, Messages: msgs}
	var resp *casqv1.EnqueueResponse
	err := b.c.callAt(ctx, addr, b.giveUpAt, func(ctx context.Context, qs casqv1.QueueServiceClient, _ casqv1.AdminServiceClient, o ...grpc.CallOption) (err error) {
		resp, err = qs.Enqueue(ctx, req, o...)
		return err
	})
	var e *Error
	switch {
	case err == nil:
		if len(resp.GetMessages()) != len(msgs) {
			return nil, b.fail(idx, depth, false, &Error{Code: codes.Internal,
				Message: fmt.Sprintf("broker %s answered %d results for %d messages", addr, len(resp.GetMessages()), len(msgs))})
		}
		return resp.GetMessages(), nil
	case !errors.As(err, &e) || e.BatchRedirect == nil:
		return nil, b.fail(idx, depth, false, err)
	case depth >= maxBatchSplits:
		return nil, b.fail(idx, depth, true, e)
	}
	routes := e.BatchRedirect.GetRoutes()
	if err := checkRoutes(routes, len(msgs)); err != nil {
		return nil, b.fail(idx, depth, false, &Error{Code: codes.Internal,
			Message: fmt.Sprintf("broker %s answered a malformed BatchRedirect (%v): %s", addr, err, e.Message), BatchRedirect: e.BatchRedirect})
	}
	// The parts go out together: each is one write on its own leader, so
	// the split costs one round trip, not one per leader.
	results := make([][]*casqv1.EnqueuedMessage, len(routes))
	errs := make([]error, len(routes))
	var wg sync.WaitGroup
	for r, route := range routes {
		if len(route.GetMessageIndexes()) == 0 {
			continue // nothing to send; an empty Enqueue would be refused
		}
		subMsgs := make([]*casqv1.NewMessage, 0, len(route.GetMessageIndexes()))
		subIdx := make([]int, 0, len(route.GetMessageIndexes()))
		for _, i := range route.GetMessageIndexes() {
			subMsgs = append(subMsgs, msgs[i])
			subIdx = append(subIdx, idx[i])
		}
		wg.Go(func() {
			results[r], errs[r] = b.enqueue(ctx, route.GetLeaderAddress(), subMsgs, subIdx, depth+1)
		})
	}
	// Every part runs to its end even when another failed: stopping them
	// would leave their outcome unknown instead of stored or not.
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	out := make([]*casqv1.EnqueuedMessage, len(msgs))
	for r, route := range routes {
		for j, i := range route.GetMessageIndexes() {
			out[i] = results[r][j]
		}
	}
	return out, nil
}

// fail wraps the failure of (a part of) the batch: an unsplit batch fails
// with the broker's error as before; a part says which messages it held.
func (b *batch) fail(idx []int, depth int, tooDeep bool, err error) error {
	var e *Error
	if depth == 0 && !tooDeep {
		return err
	}
	if !errors.As(err, &e) {
		e = toError(err, nil)
	}
	return &BatchSplitError{Queue: b.queue, Depth: depth, TooDeep: tooDeep, Indexes: idx, Err: e}
}

// checkRoutes verifies that routes hold every one of n messages exactly once,
// so that merging the parts' results cannot leave a hole or index out of range.
func checkRoutes(routes []*casqv1.BatchRoute, n int) error {
	seen := make([]bool, n)
	count := 0
	for _, r := range routes {
		if r.GetLeaderAddress() == "" {
			return errors.New("a route without leader address")
		}
		for _, i := range r.GetMessageIndexes() {
			if int(i) >= n || seen[i] {
				return fmt.Errorf("message index %d out of range or repeated", i)
			}
			seen[i] = true
			count++
		}
	}
	if count != n {
		return fmt.Errorf("%d of %d messages routed", count, n)
	}
	return nil
}
