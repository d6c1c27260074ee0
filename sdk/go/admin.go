package casq

import (
	"context"

	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc"
)

// Admin is a thin wrapper over casq.v1.AdminService with redirect following
// and failover. Get one from Client.Admin.
type Admin struct{ c *Client }

// CreateQueue creates a queue with shardCount shards (0 means 1) and config
// (nil means the defaults).
func (a *Admin) CreateQueue(ctx context.Context, queue string, shardCount uint32, config *casqv1.QueueConfig) (*casqv1.CreateQueueResponse, error) {
	var resp *casqv1.CreateQueueResponse
	err := a.c.call(ctx, func(ctx context.Context, _ casqv1.QueueServiceClient, as casqv1.AdminServiceClient, o ...grpc.CallOption) (err error) {
		resp, err = as.CreateQueue(ctx, &casqv1.CreateQueueRequest{Queue: queue, ShardCount: shardCount, Config: config}, o...)
		return err
	})
	return resp, err
}

// GetQueue returns a queue's config and statistics.
func (a *Admin) GetQueue(ctx context.Context, queue string) (*casqv1.GetQueueResponse, error) {
	var resp *casqv1.GetQueueResponse
	err := a.c.call(ctx, func(ctx context.Context, _ casqv1.QueueServiceClient, as casqv1.AdminServiceClient, o ...grpc.CallOption) (err error) {
		resp, err = as.GetQueue(ctx, &casqv1.GetQueueRequest{Queue: queue}, o...)
		return err
	})
	return resp, err
}

// ListDeadLetters returns every dead letter of a subscription ("" means
// "default"), following pages.
func (a *Admin) ListDeadLetters(ctx context.Context, queue, subscription string) ([]*casqv1.DeadLetter, error) {
	var out []*casqv1.DeadLetter
	token := ""
	for {
		var resp *casqv1.ListDeadLettersResponse
		err := a.c.call(ctx, func(ctx context.Context, _ casqv1.QueueServiceClient, as casqv1.AdminServiceClient, o ...grpc.CallOption) (err error) {
			resp, err = as.ListDeadLetters(ctx, &casqv1.ListDeadLettersRequest{Queue: queue, Subscription: subscription, PageToken: token}, o...)
			return err
		})
		if err != nil {
			return nil, err
		}
		out = append(out, resp.GetDeadLetters()...)
		token = resp.GetNextPageToken()
		if token == "" {
			return out, nil
		}
	}
}

// Redrive puts dead letters of a subscription ("" means "default") back in
// the queue: the ones with the given message ids, or all of them when no id
// is given. It returns how many were redriven.
func (a *Admin) Redrive(ctx context.Context, queue, subscription string, ids ...string) (uint64, error) {
	req := &casqv1.RedriveDeadLettersRequest{Queue: queue, Subscription: subscription, Ids: ids, All: len(ids) == 0}
	var resp *casqv1.RedriveDeadLettersResponse
	err := a.c.call(ctx, func(ctx context.Context, _ casqv1.QueueServiceClient, as casqv1.AdminServiceClient, o ...grpc.CallOption) (err error) {
		resp, err = as.RedriveDeadLetters(ctx, req, o...)
		return err
	})
	return resp.GetRedriven(), err
}
