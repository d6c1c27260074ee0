/**
 * Traces: OpenTelemetry spans for RPCs, group commits, store calls and job
 * deliveries, without any global state in the engine.
 *
 * One {@link CasqTracing} per server holds a tracer (from the provider the
 * server was given) and its own AsyncLocalStorage "current scope", so it
 * works whether or not a global OpenTelemetry context manager is registered.
 * It attaches at four seams:
 *
 * - {@link CasqTracing.interceptor}: a Connect interceptor that starts a
 *   SERVER span per casq.v1 RPC (`casq.v1.QueueService/Enqueue`, attributes
 *   `rpc.system=grpc`, `rpc.service`, `rpc.method`, `rpc.grpc.status_code`),
 *   continuing a W3C `traceparent`/`tracestate` found in the request headers.
 *   The span is put in the call's context values ({@link callTracingKey}) for
 *   handlers, and made the current scope while the handler runs. Each request
 *   of an EnqueueStream gets a span of its own the same way
 *   ({@link traceStreamRequest}), from the request's own trace context.
 * - {@link CasqTracing.commitTracing} + {@link CasqTracing.shardObserver}: the
 *   shard leader's hook. At `submit` it captures the calling RPC's span; per
 *   batch it starts a root span `casq.commit` linked to every RPC span whose
 *   operation the batch carries, and adds to each of those RPC spans a link
 *   back to the commit span (plus a `casq.committed` event once it is
 *   durable). Store calls made by the commit are its children. Batches with no
 *   traced operation (timer renewals, expiry sweeps) get a span only if they
 *   touch the store.
 * - {@link CasqTracing.storeObserver}: a `StoreObserver` for an
 *   `InstrumentedStore` (inside the `RetryingStore`, so one span per attempt):
 *   `casq.store.get` / `casq.store.put` / ... with attempt, outcome, bytes and
 *   etags. Store calls outside any traced scope (health probes) are not traced.
 * - {@link recordDeliveries}: a `casq.deliver` span per job handed to a worker
 *   (Claim or Work), child of the producer's stored trace context (so the
 *   worker side lands in the producer's trace) and linked to the delivering RPC.
 *
 * When tracing is not configured none of this exists: the server installs no
 * interceptor and no observer, and the shard leader allocates nothing per op.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import {
  Code,
  ConnectError,
  type ContextValues,
  createContextKey,
  type Interceptor,
} from "@connectrpc/connect";
import {
  type Attributes,
  type Context,
  context,
  type Link,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  type TextMapGetter,
  type Tracer,
  type TracerProvider,
  trace,
} from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import type { CommitTrace, CommitTracing, ShardObserverWithTracing } from "../broker/shard-leader.ts";
import type { CasAttemptInfo, CommitInfo } from "../broker/shard-observer.ts";
import type { ClaimedMessage } from "../model/operations.ts";
import type { StoreObserver, StoreOpEnd, StoreOpStart } from "../store/instrumented-store.ts";

/** Instrumentation scope name of every casq span. */
export const TRACER_NAME = "casq";

/** What the tracing interceptor leaves in a call's context values. */
export interface CallTracing {
  readonly tracing: CasqTracing;
  /** The RPC's SERVER span. */
  readonly span: Span;
  /** The context with that span active. */
  readonly context: Context;
}

/** Connect context key under which the tracing interceptor stores the call's {@link CallTracing}. */
export const callTracingKey = createContextKey<CallTracing | undefined>(undefined, {
  description: "casq call tracing",
});

/** A scope of the tracing's own AsyncLocalStorage. */
interface Scope {
  /** The context to parent spans on, or undefined to not trace. */
  active(): Context | undefined;
}

const propagator = new W3CTraceContextPropagator();

const headersGetter: TextMapGetter<Headers> = {
  get: (carrier, key) => carrier.get(key) ?? undefined,
  keys: (carrier) => [...carrier.keys()],
};

const recordGetter: TextMapGetter<Readonly<Record<string, string>>> = {
  get: (carrier, key) => carrier[key],
  keys: (carrier) => Object.keys(carrier),
};

/** gRPC codes that mark a SERVER span as an error (OpenTelemetry RPC conventions). */
const SERVER_ERROR_CODES = new Set<Code>([
  Code.Unknown,
  Code.DeadlineExceeded,
  Code.Unimplemented,
  Code.Internal,
  Code.Unavailable,
  Code.DataLoss,
]);

/** Store outcomes that mark a store span as an error (a lost CAS race is not a failure of the call). */
const STORE_ERROR_OUTCOMES = new Set<string>([
  "unavailable",
  "ambiguous",
  "invalid",
  "misconfigured",
  "error",
]);

/** Tracing of one casq server. See the module header. */
export class CasqTracing {
  readonly tracer: Tracer;
  private readonly scopes = new AsyncLocalStorage<Scope>();
  private readonly storeSpans = new WeakMap<StoreOpStart, Span>();

  constructor(provider: TracerProvider) {
    this.tracer = provider.getTracer(TRACER_NAME);
  }

  /** The context spans started now should be children of, if any. */
  activeContext(): Context | undefined {
    const scope = this.scopes.getStore();
    if (scope) return scope.active();
    const ambient = context.active();
    return trace.getSpan(ambient) ? ambient : undefined;
  }

  /** Runs `fn` with `ctx` as the current context (also in the global OTel context, if one is registered). */
  runIn<T>(ctx: Context, fn: () => T): T {
    return this.scopes.run({ active: () => ctx }, () => context.with(ctx, fn));
  }

  /** The Connect interceptor that traces every casq.v1 RPC (first in the chain, to see final status codes). */
  interceptor(): Interceptor {
    return (next) => async (req) => {
      const service = req.service.typeName;
      if (!service.startsWith("casq.v1.")) return next(req);
      const method = req.method.name;
      const parent = propagator.extract(ROOT_CONTEXT, req.header, headersGetter);
      const span = this.tracer.startSpan(
        `${service}/${method}`,
        {
          kind: SpanKind.SERVER,
          attributes: { "rpc.system": "grpc", "rpc.service": service, "rpc.method": method },
        },
        parent,
      );
      const ctx = trace.setSpan(parent, span);
      req.contextValues.set(callTracingKey, { tracing: this, span, context: ctx });
      let res: Awaited<ReturnType<typeof next>>;
      try {
        res = await this.runIn(ctx, () => next(req));
      } catch (error) {
        endRpcSpan(span, error);
        throw error;
      }
      if (!res.stream) {
        endRpcSpan(span, undefined);
        return res;
      }
      // A streaming response: the span lasts until the stream ends, and the handler
      // (which runs as the stream is read) runs in the span's scope.
      return { ...res, message: this.tracedStream(res.message, ctx, span) } as typeof res;
    };
  }

  /**
   * Runs one request of a request stream (an EnqueueStream's) as a SERVER
   * span of its own, `${rpc} request`, a child of `carrier` (the request's
   * W3C trace context) and active while `fn` runs, as a unary call's span
   * is. `fn` gets that span's context as a W3C carrier.
   */
  async traceRequest<T>(
    rpc: string,
    carrier: Readonly<Record<string, string>> | undefined,
    fn: (spanContext: Record<string, string>) => Promise<T>,
  ): Promise<T> {
    const parent =
      carrier === undefined ? ROOT_CONTEXT : propagator.extract(ROOT_CONTEXT, carrier, recordGetter);
    const [service, method] = rpc.split("/") as [string, string];
    const span = this.tracer.startSpan(
      `${rpc} request`,
      {
        kind: SpanKind.SERVER,
        attributes: { "rpc.system": "grpc", "rpc.service": service, "rpc.method": method },
      },
      parent,
    );
    const ctx = trace.setSpan(parent, span);
    try {
      const result = await this.runIn(ctx, () => fn(carrierOf(ctx)));
      endRpcSpan(span, undefined);
      return result;
    } catch (error) {
      endRpcSpan(span, error);
      throw error;
    }
  }

  private async *tracedStream<T>(messages: AsyncIterable<T>, ctx: Context, span: Span): AsyncGenerator<T> {
    const iterator = messages[Symbol.asyncIterator]();
    let failure: unknown;
    try {
      for (;;) {
        const next = await this.runIn(ctx, () => iterator.next());
        if (next.done) return;
        yield next.value;
      }
    } catch (error) {
      failure = error;
      throw error;
    } finally {
      if (failure === undefined) await iterator.return?.();
      endRpcSpan(span, failure);
    }
  }

  /** The shard leaders' tracing hook (carried on {@link shardObserver}). */
  readonly commitTracing: CommitTracing = {
    capture: () => {
      const scope = this.scopes.getStore();
      if (scope instanceof CommitScope) return undefined; // an op submitted by a commit itself
      const ctx = scope ? scope.active() : context.active();
      return ctx === undefined ? undefined : trace.getSpan(ctx);
    },
    begin: (queue, shard, operations, tokens): CommitTrace => {
      const spans: Span[] = [];
      for (const token of tokens) if (isSpan(token) && !spans.includes(token)) spans.push(token);
      return new CommitScope(this, queue, shard, operations, spans);
    },
  };

  /** A ShardObserver that annotates the current commit span and carries {@link commitTracing}. */
  shardObserver(): ShardObserverWithTracing {
    return {
      commitTracing: this.commitTracing,
      onCommit: (info) => {
        const scope = this.scopes.getStore();
        if (scope instanceof CommitScope) scope.committed(info);
      },
      onCasAttempt: (info) => {
        const scope = this.scopes.getStore();
        if (scope instanceof CommitScope) scope.casFailed(info);
      },
    };
  }

  /** Runs `fn` in a commit scope (used by {@link CommitScope.run}). */
  runScope<T>(scope: Scope, fn: () => Promise<T>): Promise<T> {
    const ctx = scope.active();
    return this.scopes.run(scope, ctx ? () => context.with(ctx, fn) : fn);
  }

  /** The StoreObserver that makes a span per store call made inside a traced scope. */
  storeObserver(): StoreObserver {
    return {
      onStart: (start) => {
        const parent = this.activeContext();
        if (parent === undefined) return undefined;
        const attributes: Attributes = {
          "casq.store.operation": start.op,
          "casq.store.key": start.key,
          "casq.store.condition": start.condition,
        };
        if (start.attempt !== undefined) attributes["casq.store.attempt"] = start.attempt;
        if (start.etagBefore !== undefined) attributes["casq.store.etag_before"] = start.etagBefore;
        if (start.op === "put") {
          attributes["casq.store.bytes_out"] = start.bytesOut;
          // The CAS attempt within the commit (a RetryingStore's `attempt` counts retries of one request).
          const scope = this.scopes.getStore();
          if (scope instanceof CommitScope) attributes["casq.commit.cas_attempt"] = scope.nextPut();
        }
        const span = this.tracer.startSpan(
          `casq.store.${start.op}`,
          { kind: SpanKind.CLIENT, attributes },
          parent,
        );
        this.storeSpans.set(start, span);
        return (end) => finishStoreSpan(span, end);
      },
      around: <T>(start: StoreOpStart, run: () => Promise<T>): Promise<T> => {
        const span = this.storeSpans.get(start);
        if (span === undefined) return run();
        this.storeSpans.delete(start);
        const ctx = trace.setSpan(this.activeContext() ?? ROOT_CONTEXT, span);
        return this.runIn(ctx, run);
      },
    };
  }
}

/** One batch of one shard: the `casq.commit` span, created eagerly when traced calls are in it, else lazily. */
class CommitScope implements Scope, CommitTrace {
  private span: Span | undefined;
  private info: CommitInfo | undefined;
  private puts = 0;
  private readonly startTime = Date.now();

  constructor(
    private readonly tracing: CasqTracing,
    private readonly queue: string,
    private readonly shard: number,
    private readonly operations: number,
    private readonly rpcSpans: readonly Span[],
  ) {
    if (rpcSpans.length > 0) this.start();
  }

  active(): Context {
    return trace.setSpan(ROOT_CONTEXT, this.start());
  }

  run<T>(fn: () => Promise<T>): Promise<T> {
    return this.tracing.runScope(this, fn);
  }

  /** Numbers the CAS writes of this batch, from 1. */
  nextPut(): number {
    this.puts += 1;
    return this.puts;
  }

  private start(): Span {
    if (this.span) return this.span;
    const links: Link[] = this.rpcSpans.map((s) => ({
      context: s.spanContext(),
      attributes: { "casq.link": "rpc" },
    }));
    const span = this.tracing.tracer.startSpan(
      "casq.commit",
      {
        kind: SpanKind.INTERNAL,
        startTime: this.startTime,
        links,
        attributes: {
          "casq.queue": this.queue,
          "casq.shard": this.shard,
          "casq.commit.operations": this.operations,
          "casq.commit.calls": this.rpcSpans.length,
        },
      },
      ROOT_CONTEXT,
    );
    this.span = span;
    // The way back: each call links to the commit that carries its operation.
    const back: Link = { context: span.spanContext(), attributes: { "casq.link": "commit" } };
    for (const rpc of this.rpcSpans) rpc.addLink(back);
    return span;
  }

  /** Called (synchronously, before the callers resume) when the batch landed or needed no write. */
  committed(info: CommitInfo): void {
    this.info = info;
    const span = this.span;
    if (span === undefined) return;
    const attributes: Attributes = {
      "casq.epoch": info.epoch,
      "casq.commit.operations": info.operations,
      "casq.commit.cas_attempts": info.casAttempts,
      "casq.commit.outcome": info.outcome,
      "casq.document.bytes": info.documentBytes,
    };
    for (const [kind, count] of Object.entries(info.opsByKind)) attributes[`casq.commit.ops.${kind}`] = count;
    span.setAttributes(attributes);
    const { traceId, spanId } = span.spanContext();
    for (const rpc of this.rpcSpans)
      rpc.addEvent("casq.committed", {
        "casq.commit.trace_id": traceId,
        "casq.commit.span_id": spanId,
        "casq.commit.outcome": info.outcome,
        "casq.queue": info.queue,
        "casq.shard": info.shard,
      });
  }

  casFailed(info: CasAttemptInfo): void {
    this.span?.addEvent("casq.cas_failed", {
      "casq.store.attempt": info.attempt,
      "casq.outcome": info.outcome,
    });
  }

  end(failure: unknown): void {
    const span = this.span;
    if (span === undefined) return;
    if (this.info === undefined) {
      span.setAttribute("casq.commit.outcome", "failed");
      span.setStatus({ code: SpanStatusCode.ERROR, message: messageOf(failure) });
      if (failure instanceof Error) span.recordException(failure);
    }
    span.end();
  }
}

/** Ends a store span with what the call reported. */
function finishStoreSpan(span: Span, end: StoreOpEnd): void {
  const attributes: Attributes = { "casq.store.outcome": end.outcome };
  if (end.bytesIn > 0 || end.op === "get") attributes["casq.store.bytes_in"] = end.bytesIn;
  if (end.etagAfter !== undefined) attributes["casq.store.etag_after"] = end.etagAfter;
  if (end.itemCount !== undefined) attributes["casq.store.items"] = end.itemCount;
  span.setAttributes(attributes);
  if (STORE_ERROR_OUTCOMES.has(end.outcome))
    span.setStatus({ code: SpanStatusCode.ERROR, message: messageOf(end.error) });
  span.end();
}

function endRpcSpan(span: Span, error: unknown): void {
  const code: number = error === undefined ? 0 : ConnectError.from(error).code;
  span.setAttribute("rpc.grpc.status_code", code);
  if (error !== undefined && SERVER_ERROR_CODES.has(code as Code))
    span.setStatus({ code: SpanStatusCode.ERROR, message: messageOf(error) });
  span.end();
}

function isSpan(value: unknown): value is Span {
  return typeof value === "object" && value !== null && typeof (value as Span).spanContext === "function";
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : error === undefined ? "" : String(error);
}

/** The trace context to store in a message enqueued by this call when it brings none: the RPC span's (W3C carrier). */
export function callTraceContext(values: ContextValues): Record<string, string> | undefined {
  const call = values.get(callTracingKey);
  if (call === undefined) return undefined;
  const carrier = carrierOf(call.context);
  return carrier.traceparent === undefined ? undefined : carrier;
}

/**
 * Runs one request of the request stream whose context values are `values`
 * in its own span (see {@link CasqTracing.traceRequest}); without tracing,
 * runs `fn` with `carrier` as it came. `fn` gets the trace context for
 * messages that bring none.
 */
export function traceStreamRequest<T>(
  values: ContextValues,
  rpc: string,
  carrier: Readonly<Record<string, string>> | undefined,
  fn: (traceContext: Readonly<Record<string, string>> | undefined) => Promise<T>,
): Promise<T> {
  const call = values.get(callTracingKey);
  return call === undefined ? fn(carrier) : call.tracing.traceRequest(rpc, carrier, fn);
}

/** The W3C trace context of `ctx` as a carrier (empty when it holds no span). */
function carrierOf(ctx: Context): Record<string, string> {
  const carrier: Record<string, string> = {};
  propagator.inject(ctx, carrier, {
    set: (c, key, value) => {
      c[key] = value;
    },
  });
  return carrier;
}

/** A job handed to a worker. */
export interface TracedDelivery {
  readonly shard: number;
  readonly message: ClaimedMessage;
}

/**
 * Records a `casq.deliver` span per job handed out by the call whose context
 * values are `values` (nothing when the call is not traced). The span is a
 * child of the producer's stored trace context when the message has one (so
 * consumer-side work joins the producer's trace), else of the RPC span, and
 * links to the delivering RPC span either way.
 */
export function recordDeliveries(
  values: ContextValues,
  queue: string,
  deliveries: readonly TracedDelivery[],
): void {
  const call = values.get(callTracingKey);
  if (call === undefined || deliveries.length === 0) return;
  const rpc: Link = { context: call.span.spanContext(), attributes: { "casq.link": "delivering_rpc" } };
  for (const { shard, message } of deliveries) {
    const stored =
      message.traceContext === undefined
        ? undefined
        : propagator.extract(ROOT_CONTEXT, message.traceContext, recordGetter);
    const parent = stored !== undefined && trace.getSpanContext(stored) ? stored : call.context;
    const span = call.tracing.tracer.startSpan(
      "casq.deliver",
      {
        kind: SpanKind.PRODUCER,
        links: [rpc],
        attributes: {
          "messaging.system": "casq",
          "messaging.operation.type": "send",
          "messaging.destination.name": queue,
          "messaging.destination.subscription.name": message.subscription,
          "messaging.message.id": message.id,
          "casq.shard": shard,
          "casq.offset": message.offset,
          "casq.delivery.attempt": message.attempt,
        },
      },
      parent,
    );
    span.end();
  }
}
