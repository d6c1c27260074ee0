package casq_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	casq "github.com/casq/casq/sdk/go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// tracedClient dials a client whose spans go to the returned recorder.
func tracedClient(t *testing.T) (*casq.Client, *tracetest.SpanRecorder, trace.Tracer) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	c, err := casq.Dial(context.Background(), casq.Options{Brokers: []string{serverAddr}, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, rec, tp.Tracer("test")
}

// processSpans returns the ended spans named "process <queue>".
func processSpans(rec *tracetest.SpanRecorder, queue string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "process "+queue {
			out = append(out, s)
		}
	}
	return out
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestProcessSpanContinuesProducerTrace(t *testing.T) {
	c, rec, tracer := tracedClient(t)
	queue := queueName(t)
	ctx, parent := tracer.Start(context.Background(), "checkout")
	res, err := c.Producer().Enqueue(ctx, queue, []byte("traced"))
	parent.End()
	if err != nil {
		t.Fatal(err)
	}

	type seen struct {
		job     *casq.Job
		handler trace.SpanContext
		header  string
	}
	got := make(chan seen, 1)
	stop := runWorker(t, c, queue, func(ctx context.Context, job *casq.Job) error {
		got <- seen{job, trace.SpanContextFromContext(ctx), casq.TraceParent(ctx)}
		return nil
	})
	s := wait(t, got)
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	producer := parent.SpanContext()
	if !strings.Contains(s.job.TraceParent, producer.TraceID().String()) {
		t.Fatalf("stored traceparent %q is not in the producer's trace %s", s.job.TraceParent, producer.TraceID())
	}
	spans := processSpans(rec, queue)
	if len(spans) != 1 {
		t.Fatalf("%d process spans", len(spans))
	}
	span := spans[0]
	if span.SpanKind() != trace.SpanKindConsumer {
		t.Fatalf("kind %v", span.SpanKind())
	}
	if span.SpanContext().TraceID() != producer.TraceID() {
		t.Fatalf("process span trace %s, producer trace %s", span.SpanContext().TraceID(), producer.TraceID())
	}
	// The parent is the stored trace context: the producer's span (or a
	// broker span under it, if the broker traces).
	if p := span.Parent(); !p.IsRemote() || !strings.Contains(s.job.TraceParent, p.SpanID().String()) {
		t.Fatalf("parent %v, stored traceparent %q", p, s.job.TraceParent)
	}
	if s.handler.SpanID() != span.SpanContext().SpanID() {
		t.Fatal("the handler's context does not carry the process span")
	}
	if !strings.Contains(s.header, span.SpanContext().SpanID().String()) {
		t.Fatalf("calls from the handler would carry %q, not the process span", s.header)
	}
	want := map[attribute.Key]attribute.Value{
		"messaging.system":              attribute.StringValue("casq"),
		"messaging.operation.type":      attribute.StringValue("process"),
		"messaging.destination.name":    attribute.StringValue(queue),
		"messaging.consumer.group.name": attribute.StringValue("default"),
		"messaging.message.id":          attribute.StringValue(res.ID),
		"casq.attempt":                  attribute.Int64Value(1),
	}
	have := attrs(span)
	for k, v := range want {
		if have[k] != v {
			t.Errorf("attribute %s = %v, want %v", k, have[k].Emit(), v.Emit())
		}
	}
	if span.Status().Code == codes.Error {
		t.Fatalf("status %v", span.Status())
	}
}

func TestProcessSpanRecordsHandlerError(t *testing.T) {
	c, rec, _ := tracedClient(t)
	queue := queueName(t)
	if _, err := c.Producer().Enqueue(context.Background(), queue, []byte("bad")); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 1)
	stop := runWorker(t, c, queue, func(ctx context.Context, job *casq.Job) error {
		done <- struct{}{}
		return casq.DeadLetter(errors.New("malformed"))
	})
	wait(t, done)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	spans := processSpans(rec, queue)
	if len(spans) != 1 {
		t.Fatalf("%d process spans", len(spans))
	}
	span := spans[0]
	if span.Status().Code != codes.Error || !strings.Contains(span.Status().Description, "malformed") {
		t.Fatalf("status %+v", span.Status())
	}
	if ev := span.Events(); len(ev) != 1 || ev[0].Name != "exception" {
		t.Fatalf("events %+v", ev)
	}
	// No trace context was stored: the process span is a root.
	if span.Parent().IsValid() {
		t.Fatalf("parent %v", span.Parent())
	}
}

func TestCallsCarryActiveSpan(t *testing.T) {
	c, _, tracer := tracedClient(t)
	queue := queueName(t)
	ctx, span := tracer.Start(context.Background(), "request")
	defer span.End()
	if _, err := c.Producer().Enqueue(ctx, queue, []byte("x")); err != nil {
		t.Fatal(err)
	}
	// WithTraceParent wins over the active span.
	explicit := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if _, err := c.Producer().Enqueue(casq.WithTraceParent(ctx, explicit), queue, []byte("y")); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 2)
	stop := runWorker(t, c, queue, func(ctx context.Context, job *casq.Job) error {
		got <- string(job.Payload) + " " + job.TraceParent
		return nil
	})
	a, b := wait(t, got), wait(t, got)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	sc := span.SpanContext()
	if want := "x 00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"; a != want {
		t.Fatalf("got %q, want %q", a, want)
	}
	if want := "y " + explicit; b != want {
		t.Fatalf("got %q, want %q", b, want)
	}
}
