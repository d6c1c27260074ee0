/**
 * Traces end to end in one process: a real casq server with an in-memory span
 * exporter, real gRPC clients, and a store in which a second writer bumps the
 * shard document once, so the broker's CAS write loses a race.
 */
import { SpanKind } from "@opentelemetry/api";
import { afterEach, describe, expect, it } from "vitest";
import { shardKey } from "../../server/src/broker/shard-key.ts";
import { type RunningCasqServer, startCasqServer } from "../../server/src/service/casq-server.ts";
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import type { ObjectStore } from "../../server/src/store/object-store.ts";
import { inMemoryTracing, type ReadableSpan } from "../../server/testing/trace-testing.ts";
import { bytes, grpcClients, quietLogger, sharedStore } from "../service/support.ts";

let server: RunningCasqServer | undefined;
afterEach(async () => {
  await server?.close({ graceful: false });
  server = undefined;
});

/** A store in which, once armed, another writer rewrites `key` just before our next conditional put of it. */
function contendedStore(inner: MemoryStore, key: string): { store: ObjectStore; arm(): void } {
  let armed = false;
  const base = sharedStore(inner);
  return {
    arm: () => {
      armed = true;
    },
    store: {
      ...base,
      async put(k, body, condition, options) {
        if (armed && k === key && "ifMatch" in condition) {
          armed = false;
          const current = await inner.get(k);
          if (current) await inner.put(k, current.body, { ifMatch: current.etag });
        }
        return inner.put(k, body, condition, options);
      },
    },
  };
}

const byName = (spans: readonly ReadableSpan[], name: string) => spans.filter((s) => s.name === name);
const childrenOf = (spans: readonly ReadableSpan[], parent: ReadableSpan) =>
  spans.filter((s) => s.parentSpanContext?.spanId === parent.spanContext().spanId);

describe("tracing", () => {
  it("an enqueue that meets a CAS conflict: RPC span <-> commit span, two put attempts and the re-read", async () => {
    const { provider, exporter } = inMemoryTracing();
    const memory = new MemoryStore();
    const contended = contendedStore(memory, shardKey("jobs", 0));
    server = await startCasqServer({
      store: contended.store,
      listen: "127.0.0.1:0",
      logger: quietLogger,
      tracing: { tracerProvider: provider },
    });
    const { queue } = grpcClients(server.address);
    await queue.enqueue({ queue: "jobs", messages: [{ payload: bytes("warm-up") }] });
    exporter.reset();

    contended.arm();
    await queue.enqueue({ queue: "jobs", messages: [{ payload: bytes("contended") }] });
    const spans = exporter.getFinishedSpans();

    const [rpc, ...moreRpcs] = byName(spans, "casq.v1.QueueService/Enqueue");
    expect(rpc).toBeDefined();
    expect(moreRpcs).toEqual([]);
    if (!rpc) return;
    expect(rpc.kind).toBe(SpanKind.SERVER);
    expect(rpc.attributes).toMatchObject({
      "rpc.system": "grpc",
      "rpc.service": "casq.v1.QueueService",
      "rpc.method": "Enqueue",
      "rpc.grpc.status_code": 0,
    });

    const commit = byName(spans, "casq.commit").find((c) =>
      c.links.some((l) => l.context.spanId === rpc.spanContext().spanId),
    );
    expect(commit, "a commit span linked to the RPC span").toBeDefined();
    if (!commit) return;
    expect(commit.attributes).toMatchObject({
      "casq.queue": "jobs",
      "casq.shard": 0,
      "casq.commit.outcome": "ok",
      "casq.commit.cas_attempts": 2,
      "casq.commit.ops.enqueue": 1,
    });
    expect(commit.attributes["casq.epoch"]).toBeGreaterThan(0);
    expect(commit.attributes["casq.document.bytes"]).toBeGreaterThan(0);
    expect(commit.events.map((e) => e.name)).toContain("casq.cas_failed");
    // ... and the way back: the RPC span links to the commit that made it durable.
    expect(rpc.links.map((l) => l.context.spanId)).toContain(commit.spanContext().spanId);
    expect(rpc.events.find((e) => e.name === "casq.committed")?.attributes).toMatchObject({
      "casq.commit.span_id": commit.spanContext().spanId,
      "casq.commit.outcome": "ok",
    });

    const children = childrenOf(spans, commit);
    const puts = children.filter((s) => s.name === "casq.store.put");
    expect(puts.map((p) => p.attributes["casq.store.outcome"])).toEqual(["precondition_failed", "ok"]);
    expect(puts.map((p) => p.attributes["casq.commit.cas_attempt"])).toEqual([1, 2]);
    const [lost, won] = puts;
    expect(lost?.attributes["casq.store.etag_before"]).toBeDefined();
    expect(won?.attributes["casq.store.etag_after"]).toBeDefined();
    expect(won?.attributes["casq.store.bytes_out"]).toBeGreaterThan(0);
    const reads = children.filter((s) => s.name === "casq.store.get");
    expect(reads.length).toBeGreaterThanOrEqual(1);
    expect(reads[0]?.attributes["casq.store.outcome"]).toBe("ok");
    expect(reads[0]?.attributes["casq.store.bytes_in"]).toBeGreaterThan(0);
    // The re-read sits between the lost put and the winning one.
    expect(reads[0]?.startTime[0] ?? 0).toBeGreaterThanOrEqual(lost?.startTime[0] ?? 0);
  });

  it("producer to worker is one trace: enqueue with a traceparent, Claim and Work deliveries join it", async () => {
    const { provider, exporter } = inMemoryTracing();
    server = await startCasqServer({
      store: new MemoryStore(),
      listen: "127.0.0.1:0",
      logger: quietLogger,
      tracing: { tracerProvider: provider },
    });
    const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
    const producer = grpcClients(server.address, [
      (next) => (req) => {
        req.header.set("traceparent", `00-${traceId}-00f067aa0ba902b7-01`);
        return next(req);
      },
    ]);
    await producer.queue.enqueue({
      queue: "mail",
      messages: [{ payload: bytes("claimed") }, { payload: bytes("streamed") }],
    });
    const enqueueRpc = byName(exporter.getFinishedSpans(), "casq.v1.QueueService/Enqueue")[0];
    expect(enqueueRpc?.spanContext().traceId).toBe(traceId);
    expect(enqueueRpc?.parentSpanContext?.spanId).toBe("00f067aa0ba902b7");

    // Claim (a worker with no trace of its own).
    const worker = grpcClients(server.address);
    const claimed = await worker.queue.claim({ queue: "mail", workerId: "w1", maxMessages: 1 });
    expect(claimed.messages).toHaveLength(1);
    const traceparent = claimed.messages[0]?.message?.traceContext?.traceparent ?? "";
    // The stored context is the Enqueue RPC span's: same trace, the server span as parent.
    expect(traceparent).toBe(`00-${traceId}-${enqueueRpc?.spanContext().spanId}-01`);

    const claimRpc = byName(exporter.getFinishedSpans(), "casq.v1.QueueService/Claim")[0];
    expect(claimRpc).toBeDefined();
    const delivered = byName(exporter.getFinishedSpans(), "casq.deliver");
    expect(delivered).toHaveLength(1);
    const deliver = delivered[0] as ReadableSpan;
    expect(deliver.spanContext().traceId).toBe(traceId);
    expect(deliver.parentSpanContext?.spanId).toBe(enqueueRpc?.spanContext().spanId);
    expect(deliver.kind).toBe(SpanKind.PRODUCER);
    expect(deliver.links.map((l) => l.context.spanId)).toContain(claimRpc?.spanContext().spanId);
    expect(deliver.attributes).toMatchObject({
      "messaging.system": "casq",
      "messaging.destination.name": "mail",
      "messaging.message.id": claimed.messages[0]?.message?.id,
    });

    // Work stream delivery.
    const abort = new AbortController();
    async function* requests() {
      yield { command: { case: "open" as const, value: { queue: "mail", workerId: "w2", credits: 1 } } };
      await new Promise((resolve) => abort.signal.addEventListener("abort", resolve, { once: true }));
    }
    let job: { message?: { traceContext?: { traceparent: string } } } | undefined;
    for await (const res of worker.queue.work(requests(), { signal: abort.signal })) {
      if (res.event.case === "job") {
        job = res.event.value;
        break;
      }
    }
    abort.abort();
    expect(job?.message?.traceContext?.traceparent).toBe(traceparent);
    await expect.poll(() => byName(exporter.getFinishedSpans(), "casq.deliver").length).toBe(2);
    const streamed = byName(exporter.getFinishedSpans(), "casq.deliver")[1];
    expect(streamed?.spanContext().traceId).toBe(traceId);
    await expect.poll(() => byName(exporter.getFinishedSpans(), "casq.v1.QueueService/Work").length).toBe(1);
    const workRpc = byName(exporter.getFinishedSpans(), "casq.v1.QueueService/Work")[0];
    expect(streamed?.links.map((l) => l.context.spanId)).toContain(workRpc?.spanContext().spanId);
  });

  it("costs nothing when off: no interceptor, no spans", async () => {
    const { exporter } = inMemoryTracing();
    server = await startCasqServer({ store: new MemoryStore(), listen: "127.0.0.1:0", logger: quietLogger });
    const { queue } = grpcClients(server.address);
    await queue.enqueue({ queue: "q", messages: [{ payload: bytes("x") }] });
    expect(exporter.getFinishedSpans()).toEqual([]);
  });
});
