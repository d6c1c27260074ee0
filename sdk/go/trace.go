package casq

import "context"

type traceKey struct{}

type traceContext struct{ parent, state string }

// WithTraceParent returns a context whose casq calls carry the W3C
// `traceparent` (and, if given, `tracestate`) metadata. The broker stores it
// with enqueued messages; workers see it as Job.TraceParent, and a handler's
// context carries the job's trace context in turn.
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

// TraceParent returns the traceparent set by WithTraceParent, if any.
func TraceParent(ctx context.Context) string {
	tc, _ := ctx.Value(traceKey{}).(traceContext)
	return tc.parent
}
