package casq

import (
	"bytes"
	"context"
	"errors"
	"io"

	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc"
)

// Admin wraps casq.v1.AdminService with redirect following and failover.
// Every change is safe to resend, so the SDK retries them like reads. Get
// one from Client.Admin.
type Admin struct{ c *Client }

// adminCall runs one AdminService RPC through Client.call.
func adminCall[Resp any](ctx context.Context, a *Admin, fn func(context.Context, casqv1.AdminServiceClient, ...grpc.CallOption) (Resp, error)) (Resp, error) {
	var resp Resp
	err := a.c.call(ctx, func(ctx context.Context, _ casqv1.QueueServiceClient, as casqv1.AdminServiceClient, o ...grpc.CallOption) (err error) {
		resp, err = fn(ctx, as, o...)
		return err
	})
	return resp, err
}

// ListQueues returns every queue in the store, sorted by name, following
// pages.
func (a *Admin) ListQueues(ctx context.Context) ([]*casqv1.QueueSummary, error) {
	var out []*casqv1.QueueSummary
	token := ""
	for {
		req := &casqv1.ListQueuesRequest{PageSize: 1000, PageToken: token}
		resp, err := adminCall(ctx, a, func(ctx context.Context, as casqv1.AdminServiceClient, o ...grpc.CallOption) (*casqv1.ListQueuesResponse, error) {
			return as.ListQueues(ctx, req, o...)
		})
		if err != nil {
			return nil, err
		}
		out = append(out, resp.GetQueues()...)
		if token = resp.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

// GetQueue returns a queue's config and statistics: totals, per
// subscription, and per shard with its leader.
func (a *Admin) GetQueue(ctx context.Context, queue string) (*casqv1.GetQueueResponse, error) {
	req := &casqv1.GetQueueRequest{Queue: queue}
	return adminCall(ctx, a, func(ctx context.Context, as casqv1.AdminServiceClient, o ...grpc.CallOption) (*casqv1.GetQueueResponse, error) {
		return as.GetQueue(ctx, req, o...)
	})
}

// CreateQueueOption changes what CreateQueue does; see IfNotExists.
type CreateQueueOption func(*casqv1.CreateQueueRequest)

// IfNotExists makes CreateQueue of an existing queue succeed with the
// existing queue as it is (its shard count and config; the ones passed are
// not applied or compared), and the response's Created false.
func IfNotExists() CreateQueueOption {
	return func(r *casqv1.CreateQueueRequest) { r.IfNotExists = true }
}

// CreateQueue creates a queue with shardCount shards (0 means 1; fixed for
// the queue's life), config (nil or unset fields mean the defaults) and the
// subscription "default". An existing queue is an ALREADY_EXISTS error
// (errors.Is(err, ErrAlreadyExists), IsAlreadyExists), unless IfNotExists()
// is passed.
func (a *Admin) CreateQueue(ctx context.Context, queue string, shardCount uint32, config *casqv1.QueueConfig, opts ...CreateQueueOption) (*casqv1.CreateQueueResponse, error) {
	req := &casqv1.CreateQueueRequest{Queue: queue, ShardCount: shardCount, Config: config}
	for _, opt := range opts {
		opt(req)
	}
	return adminCall(ctx, a, func(ctx context.Context, as casqv1.AdminServiceClient, o ...grpc.CallOption) (*casqv1.CreateQueueResponse, error) {
		return as.CreateQueue(ctx, req, o...)
	})
}

// UpdateQueue changes the fields of config that are set, in every shard;
// unset fields keep their values. It returns the config now in force.
func (a *Admin) UpdateQueue(ctx context.Context, queue string, config *casqv1.QueueConfig) (*casqv1.UpdateQueueResponse, error) {
	req := &casqv1.UpdateQueueRequest{Queue: queue, Config: config}
	return adminCall(ctx, a, func(ctx context.Context, as casqv1.AdminServiceClient, o ...grpc.CallOption) (*casqv1.UpdateQueueResponse, error) {
		return as.UpdateQueue(ctx, req, o...)
	})
}

// DeleteQueue deletes a queue with everything in it. Without force, a queue
// that still holds unsettled messages or dead letters is
// FAILED_PRECONDITION.
func (a *Admin) DeleteQueue(ctx context.Context, queue string, force bool) error {
	req := &casqv1.DeleteQueueRequest{Queue: queue, Force: force}
	_, err := adminCall(ctx, a, func(ctx context.Context, as casqv1.AdminServiceClient, o ...grpc.CallOption) (*casqv1.DeleteQueueResponse, error) {
		return as.DeleteQueue(ctx, req, o...)
	})
	return err
}

// CreateSubscription adds a subscription (consumer group) to a queue,
// starting from the latest message (only new ones; also for
// SUBSCRIPTION_START_UNSPECIFIED) or the earliest one still stored. An
// existing subscription is ALREADY_EXISTS.
func (a *Admin) CreateSubscription(ctx context.Context, queue, subscription string, start casqv1.SubscriptionStart) (*casqv1.CreateSubscriptionResponse, error) {
	req := &casqv1.CreateSubscriptionRequest{Queue: queue, Subscription: subscription, Start: start}
	return adminCall(ctx, a, func(ctx context.Context, as casqv1.AdminServiceClient, o ...grpc.CallOption) (*casqv1.CreateSubscriptionResponse, error) {
		return as.CreateSubscription(ctx, req, o...)
	})
}

// DeleteSubscription removes a subscription with its leases, ack state and
// dead letters.
func (a *Admin) DeleteSubscription(ctx context.Context, queue, subscription string) (*casqv1.DeleteSubscriptionResponse, error) {
	req := &casqv1.DeleteSubscriptionRequest{Queue: queue, Subscription: subscription}
	return adminCall(ctx, a, func(ctx context.Context, as casqv1.AdminServiceClient, o ...grpc.CallOption) (*casqv1.DeleteSubscriptionResponse, error) {
		return as.DeleteSubscription(ctx, req, o...)
	})
}

// PurgeOptions selects what Purge throws away. Exactly one of Subscription
// and AllSubscriptions must be set.
type PurgeOptions struct {
	// Subscription purges only this subscription: what it has not settled
	// counts as done for it.
	Subscription string
	// AllSubscriptions purges every subscription: all messages leave the
	// queue.
	AllSubscriptions bool
	// DeadLetters clears dead letters (of Subscription, or of all) instead of
	// messages.
	DeadLetters bool
}

// Purge throws work away (or dead letters, with PurgeOptions.DeadLetters).
// Purged leases are lost for their workers; dedup ids are kept.
func (a *Admin) Purge(ctx context.Context, queue string, opts PurgeOptions) (*casqv1.PurgeQueueResponse, error) {
	req := &casqv1.PurgeQueueRequest{Queue: queue, Subscription: opts.Subscription, AllSubscriptions: opts.AllSubscriptions, DeadLetters: opts.DeadLetters}
	return adminCall(ctx, a, func(ctx context.Context, as casqv1.AdminServiceClient, o ...grpc.CallOption) (*casqv1.PurgeQueueResponse, error) {
		return as.PurgeQueue(ctx, req, o...)
	})
}

// ListDeadLetters returns every dead letter of a subscription ("" means
// "default"), following pages: shard by shard, oldest first within a shard.
func (a *Admin) ListDeadLetters(ctx context.Context, queue, subscription string) ([]*casqv1.DeadLetter, error) {
	var out []*casqv1.DeadLetter
	token := ""
	for {
		req := &casqv1.ListDeadLettersRequest{Queue: queue, Subscription: subscription, PageSize: 1000, PageToken: token}
		resp, err := adminCall(ctx, a, func(ctx context.Context, as casqv1.AdminServiceClient, o ...grpc.CallOption) (*casqv1.ListDeadLettersResponse, error) {
			return as.ListDeadLetters(ctx, req, o...)
		})
		if err != nil {
			return nil, err
		}
		out = append(out, resp.GetDeadLetters()...)
		if token = resp.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

// Redrive makes dead letters of a subscription ("" means "default")
// runnable again with a fresh attempt budget: the ones with the given
// message ids, or all of them when no id is given. It returns how many were
// redriven; ids that are not dead letters are skipped.
func (a *Admin) Redrive(ctx context.Context, queue, subscription string, ids ...string) (uint64, error) {
	req := &casqv1.RedriveDeadLettersRequest{Queue: queue, Subscription: subscription, Ids: ids, All: len(ids) == 0}
	resp, err := adminCall(ctx, a, func(ctx context.Context, as casqv1.AdminServiceClient, o ...grpc.CallOption) (*casqv1.RedriveDeadLettersResponse, error) {
		return as.RedriveDeadLetters(ctx, req, o...)
	})
	return resp.GetRedriven(), err
}

// GetDocument returns the raw bytes (JSON) of one shard's document exactly
// as stored, and its etag. The broker streams it in chunks; a retry after a
// broken stream starts over.
func (a *Admin) GetDocument(ctx context.Context, queue string, shard uint32) (doc []byte, etag string, err error) {
	req := &casqv1.GetDocumentRequest{Queue: queue, Shard: shard}
	var buf bytes.Buffer
	err = a.c.call(ctx, func(ctx context.Context, _ casqv1.QueueServiceClient, as casqv1.AdminServiceClient, o ...grpc.CallOption) error {
		buf.Reset()
		etag = ""
		stream, err := as.GetDocument(ctx, req, o...)
		if err != nil {
			return err
		}
		for first := true; ; first = false {
			chunk, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if first {
				etag = chunk.GetEtag()
				buf.Grow(int(min(chunk.GetTotalBytes(), 1<<30)))
			}
			buf.Write(chunk.GetChunk())
		}
	})
	if err != nil {
		return nil, "", err
	}
	return buf.Bytes(), etag, nil
}
