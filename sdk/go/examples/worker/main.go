// Command worker is a runnable casq worker with OpenTelemetry tracing: each
// job prints one line "worked <message id> <payload>" on stdout and is acked.
//
//	go run ./worker -brokers 127.0.0.1:50051 -queue emails [-subscription default] [-jobs N]
//
// With -jobs N it stops gracefully after N handlers completed and exits 0;
// without, it runs until SIGINT or SIGTERM. When OTEL_EXPORTER_OTLP_ENDPOINT
// or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, spans are exported with
// OTLP/HTTP (the exporter reads the other OTEL_* variables itself, and
// OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES name the service). Logs go to
// stderr.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"

	casq "github.com/casq/casq/sdk/go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func main() {
	brokers := flag.String("brokers", envOr("CASQ_BROKERS", "127.0.0.1:50051"), "comma-separated broker addresses")
	queue := flag.String("queue", "", "queue to work (required)")
	subscription := flag.String("subscription", "default", "subscription (consumer group)")
	jobs := flag.Int("jobs", 0, "stop after this many jobs (0: run until SIGINT/SIGTERM)")
	flag.Parse()
	if *queue == "" {
		log.Fatal("worker: -queue is required")
	}
	if err := run(*brokers, *queue, *subscription, *jobs); err != nil {
		log.Fatal("worker: ", err)
	}
}

func run(brokers, queue, subscription string, jobs int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	shutdown, err := setupTracing(ctx)
	if err != nil {
		return err
	}
	defer shutdown() // flushes the spans of the last jobs

	// With no TracerProvider in Options the client uses the global one,
	// which setupTracing installed.
	client, err := casq.Dial(ctx, casq.Options{Brokers: strings.Split(brokers, ",")})
	if err != nil {
		return err
	}
	defer client.Close()

	var done atomic.Int64
	return client.Worker().Run(ctx, queue, func(ctx context.Context, job *casq.Job) error {
		// ctx carries the "process <queue>" span, a child of the producer's.
		fmt.Printf("worked %s %s\n", job.ID, job.Payload)
		if jobs > 0 && done.Add(1) == int64(jobs) {
			stop() // graceful: this job is still acked, unstarted ones go back
		}
		return nil
	}, casq.WithSubscription(subscription),
		casq.WithErrorHandler(func(err error, _ *casq.Job) { log.Print("worker: ", err) }))
}

// setupTracing installs an OTLP/HTTP tracer provider when an OTLP endpoint
// is configured, and returns a function that flushes and stops it.
func setupTracing(ctx context.Context) (func(), error) {
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return func() {}, nil
	}
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, err
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return func() {
		if err := tp.Shutdown(context.Background()); err != nil {
			log.Print("worker: trace shutdown: ", err)
		}
	}, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
