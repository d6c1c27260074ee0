package casq_test

import (
	"context"
	"fmt"
	"log"
	"time"

	casq "github.com/casq/casq/sdk/go"
	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/protobuf/proto"
)

func ExampleProducer_Enqueue() {
	ctx := context.Background()
	client, err := casq.Dial(ctx, casq.Options{Brokers: []string{serverAddr}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	res, err := client.Producer().Enqueue(ctx, "example-emails", []byte(`{"to":"ann@example.com"}`),
		casq.WithDedupID("welcome-ann"), casq.WithPriority(5))
	if err != nil {
		log.Fatal(err)
	}
	again, _ := client.Producer().Enqueue(ctx, "example-emails", []byte(`{"to":"ann@example.com"}`),
		casq.WithDedupID("welcome-ann"))
	fmt.Println(res.Duplicate, again.Duplicate, again.ID == res.ID)
	// Output: false true true
}

func ExampleWorker_Run() {
	ctx := context.Background()
	client, err := casq.Dial(ctx, casq.Options{Brokers: []string{serverAddr}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	if _, err := client.Producer().Enqueue(ctx, "example-work", []byte("hello")); err != nil {
		log.Fatal(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	err = client.Worker().Run(runCtx, "example-work", func(ctx context.Context, job *casq.Job) error {
		fmt.Printf("attempt %d: %s\n", job.Attempt, job.Payload)
		stop() // graceful: this job is still acked
		return nil
	}, casq.WithConcurrency(4), casq.WithShutdownTimeout(10*time.Second))
	fmt.Println("stopped:", err)
	// Output:
	// attempt 1: hello
	// stopped: <nil>
}

func ExampleIsNotFound() {
	ctx := context.Background()
	client, err := casq.Dial(ctx, casq.Options{Brokers: []string{serverAddr}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	_, err = client.Admin().GetQueue(ctx, "no-such-queue")
	fmt.Println(casq.IsNotFound(err), casq.Code(err))
	// Output: true NotFound
}

func ExampleAdmin() {
	ctx := context.Background()
	client, err := casq.Dial(ctx, casq.Options{Brokers: []string{serverAddr}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	admin := client.Admin()

	// Two shards, three attempts per message; "default" comes with it.
	if _, err := admin.CreateQueue(ctx, "example-orders", 2, &casqv1.QueueConfig{MaxAttempts: proto.Uint32(3)}); err != nil {
		log.Fatal(err)
	}
	if _, err := client.Producer().Enqueue(ctx, "example-orders", []byte("order-1")); err != nil {
		log.Fatal(err)
	}
	// EARLIEST: the new subscription also gets the message already stored.
	if _, err := admin.CreateSubscription(ctx, "example-orders", "audit", casqv1.SubscriptionStart_SUBSCRIPTION_START_EARLIEST); err != nil {
		log.Fatal(err)
	}
	q, err := admin.GetQueue(ctx, "example-orders")
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range q.GetSubscriptions() {
		fmt.Println(s.GetSubscription(), "ready:", s.GetReady())
	}
	// force: it still holds unsettled messages.
	if err := admin.DeleteQueue(ctx, "example-orders", true); err != nil {
		log.Fatal(err)
	}
	// Output:
	// audit ready: 1
	// default ready: 1
}

func ExampleOptions_tracerProvider() {
	// Any OpenTelemetry TracerProvider; here one that records in memory.
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	ctx := context.Background()
	client, err := casq.Dial(ctx, casq.Options{Brokers: []string{serverAddr}, TracerProvider: tp})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	// The enqueue carries the active span's trace context; the broker stores
	// it with the message.
	spanCtx, checkout := tp.Tracer("shop").Start(ctx, "checkout")
	if _, err := client.Producer().Enqueue(spanCtx, "example-traced", []byte("order-1")); err != nil {
		log.Fatal(err)
	}
	checkout.End()

	runCtx, stop := context.WithCancel(ctx)
	err = client.Worker().Run(runCtx, "example-traced", func(ctx context.Context, job *casq.Job) error {
		// ctx carries the "process example-traced" span, a child of checkout.
		stop()
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range spans.Ended() {
		if s.Name() == "process example-traced" {
			fmt.Println(s.Name(), s.SpanKind(), s.Parent().TraceID() == checkout.SpanContext().TraceID())
		}
	}
	// Output: process example-traced consumer true
}
