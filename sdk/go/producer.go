package casq

import (
	"context"
	"maps"
	"time"

	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc"
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
	// Shard and Offset are then the original's.
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
// dedup window.
func WithDedupID(id string) EnqueueOption { return func(m *casqv1.NewMessage) { m.DedupId = id } }

// Message is one entry of EnqueueBatch.
type Message struct {
	Payload []byte
	Options []EnqueueOption
}

// Enqueue stores one message durably and returns where it went. Without
// WithDedupID, a retry after an ambiguous failure may store it twice.
func (p *Producer) Enqueue(ctx context.Context, queue string, payload []byte, opts ...EnqueueOption) (EnqueueResult, error) {
	res, err := p.EnqueueBatch(ctx, queue, []Message{{Payload: payload, Options: opts}})
	if err != nil {
		return EnqueueResult{}, err
	}
	return res[0], nil
}

// EnqueueBatch stores 1..1000 messages in one durable write; results are in
// input order.
func (p *Producer) EnqueueBatch(ctx context.Context, queue string, msgs []Message) ([]EnqueueResult, error) {
	req := &casqv1.EnqueueRequest{Queue: queue}
	for _, m := range msgs {
		nm := &casqv1.NewMessage{Payload: m.Payload}
		for _, o := range m.Options {
			o(nm)
		}
		req.Messages = append(req.Messages, nm)
	}
	var resp *casqv1.EnqueueResponse
	err := p.c.call(ctx, func(ctx context.Context, qs casqv1.QueueServiceClient, _ casqv1.AdminServiceClient, o ...grpc.CallOption) (err error) {
		resp, err = qs.Enqueue(ctx, req, o...)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]EnqueueResult, 0, len(resp.GetMessages()))
	for _, m := range resp.GetMessages() {
		out = append(out, EnqueueResult{ID: m.GetId(), Shard: m.GetShard(), Offset: m.GetOffset(), Duplicate: m.GetDuplicate()})
	}
	return out, nil
}
