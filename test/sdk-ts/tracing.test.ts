/**
 * OpenTelemetry processing spans of the TypeScript Worker against a real
 * `casq serve`: a handler runs inside a `process <queue>` CONSUMER span that
 * continues the producer's trace (the traceparent stored with the message),
 * and a failing handler leaves an ERROR span. Spans go to an in-memory
 * exporter handed to the worker as `tracerProvider` (no global provider).
 */
import { Admin, type Job, Producer, spanContextFromTraceContext, Worker } from "@casq/sdk";
import { context, ROOT_CONTEXT, type SpanContext, SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { inMemoryTracing } from "../../server/testing/trace-testing.ts";
import { type CasqServerProcess, startServer, tempDir } from "../e2e/support/processes.ts";
import { eventually } from "./support.ts";

let broker: CasqServerProcess;
const store = tempDir("sdk-tracing");
// Spans become active through context.with; that needs an async context manager.
const manager = new AsyncLocalStorageContextManager();

beforeAll(async () => {
  context.setGlobalContextManager(manager.enable());
  broker = await startServer({ store: `file:${store.path}` });
});

afterAll(async () => {
  await broker?.stop("SIGKILL");
  store.remove();
  context.disable();
});

async function freshQueue(name: string): Promise<string> {
  const queue = `${name}-${Math.random().toString(36).slice(2, 8)}`;
  await new Admin({ brokers: [broker.address] }).createQueue(queue, {
    config: { maxAttempts: 1 },
  });
  return queue;
}

describe("Worker processing spans", () => {
  it("continue the producer's trace, active while the handler runs", async () => {
    const { provider, exporter } = inMemoryTracing();
    const queue = await freshQueue("traced");
    const producerSpan = provider.getTracer("test").startSpan("send", { kind: SpanKind.PRODUCER });
    const producer = new Producer({ brokers: [broker.address] });
    const { id } = await context.with(trace.setSpan(ROOT_CONTEXT, producerSpan), () =>
      producer.enqueue(queue, "traced"),
    );
    producerSpan.end();

    const worker = new Worker({ brokers: [broker.address], tracerProvider: provider });
    const seen: { job: Job; active: SpanContext | undefined }[] = [];
    const done = worker.run(
      queue,
      (job) => {
        seen.push({ job, active: trace.getActiveSpan()?.spanContext() });
      },
      { subscription: "default" },
    );
    await eventually(() => exporter.getFinishedSpans().some((s) => s.name === `process ${queue}`), 20_000);
    await worker.stop({ timeoutMs: 5_000 });
    await done;

    const span = exporter.getFinishedSpans().find((s) => s.name === `process ${queue}`);
    const sent = producerSpan.spanContext();
    expect(span?.kind).toBe(SpanKind.CONSUMER);
    expect(span?.spanContext().traceId).toBe(sent.traceId);
    expect(span?.parentSpanContext?.spanId).toBe(sent.spanId);
    expect(span?.parentSpanContext?.isRemote).toBe(true);
    expect(span?.instrumentationScope.name).toBe("casq");
    expect(span?.attributes).toEqual({
      "messaging.system": "casq",
      "messaging.operation.type": "process",
      "messaging.destination.name": queue,
      "messaging.consumer.group.name": "default",
      "messaging.message.id": id,
      "casq.attempt": 1,
    });
    expect(span?.status.code).not.toBe(SpanStatusCode.ERROR);
    // The handler saw the processing span as the active one.
    expect(seen[0]?.active?.spanId).toBe(span?.spanContext().spanId);
  });

  it("mark a failing handler's span as an error with the exception", async () => {
    const { provider, exporter } = inMemoryTracing();
    const queue = await freshQueue("failing");
    await new Producer({ brokers: [broker.address] }).enqueue(queue, "boom");
    const worker = new Worker({ brokers: [broker.address], tracerProvider: provider });
    const done = worker.run(queue, () => {
      throw new Error("handler exploded");
    });
    await eventually(() => exporter.getFinishedSpans().some((s) => s.name === `process ${queue}`), 20_000);
    await worker.stop({ timeoutMs: 5_000 });
    await done;

    const span = exporter.getFinishedSpans().find((s) => s.name === `process ${queue}`);
    expect(span?.status).toEqual({ code: SpanStatusCode.ERROR, message: "handler exploded" });
    expect(span?.events.map((e) => [e.name, e.attributes?.["exception.message"]])).toEqual([
      ["exception", "handler exploded"],
    ]);
    // No producer span was active: the processing span starts a trace of its own.
    expect(span?.parentSpanContext).toBeUndefined();
  });
});

describe("spanContextFromTraceContext", () => {
  const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
  const spanId = "00f067aa0ba902b7";

  it("parses a W3C traceparent and tracestate into a remote span context", () => {
    const sc = spanContextFromTraceContext({
      traceparent: `00-${traceId}-${spanId}-01`,
      tracestate: "vendor=x,other=y",
    });
    expect(sc).toMatchObject({ traceId, spanId, traceFlags: 1, isRemote: true });
    expect(sc?.traceState?.get("vendor")).toBe("x");
  });

  it("accepts future versions with extra fields and rejects malformed or invalid ids", () => {
    expect(
      spanContextFromTraceContext({ traceparent: `01-${traceId}-${spanId}-00-extra`, tracestate: "" }),
    ).toMatchObject({ traceId, spanId, traceFlags: 0 });
    for (const traceparent of [
      "",
      "garbage",
      `00-${traceId}-${spanId}-01-extra`,
      `ff-${traceId}-${spanId}-01`,
      `00-${"0".repeat(32)}-${spanId}-01`,
      `00-${traceId}-${"0".repeat(16)}-01`,
      `00-${traceId.toUpperCase()}-${spanId}-01`,
    ])
      expect(spanContextFromTraceContext({ traceparent, tracestate: "" }), traceparent).toBeUndefined();
  });
});
