package casq_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestAdminQueueLifecycle(t *testing.T) {
	c := dial(t)
	ctx := context.Background()
	admin := c.Admin()
	queue := queueName(t)

	created, err := admin.CreateQueue(ctx, queue, 2, &casqv1.QueueConfig{LeaseTtl: durationpb.New(5 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if created.GetShardCount() != 2 || created.GetConfig().GetLeaseTtl().AsDuration() != 5*time.Second {
		t.Fatalf("created %v", created)
	}
	if _, err := admin.CreateQueue(ctx, queue, 1, nil); casq.Code(err) != codes.AlreadyExists {
		t.Fatalf("second create: %v", err)
	}
	if _, err := admin.CreateQueue(ctx, queue, 1, nil); !errors.Is(err, casq.ErrAlreadyExists) || !casq.IsAlreadyExists(err) {
		t.Fatalf("second create is not ErrAlreadyExists: %v", err)
	}
	// IfNotExists: the existing queue as it is, not the shard count asked for.
	existing, err := admin.CreateQueue(ctx, queue, 1, nil, casq.IfNotExists())
	if err != nil || existing.GetCreated() || existing.GetShardCount() != 2 {
		t.Fatalf("create if not exists: %v, %v", existing, err)
	}
	if !created.GetCreated() {
		t.Fatalf("first create says created false: %v", created)
	}

	queues, err := admin.ListQueues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(queues, func(q *casqv1.QueueSummary) bool { return q.GetName() == queue })
	if i < 0 || queues[i].GetShardCount() != 2 {
		t.Fatalf("ListQueues lacks %s: %v", queue, queues)
	}

	updated, err := admin.UpdateQueue(ctx, queue, &casqv1.QueueConfig{MaxAttempts: proto.Uint32(3)})
	if err != nil {
		t.Fatal(err)
	}
	if updated.GetConfig().GetMaxAttempts() != 3 || updated.GetConfig().GetLeaseTtl().AsDuration() != 5*time.Second {
		t.Fatalf("updated config %v", updated.GetConfig())
	}

	if _, err := c.Producer().Enqueue(ctx, queue, []byte("m1")); err != nil {
		t.Fatal(err)
	}
	sub, err := admin.CreateSubscription(ctx, queue, "audit", casqv1.SubscriptionStart_SUBSCRIPTION_START_EARLIEST)
	if err != nil {
		t.Fatal(err)
	}
	if sub.GetBacklog() != 1 || sub.GetStart() != casqv1.SubscriptionStart_SUBSCRIPTION_START_EARLIEST {
		t.Fatalf("subscription %v", sub)
	}
	if _, err := admin.CreateSubscription(ctx, queue, "audit", 0); casq.Code(err) != codes.AlreadyExists {
		t.Fatalf("second subscription create: %v", err)
	}
	q, err := admin.GetQueue(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range q.GetSubscriptions() {
		names = append(names, s.GetSubscription())
	}
	if !slices.Equal(names, []string{"audit", "default"}) || len(q.GetShards()) != 2 {
		t.Fatalf("subscriptions %v, %d shards", names, len(q.GetShards()))
	}

	purged, err := admin.Purge(ctx, queue, casq.PurgeOptions{Subscription: "audit"})
	if err != nil || purged.GetMessagesPurged() != 1 {
		t.Fatalf("purge: %v %v", purged, err)
	}
	if _, err := admin.Purge(ctx, queue, casq.PurgeOptions{}); casq.Code(err) != codes.InvalidArgument {
		t.Fatalf("purge without a target: %v", err)
	}
	dropped, err := admin.DeleteSubscription(ctx, queue, "audit")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.DeleteSubscription(ctx, queue, "audit"); !casq.IsNotFound(err) {
		t.Fatalf("second subscription delete: %v (first %v)", err, dropped)
	}

	// "default" still holds m1.
	if err := admin.DeleteQueue(ctx, queue, false); casq.Code(err) != codes.FailedPrecondition {
		t.Fatalf("delete of a non-empty queue: %v", err)
	}
	if err := admin.DeleteQueue(ctx, queue, true); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.GetQueue(ctx, queue); !casq.IsNotFound(err) {
		t.Fatalf("deleted queue: %v", err)
	}
}

func TestAdminDeadLettersAndRedriveByID(t *testing.T) {
	c := dial(t)
	ctx := context.Background()
	admin := c.Admin()
	queue := queueName(t)
	var ids []string
	for _, p := range []string{"a", "b"} {
		res, err := c.Producer().Enqueue(ctx, queue, []byte(p))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	seen := make(chan struct{}, 2)
	stop := runWorker(t, c, queue, func(context.Context, *casq.Job) error {
		seen <- struct{}{}
		return casq.DeadLetter(errors.New("poison"))
	})
	wait(t, seen)
	wait(t, seen)
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	var dls []*casqv1.DeadLetter
	deadline := time.Now().Add(10 * time.Second)
	for len(dls) < 2 && time.Now().Before(deadline) {
		var err error
		if dls, err = admin.ListDeadLetters(ctx, queue, ""); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(dls) != 2 || dls[0].GetReason() != "poison" {
		t.Fatalf("dead letters %v", dls)
	}
	n, err := admin.Redrive(ctx, queue, "default", ids[1])
	if err != nil || n != 1 {
		t.Fatalf("redrive by id: %d %v", n, err)
	}
	left, err := admin.ListDeadLetters(ctx, queue, "default")
	if err != nil || len(left) != 1 || left[0].GetMessage().GetId() != ids[0] {
		t.Fatalf("left %v %v", left, err)
	}
	if n, err := admin.Redrive(ctx, queue, ""); err != nil || n != 1 {
		t.Fatalf("redrive all: %d %v", n, err)
	}
	purged, err := admin.Purge(ctx, queue, casq.PurgeOptions{AllSubscriptions: true})
	if err != nil || purged.GetMessagesPurged() != 2 {
		t.Fatalf("purge all: %v %v", purged, err)
	}
}

func TestAdminGetDocument(t *testing.T) {
	c := dial(t)
	ctx := context.Background()
	queue := queueName(t)
	// Two large payloads: with format v2 they are sealed into a segment, and
	// GetDocument returns the shard's head (the chunked stream of a head over
	// 1 MiB is tested on the server, test/service/admin-service.test.ts).
	big := bytes.Repeat([]byte("x"), 700<<10)
	for range 2 {
		if _, err := c.Producer().Enqueue(ctx, queue, big); err != nil {
			t.Fatal(err)
		}
	}
	doc, etag, err := c.Admin().GetDocument(ctx, queue, 0)
	if err != nil {
		t.Fatal(err)
	}
	var head struct {
		Format     string `json:"format"`
		NextOffset int64  `json:"next_offset"`
	}
	if etag == "" || json.Unmarshal(doc, &head) != nil || head.Format != "casq.shard.v2" || head.NextOffset != 2 {
		t.Fatalf("etag %q, %d bytes, head %+v", etag, len(doc), head)
	}
	if _, _, err := c.Admin().GetDocument(ctx, queue, 7); !casq.IsNotFound(err) {
		t.Fatalf("missing shard: %v", err)
	}
}
