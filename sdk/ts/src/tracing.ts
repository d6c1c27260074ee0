/**
 * OpenTelemetry processing spans of the worker: each handler runs inside a
 * `process <queue>` CONSUMER span whose parent is the trace context the
 * producer stored with the message, so a job's processing joins the
 * producer's trace even across processes and languages.
 *
 * Only `@opentelemetry/api` is used (no SDK, no propagator registration): the
 * W3C `traceparent` is parsed here, the same way W3CTraceContextPropagator does.
 */
import {
  type Attributes,
  type Context,
  context,
  createTraceState,
  isSpanContextValid,
  ROOT_CONTEXT,
  type SpanContext,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  type TracerProvider,
  trace,
} from "@opentelemetry/api";
import type { Job, JobTraceContext } from "./job.ts";

/** Name of the instrumentation scope of the SDK's spans. */
export const TRACER_NAME = "casq";

// version-traceid-parentid-flags; later versions may append fields after a dash.
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/**
 * Parses a W3C trace context into a remote {@link SpanContext}; undefined
 * when `traceparent` is malformed or names the invalid (all-zero) trace or span.
 */
export function spanContextFromTraceContext(
  traceContext: JobTraceContext | undefined,
): SpanContext | undefined {
  const match = TRACEPARENT.exec(traceContext?.traceparent.trim() ?? "");
  if (!match) return undefined;
  const [, version, traceId, spanId, flags, rest] = match as unknown as [
    string,
    string,
    string,
    string,
    string,
    string?,
  ];
  // Version ff is forbidden; version 00 has exactly four fields.
  if (version === "ff" || (version === "00" && rest !== undefined)) return undefined;
  const state = traceContext?.tracestate.trim();
  const spanContext: SpanContext = {
    traceId,
    spanId,
    traceFlags: Number.parseInt(flags, 16),
    isRemote: true,
    ...(state ? { traceState: createTraceState(state) } : {}),
  };
  return isSpanContextValid(spanContext) ? spanContext : undefined;
}

/** The context a job's processing span is a child of: the producer's, or a new trace when it sent none. */
export function jobParentContext(job: Job): Context {
  const spanContext = spanContextFromTraceContext(job.traceContext);
  // Not context.active(): the worker's own context at run() time is unrelated to the job.
  return spanContext ? trace.setSpanContext(ROOT_CONTEXT, spanContext) : ROOT_CONTEXT;
}

/** The tracer of the SDK's spans: from `provider`, or the global one. */
export function casqTracer(provider?: TracerProvider): Tracer {
  return (provider ?? trace).getTracer(TRACER_NAME);
}

/**
 * Runs `handler(job)` inside a `process <queue>` CONSUMER span (active while
 * it runs, child of the job's stored trace context) and ends the span when
 * the handler settles. A handler failure sets status ERROR, is recorded as an
 * exception, and is rethrown.
 */
export async function runInProcessSpan(
  tracer: Tracer,
  job: Job,
  subscription: string,
  handler: (job: Job) => Promise<void> | void,
): Promise<void> {
  const attributes: Attributes = {
    "messaging.system": "casq",
    "messaging.operation.type": "process",
    "messaging.destination.name": job.queue,
    "messaging.consumer.group.name": subscription,
    "messaging.message.id": job.id,
    "casq.attempt": job.attempt,
  };
  const parent = jobParentContext(job);
  const span = tracer.startSpan(`process ${job.queue}`, { kind: SpanKind.CONSUMER, attributes }, parent);
  try {
    await context.with(trace.setSpan(parent, span), () => handler(job));
  } catch (error) {
    span.recordException(error instanceof Error ? error : String(error));
    span.setStatus({
      code: SpanStatusCode.ERROR,
      message: error instanceof Error ? error.message : String(error),
    });
    throw error;
  } finally {
    span.end();
  }
}
