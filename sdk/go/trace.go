package casq

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the SDK's spans.
const tracerName = "github.com/casq/casq/sdk/go"

type traceKey struct{}

type traceContext struct{ parent, state string }

// w3c is used directly rather than otel.GetTextMapPropagator(), which is a
// no-op unless the application installs one: casq always speaks W3C trace
// context, to the broker and in stored messages.
var w3c propagation.TraceContext

// WithTraceParent returns a context whose casq calls carry the W3C
// `traceparent` (and, if given, `tracestate`) metadata instead of the trace
// context of the OpenTelemetry span in ctx. The broker stores it with
// enqueued messages and workers see it as Job.TraceParent. Without it, calls
// carry the active span's trace context, if any.
func WithTraceParent(ctx context.Context, traceparent string, tracestate ...string) context.Context {
	if traceparent == "" {
		return ctx
	}
	tc := traceContext{parent: traceparent}
	if len(tracestate) > 0 {
		tc.state = tracestate[0]
	}
	return context.WithValue(ctx, traceKey{}, tc)
}

// TraceParent returns the traceparent casq calls made with ctx carry: the
// one set by WithTraceParent, else the one of the span in ctx (in a
// handler: its process span), else "".
func TraceParent(ctx context.Context) string {
	parent, _ := traceHeaders(ctx)
	return parent
}

// traceHeaders returns the traceparent and tracestate to send with a call.
func traceHeaders(ctx context.Context) (parent, state string) {
	if tc, ok := ctx.Value(traceKey{}).(traceContext); ok && tc.parent != "" {
		return tc.parent, tc.state
	}
	carrier := propagation.MapCarrier{}
	w3c.Inject(ctx, carrier) // nothing for an invalid span context
	return carrier.Get("traceparent"), carrier.Get("tracestate")
}

// tracer returns the SDK's tracer from Options.TracerProvider, else from the
// global provider (looked up now, so one installed after Dial applies).
func (c *Client) tracer() trace.Tracer {
	tp := c.opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(tracerName)
}

// jobParent returns ctx with the job's stored trace context as the remote
// parent span, and whether there was a valid one. The span and any
// WithTraceParent of Run's context are dropped: a job belongs to its
// producer's trace (or none), and calls from the handler carry its process
// span.
func jobParent(ctx context.Context, job *Job) (context.Context, bool) {
	ctx = context.WithValue(ctx, traceKey{}, traceContext{})
	ctx = trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	if job.TraceParent == "" {
		return ctx, false
	}
	ctx = w3c.Extract(ctx, propagation.MapCarrier{"traceparent": job.TraceParent, "tracestate": job.TraceState})
	return ctx, trace.SpanContextFromContext(ctx).IsValid()
}
