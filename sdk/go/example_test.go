package casq_test

import (
	"context"
	"fmt"
	"log"
	"time"

	casq "github.com/casq/casq/sdk/go"
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
