/**
 * Producer.enqueue merging concurrent calls into one Enqueue request, against
 * a stub broker that is a real gRPC server (HTTP/2, connectNodeAdapter): it
 * counts the requests, stores messages by dedup id (a resend answers
 * `duplicate`), and can refuse a bad message or break the connection.
 */
import { type EnqueueRequest, QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import { Code, ConnectError } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { context, ROOT_CONTEXT, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { type LoopbackServer, serveOnLoopback } from "../testing/loopback-server.ts";
import { RESEND_PARALLEL } from "./enqueue-batcher.ts";
import { InvalidArgumentError, UnavailableError } from "./errors.ts";
import { Producer, type ProducerOptions } from "./producer.ts";

/** What the stub saw of one Enqueue. */
interface Received {
  readonly payloads: string[];
  readonly dedupIds: string[];
  /** Each message's own trace context (empty: none). */
  readonly messageTraceparents: string[];
  /** The call's `traceparent` header. */
  readonly traceparent: string | null;
}

interface Stored {
  readonly id: string;
  readonly key: string;
  readonly offset: bigint;
}

interface Stub {
  address: string;
  received: Received[];
  /** Stored messages by dedup id. */
  stored: Map<string, Stored>;
  /** Replaces the normal answer, e.g. to refuse a request; runs before anything is stored. */
  refuse?: (request: EnqueueRequest) => ConnectError | undefined;
  /** After storing, break every connection instead of answering (once per `true`). */
  breakAfterStoring: boolean;
  /** Answers each request this long after it came in (0: at once). */
  delayMs: number;
  /** Requests being answered now, and the most at once so far. */
  inFlight: number;
  maxInFlight: number;
  close: () => Promise<void>;
}

const decoder = new TextDecoder();
const stubs: Stub[] = [];

async function startStub(): Promise<Stub> {
  let offset = 0n;
  let server: LoopbackServer | undefined;
  const stub: Stub = {
    address: "",
    received: [],
    stored: new Map(),
    breakAfterStoring: false,
    delayMs: 0,
    inFlight: 0,
    maxInFlight: 0,
    close: async () => {},
  };
  const handler = connectNodeAdapter({
    routes: (router) =>
      router.service(QueueService, {
        async enqueue(request, ctx) {
          stub.received.push({
            payloads: request.messages.map((m) => decoder.decode(m.payload)),
            dedupIds: request.messages.map((m) => m.dedupId),
            messageTraceparents: request.messages.map((m) => m.traceContext?.traceparent ?? ""),
            traceparent: ctx.requestHeader.get("traceparent"),
          });
          const refusal = stub.refuse?.(request);
          if (refusal) throw refusal;
          if (stub.delayMs > 0) {
            stub.inFlight += 1;
            stub.maxInFlight = Math.max(stub.maxInFlight, stub.inFlight);
            await new Promise((r) => setTimeout(r, stub.delayMs));
            stub.inFlight -= 1;
          }
          // All or nothing, deduplicated by dedup id, like the broker.
          const results = request.messages.map((m) => {
            const known = m.dedupId === "" ? undefined : stub.stored.get(m.dedupId);
            if (known) return { ...known, duplicate: true };
            const stored = { id: `id-${decoder.decode(m.payload)}`, key: m.key, offset: offset++ };
            stub.stored.set(m.dedupId === "" ? `no-dedup-id#${stored.offset}` : m.dedupId, stored);
            return { ...stored, duplicate: false };
          });
          if (stub.breakAfterStoring) {
            stub.breakAfterStoring = false;
            server?.dropConnections();
            return new Promise<never>(() => {});
          }
          return {
            messages: results.map((r) => ({ id: r.id, shard: 0, offset: r.offset, duplicate: r.duplicate })),
          };
        },
      }),
  });
  server = await serveOnLoopback(handler);
  stub.address = server.address;
  stub.close = server.close;
  stubs.push(stub);
  return stub;
}

const manager = new AsyncLocalStorageContextManager();
beforeAll(() => {
  context.setGlobalContextManager(manager.enable());
});
afterAll(() => {
  context.disable();
});
afterEach(async () => {
  await Promise.all(stubs.splice(0).map((s) => s.close()));
});

function producerFor(stub: Stub, options: Partial<ProducerOptions> = {}): Producer {
  return new Producer({
    brokers: [stub.address],
    backoffInitialMs: 1,
    backoffMaxMs: 2,
    retryTimeoutMs: 10_000,
    ...options,
  });
}

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

describe("Producer.enqueue batching", () => {
  it("sends 64 concurrent enqueues as one request and gives every caller its own result", async () => {
    const stub = await startStub();
    const producer = producerFor(stub);
    const results = await Promise.all(range(64).map((i) => producer.enqueue("q", `m${i}`)));

    expect(stub.received.length).toBe(1);
    expect(stub.received[0]?.payloads).toEqual(range(64).map((i) => `m${i}`));
    expect(results.map((r) => r.id)).toEqual(range(64).map((i) => `id-m${i}`));
    expect(results.map((r) => r.offset)).toEqual(range(64).map((i) => BigInt(i)));
    // Every message carries its own default dedup id.
    expect(new Set(stub.received[0]?.dedupIds).size).toBe(64);
    expect(stub.received[0]?.dedupIds.every((d) => d !== "")).toBe(true);
  });

  it("keeps 64 callers that await in a loop in few requests, each caller's messages in its order", async () => {
    const stub = await startStub();
    const producer = producerFor(stub);
    const perCaller = 10;
    const offsets = await Promise.all(
      range(64).map(async (caller) => {
        const seen: bigint[] = [];
        for (let j = 0; j < perCaller; j++) {
          const r = await producer.enqueue("q", `c${caller}-${j}`, { key: `k${caller}` });
          expect(r.id).toBe(`id-c${caller}-${j}`);
          seen.push(r.offset);
        }
        return seen;
      }),
    );
    for (const seen of offsets) expect([...seen].sort((a, b) => (a < b ? -1 : 1))).toEqual(seen);
    expect(stub.stored.size).toBe(64 * perCaller);
    // Answered callers enqueue again in the turn their answers arrive: ~one request per round.
    expect(stub.received.length).toBeLessThanOrEqual(perCaller * 2);
  });

  it("puts calls made in one turn into the request in call order", async () => {
    const stub = await startStub();
    const producer = producerFor(stub);
    const pending = range(5).map((i) => producer.enqueue("q", `o${i}`, { key: "same" }));
    const results = await Promise.all(pending);
    expect(stub.received.map((r) => r.payloads)).toEqual([range(5).map((i) => `o${i}`)]);
    expect(results.map((r) => r.offset)).toEqual(range(5).map((i) => BigInt(i)));
  });

  it("fails only the caller of a bad message in a merged request; the others are stored", async () => {
    const stub = await startStub();
    stub.refuse = (request) =>
      request.messages.some((m) => decoder.decode(m.payload) === "bad")
        ? new ConnectError("messages[3].priority is out of range", Code.InvalidArgument)
        : undefined;
    const producer = producerFor(stub);
    const settled = await Promise.allSettled(
      range(8).map((i) => producer.enqueue("q", i === 3 ? "bad" : `g${i}`)),
    );

    settled.forEach((s, i) => {
      if (i === 3) {
        expect(s.status).toBe("rejected");
        expect((s as PromiseRejectedResult).reason).toBeInstanceOf(InvalidArgumentError);
      } else {
        expect(s.status).toBe("fulfilled");
        expect((s as PromiseFulfilledResult<{ id: string }>).value.id).toBe(`id-g${i}`);
      }
    });
    expect(stub.stored.size).toBe(7);
    // The merged request, then one per message with the dedup ids it had.
    expect(stub.received[0]?.payloads.length).toBe(8);
    expect(stub.received.slice(1).map((r) => r.payloads.length)).toEqual(range(8).map(() => 1));
    expect(
      stub.received
        .slice(1)
        .flatMap((r) => r.dedupIds)
        .sort(),
    ).toEqual([...(stub.received[0]?.dedupIds ?? [])].sort());
  });

  it("resends message by message when one shard of a merged request fails (DATA_LOSS) while others stored theirs", async () => {
    const stub = await startStub();
    // The merged request: the healthy shard's messages are stored, then the broken shard's part fails it.
    stub.refuse = (request) => {
      if (!request.messages.some((m) => decoder.decode(m.payload) === "broken")) return undefined;
      if (request.messages.length === 1) return new ConnectError("shard 1 is unreadable", Code.DataLoss);
      for (const m of request.messages)
        if (decoder.decode(m.payload) !== "broken")
          stub.stored.set(m.dedupId, { id: `id-${decoder.decode(m.payload)}`, key: m.key, offset: 99n });
      return new ConnectError("shard 1 is unreadable", Code.DataLoss);
    };
    const producer = producerFor(stub);
    const settled = await Promise.allSettled(
      range(4).map((i) => producer.enqueue("q", i === 2 ? "broken" : `h${i}`)),
    );

    expect(settled[2]).toMatchObject({ status: "rejected", reason: { code: Code.DataLoss } });
    for (const i of [0, 1, 3]) {
      // Each caller whose message the healthy shard stored hears so: its own store, not a duplicate.
      expect(settled[i]).toMatchObject({ status: "fulfilled", value: { id: `id-h${i}`, duplicate: false } });
    }
    expect(stub.received.map((r) => r.payloads.length)).toEqual([4, 1, 1, 1, 1]);
  });

  it("resends a refused merged request's messages in parallel, each key's in call order", async () => {
    const stub = await startStub();
    stub.refuse = (request) =>
      request.messages.some((m) => decoder.decode(m.payload) === "bad")
        ? new ConnectError("messages[0].priority is out of range", Code.InvalidArgument)
        : undefined;
    const producer = producerFor(stub);
    const unkeyed = range(40).map((i) => producer.enqueue("q", i === 0 ? "bad" : `p${i}`));
    const keyed = range(5).map((i) => producer.enqueue("q", `k${i}`, { key: "one-key" }));
    // Sent with the merged request; the resends are each held a while, so that parallel ones overlap.
    await new Promise((r) => setImmediate(r));
    stub.delayMs = 20;
    const settled = await Promise.allSettled([...unkeyed, ...keyed]);

    expect(settled.filter((s) => s.status === "rejected")).toHaveLength(1);
    expect(stub.received[0]?.payloads.length).toBe(45);
    expect(stub.received).toHaveLength(46);
    // Unkeyed messages went side by side (before: one after another, beside the key's lane: 2 at a time), at most the bound.
    expect(stub.maxInFlight).toBeGreaterThan(2);
    expect(stub.maxInFlight).toBeLessThanOrEqual(RESEND_PARALLEL);
    // One key's messages kept their order in the store.
    const keyedOffsets = range(5).map(
      (i) => stub.stored.get(stub.received[0]?.dedupIds[40 + i] ?? "")?.offset,
    );
    expect(keyedOffsets).toEqual([...keyedOffsets].sort((a, b) => Number((a ?? 0n) - (b ?? 0n))));
  });

  it("gives every caller of a request the error that is about the request as a whole", async () => {
    const stub = await startStub();
    stub.refuse = () => new ConnectError("broker is draining", Code.Unavailable);
    const producer = producerFor(stub, { maxAttempts: 2 });
    const settled = await Promise.allSettled(range(8).map((i) => producer.enqueue("q", `u${i}`)));
    for (const s of settled) {
      expect(s.status).toBe("rejected");
      expect((s as PromiseRejectedResult).reason).toBeInstanceOf(UnavailableError);
    }
    // Two attempts of the merged request, no resend per message.
    expect(stub.received.map((r) => r.payloads.length)).toEqual([8, 8]);
  });

  it("resends a merged request after a broken connection without storing anything twice", async () => {
    const stub = await startStub();
    stub.breakAfterStoring = true;
    const producer = producerFor(stub);
    const results = await Promise.all(range(16).map((i) => producer.enqueue("q", `t${i}`)));

    expect(results.map((r) => r.id)).toEqual(range(16).map((i) => `id-t${i}`));
    expect(stub.stored.size).toBe(16);
    expect(stub.received.length).toBe(2);
    // The resend carried the same dedup ids, so the broker answered with what it had stored: the
    // calls' own stores (their dedup ids are the producer's), so none is reported a duplicate.
    expect(stub.received[1]?.dedupIds).toEqual(stub.received[0]?.dedupIds);
    expect(results.every((r) => !r.duplicate)).toBe(true);
  });

  it("reports duplicate only for a dedup id the caller chose, merged or in a batch", async () => {
    const stub = await startStub();
    const producer = producerFor(stub);
    await producer.enqueue("q", "first", { dedupId: "mine" });
    const [again, fresh] = await Promise.all([
      producer.enqueue("q", "again", { dedupId: "mine" }),
      producer.enqueue("q", "fresh"),
    ]);
    expect(again?.duplicate).toBe(true);
    expect(again?.id).toBe("id-first");
    expect(fresh?.duplicate).toBe(false);
    const batch = await producer.enqueueBatch("q", [{ payload: "b", dedupId: "mine" }, { payload: "c" }]);
    expect(batch.map((r) => r.duplicate)).toEqual([true, false]);
    // A batch resent after a lost answer: its own dedup ids found stored, none a duplicate.
    stub.breakAfterStoring = true;
    const resent = await producer.enqueueBatch("q", [{ payload: "d" }, { payload: "e" }]);
    expect(stub.received.at(-1)?.payloads).toEqual(["d", "e"]);
    expect(stub.received.at(-2)?.payloads).toEqual(["d", "e"]);
    expect(resent.map((r) => r.duplicate)).toEqual([false, false]);
  });

  it("sends calls alone with batching off, with a signal, or with a key and no dedup id", async () => {
    const stub = await startStub();
    await Promise.all(range(4).map((i) => producerFor(stub, { batching: false }).enqueue("q", `off${i}`)));
    expect(stub.received.length).toBe(4);

    stub.received.length = 0;
    const producer = producerFor(stub);
    const signal = new AbortController().signal;
    await Promise.all(range(4).map((i) => producer.enqueue("q", `s${i}`, { signal })));
    expect(stub.received.map((r) => r.payloads.length)).toEqual([1, 1, 1, 1]);

    stub.received.length = 0;
    const noDedup = producerFor(stub, { defaultDedupIds: false });
    await Promise.all(range(4).map((i) => noDedup.enqueue("q", `n${i}`, { key: `k${i % 2}` })));
    expect(stub.received.map((r) => r.payloads.length)).toEqual([1, 1, 1, 1]);
  });

  it("merges calls with neither dedup id nor key, apart from calls with dedup ids", async () => {
    const stub = await startStub();
    const producer = producerFor(stub, { defaultDedupIds: false });
    const results = await Promise.all([
      ...range(6).map((i) => producer.enqueue("q", `n${i}`)),
      producer.enqueue("q", "d0", { dedupId: "d0" }),
      producer.enqueue("q", "d1", { dedupId: "d1", key: "k" }),
    ]);
    expect(results.map((r) => r.id)).toEqual([...range(6).map((i) => `id-n${i}`), "id-d0", "id-d1"]);
    expect(stub.received.map((r) => r.payloads).sort()).toEqual(
      [
        ["n0", "n1", "n2", "n3", "n4", "n5"],
        ["d0", "d1"],
      ].sort(),
    );
    expect(stub.stored.size).toBe(8);
  });

  it("resends a refused merged request without dedup ids message by message, but never one that may have landed", async () => {
    const stub = await startStub();
    const producer = producerFor(stub, { defaultDedupIds: false, maxAttempts: 3 });
    // Refused, nothing stored (the broker puts such a request on one shard): each caller gets its own outcome.
    stub.refuse = (request) =>
      request.messages.some((m) => decoder.decode(m.payload) === "bad")
        ? new ConnectError("messages[2].priority is out of range", Code.InvalidArgument)
        : undefined;
    const refused = await Promise.allSettled(
      range(4).map((i) => producer.enqueue("q", i === 2 ? "bad" : `r${i}`)),
    );
    expect(refused.map((s) => s.status)).toEqual(["fulfilled", "fulfilled", "rejected", "fulfilled"]);
    expect(stub.received.map((r) => r.payloads.length)).toEqual([4, 1, 1, 1, 1]);
    expect(stub.stored.size).toBe(3);

    // INTERNAL does not say that nothing was stored: every caller gets it, nothing is resent.
    stub.received.length = 0;
    stub.refuse = () => new ConnectError("a bug", Code.Internal);
    const internal = await Promise.allSettled(range(4).map((i) => producer.enqueue("q", `i${i}`)));
    expect(internal.every((s) => s.status === "rejected" && s.reason.code === Code.Internal)).toBe(true);
    expect(stub.received.map((r) => r.payloads.length)).toEqual([4]);

    // The answer lost after the store: not resent (it would store every message twice).
    stub.received.length = 0;
    stub.refuse = undefined;
    stub.breakAfterStoring = true;
    const lost = await Promise.allSettled(range(4).map((i) => producer.enqueue("q", `l${i}`)));
    expect(lost.every((s) => s.status === "rejected")).toBe(true);
    expect(stub.received.map((r) => r.payloads.length)).toEqual([4]);
    expect(stub.stored.size).toBe(7);
  });

  it("merges calls per queue and timeout, and keeps a request within maxMessages", async () => {
    const stub = await startStub();
    const producer = producerFor(stub, { batching: { maxMessages: 3 } });
    await Promise.all([
      ...range(5).map((i) => producer.enqueue("q", `a${i}`)),
      producer.enqueue("q", "t1", { timeoutMs: 5_000 }),
      producer.enqueue("other", "x"),
    ]);
    expect(stub.received.map((r) => r.payloads).sort()).toEqual(
      [["a0", "a1", "a2"], ["a3", "a4"], ["t1"], ["x"]].sort(),
    );
  });

  it("keeps each caller's trace context: shared as the call's, or per message when callers differ", async () => {
    const stub = await startStub();
    const producer = producerFor(stub);
    const spanOf = (n: number) =>
      trace.wrapSpanContext({
        traceId: `4bf92f3577b34da6a3ce929d0e0e47${String(n).padStart(2, "0")}`,
        spanId: "00f067aa0ba902b7",
        traceFlags: 1,
      });
    const parent = (n: number) =>
      `00-4bf92f3577b34da6a3ce929d0e0e47${String(n).padStart(2, "0")}-00f067aa0ba902b7-01`;

    // One span around all callers: the call carries it, as a single enqueue would.
    await context.with(trace.setSpan(ROOT_CONTEXT, spanOf(1)), () =>
      Promise.all(range(3).map((i) => producer.enqueue("q", `same${i}`))),
    );
    expect(stub.received[0]?.traceparent).toBe(parent(1));
    expect(stub.received[0]?.messageTraceparents).toEqual(["", "", ""]);

    // Callers in different spans (and one in none): each message carries its own, the call none.
    stub.received.length = 0;
    await Promise.all([
      context.with(trace.setSpan(ROOT_CONTEXT, spanOf(2)), () => producer.enqueue("q", "d2")),
      producer.enqueue("q", "none"),
      context.with(trace.setSpan(ROOT_CONTEXT, spanOf(3)), () => producer.enqueue("q", "d3")),
    ]);
    expect(stub.received.length).toBe(1);
    expect(stub.received[0]?.traceparent).toBeNull();
    expect(stub.received[0]?.messageTraceparents).toEqual([parent(2), "", parent(3)]);
  });
});
