import { describe, expect, it } from "vitest";
import { CountingStore, makeShardLeader } from "../../testing/broker-test-support.ts";
import { ManualClock } from "../../testing/manual-clock.ts";
import { isCasqError } from "../errors.ts";
import type { ClaimedMessage } from "../model/operations.ts";
import { listDeadLetters } from "../model/shard-inspect.ts";
import { hasBody } from "../model/shard-records.ts";
import { MemoryStore } from "../store/memory-store.ts";
import { expectKind } from "./broker.ts";
import { SegmentBodyCache } from "./segment-body-cache.ts";
import type { ShardLeader } from "./shard-leader.ts";

const SEG = "queues/jobs/0/seg/";
const text = new TextDecoder();
const body = (i: number) => new TextEncoder().encode(`job-${i}-${"x".repeat(300)}`);

/** A leader with a 4 KiB tail and a page cache of `cache` bytes (a few segments at most), or the cache given. */
function leader(
  store: MemoryStore,
  name: string,
  clock: ManualClock,
  cache: number | SegmentBodyCache = 8192,
) {
  return makeShardLeader(store, name, {
    clock,
    options: { tailBytes: 4096 },
    bodyCache: typeof cache === "number" ? new SegmentBodyCache(cache) : cache,
    initialConfig: { leaseTtlMs: 30_000, maxAttempts: 1 },
  });
}

async function enqueue(shard: ShardLeader, count: number, from = 0) {
  for (let i = from; i < from + count; i += 10) {
    const messages = Array.from({ length: Math.min(10, from + count - i) }, (_, k) => ({
      id: `m${i + k}`,
      payload: body(i + k),
      headers: { n: String(i + k) },
      traceContext: { traceparent: `00-${String(i + k).padStart(32, "0")}-${"1".repeat(16)}-01` },
    }));
    await shard.submit({ kind: "enqueue", messages });
  }
}

async function claim(shard: ShardLeader, max: number): Promise<readonly ClaimedMessage[]> {
  const result = await shard.submit({ kind: "claim", subscription: "default", workerId: "w", max });
  return expectKind(result, "claim").messages;
}

/**
 * Claims (25 at a time) and acks until nothing is left, checking each claimed
 * message whole and collecting its id; `afterEach` runs after every ack.
 */
async function drain(shard: ShardLeader, ids: string[], afterEach: () => void = () => {}): Promise<void> {
  for (;;) {
    const got = await claim(shard, 25);
    if (got.length === 0) return;
    expectWhole(got);
    ids.push(...got.map((m) => m.id));
    await shard.submit({ kind: "ack", subscription: "default", receipts: got.map((m) => m.receipt) });
    afterEach();
  }
}

/** Every claimed message carries the contents it was enqueued with. */
function expectWhole(messages: readonly ClaimedMessage[]) {
  for (const m of messages) {
    const i = Number(m.id.slice(1));
    expect(m.bodyIn).toBeUndefined();
    expect(text.decode(m.payload)).toBe(text.decode(body(i)));
    expect({ ...m.headers }).toEqual({ n: String(i) });
    expect(m.traceContext?.traceparent).toBe(`00-${String(i).padStart(32, "0")}-${"1".repeat(16)}-01`);
  }
}

describe("paging sealed message bodies through a bounded cache", () => {
  it("keeps sealed messages as meta only and reads their bodies from segments for claims, within the budget", async () => {
    const store = new CountingStore(SEG);
    const clock = new ManualClock();
    const cache = new SegmentBodyCache(8 * 1024);
    const a = leader(store, "a", clock, cache);
    await enqueue(a, 400);
    const sealed = await a.read((state) => {
      let meta = 0;
      for (const m of state.messages.values()) if (m.segment !== undefined && !hasBody(m.msg)) meta += 1;
      return { meta, segments: state.segments.size };
    });
    expect(sealed.segments).toBeGreaterThan(20);
    expect(sealed.meta).toBeGreaterThan(300); // the leader holds no body of a sealed message itself
    expect(cache.stats().bytes).toBeLessThanOrEqual(8 * 1024);

    const ids: string[] = [];
    await drain(a, ids, () => {
      // Never more than the budget plus the one segment being read.
      expect(cache.stats().bytes).toBeLessThanOrEqual(8 * 1024 + 4096 * 2);
    });
    expect(ids).toEqual(Array.from({ length: 400 }, (_, i) => `m${i}`));
    expect(store.gets).toBeGreaterThan(sealed.segments / 2); // paged in (a few stayed cached when sealed)
    expect(cache.stats().evictions).toBeGreaterThan(0);
  });

  it("caches the segments it writes only while the backlog ahead of them fits in the cache", async () => {
    let segmentPuts = 0;
    const store = new (class extends CountingStore {
      override put(...args: Parameters<CountingStore["put"]>) {
        if (args[0].startsWith(SEG)) segmentPuts += 1;
        return super.put(...args);
      }
    })(SEG);
    const clock = new ManualClock();
    const cache = new SegmentBodyCache(64 * 1024); // read-ahead window: a quarter, 16 KiB
    const a = leader(store, "a", clock, cache);
    // Claims that keep up: every segment written is claimed from memory.
    const ids: string[] = [];
    for (let round = 0; round < 10; round++) {
      await enqueue(a, 20, round * 20);
      await drain(a, ids);
    }
    expect(segmentPuts).toBeGreaterThan(10);
    expect(store.gets).toBe(0);

    // A backlog deeper than the read-ahead window that fits in the budget (9 segments of ~6 KB):
    // what is written behind it waits in the cache, and the claims that reach it read nothing back.
    await enqueue(a, 90, 200);
    expect(cache.stats().bytes).toBeGreaterThan(16 * 1024 + 2 * 4096);
    await drain(a, ids);
    expect(ids).toEqual(Array.from({ length: 290 }, (_, i) => `m${i}`));
    expect(store.gets).toBe(0);

    // A backlog deeper than the budget: what is written behind it is not cached (it would
    // hold the budget's memory until the claims got there); it is paged in when they do.
    await enqueue(a, 2000, 290);
    expect(cache.stats().bytes).toBeLessThanOrEqual(64 * 1024);
    await drain(a, ids);
    expect(ids).toEqual(Array.from({ length: 2290 }, (_, i) => `m${i}`));
    expect(store.gets).toBeGreaterThan(0);
  });

  it("dead-letters paged-out messages with their whole contents, by nack and by lease expiry", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    await enqueue(a, 200);
    const first = await claim(a, 40);
    expectWhole(first);
    // Evict everything: the bodies of the claimed messages are no longer in memory.
    const b = leader(store, "a", clock, 1); // same identity: a restart, cache of ~nothing
    const nacked = await b.submit({
      kind: "nack",
      subscription: "default",
      receipts: first.slice(0, 20).map((m) => m.receipt),
      deadLetter: true,
    });
    expect(expectKind(nacked, "nack").results.every((r) => r.outcome === "dead_lettered")).toBe(true);
    clock.advance(31_000); // the other 20 leases run out; max_attempts 1: dead-lettered
    await b.read(() => undefined);
    const dead = await b.read((state) => listDeadLetters(state, "default", { limit: 100 }));
    expect(dead.map((d) => d.message.id)).toEqual(first.map((m) => m.id));
    for (const d of dead) {
      const i = Number(d.message.id.slice(1));
      expect(text.decode(d.message.payload)).toBe(text.decode(body(i)));
      expect({ ...d.message.headers }).toEqual({ n: String(i) });
    }
    expect(dead.slice(20).every((d) => d.reason.startsWith("lease expired"))).toBe(true);
  });

  it("a new leader with a small cache serves every message whole, and a redrive restores a sealed one whole", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    await a.submit({ kind: "createSubscription", name: "audit" });
    await enqueue(a, 150);
    await a.stop({ release: true });
    const b = leader(store, "b", clock, 1);
    // audit dead-letters m0..m9 while they are sealed and paged out; default keeps them pending.
    const audit = expectKind(
      await b.submit({ kind: "claim", subscription: "audit", workerId: "w", max: 10 }),
      "claim",
    ).messages;
    expectWhole(audit);
    await b.submit({
      kind: "nack",
      subscription: "audit",
      receipts: audit.map((m) => m.receipt),
      deadLetter: true,
    });
    await b.submit({ kind: "redrive", subscription: "audit" });
    const again = expectKind(
      await b.submit({ kind: "claim", subscription: "audit", workerId: "w", max: 10 }),
      "claim",
    ).messages;
    expect(again.map((m) => m.id)).toEqual(audit.map((m) => m.id));
    expectWhole(again);
    const all: ClaimedMessage[] = [];
    for (let got = await claim(b, 50); got.length > 0; got = await claim(b, 50)) all.push(...got);
    expect(all.map((m) => m.id)).toEqual(Array.from({ length: 150 }, (_, i) => `m${i}`));
    expectWhole(all);
  });

  it("refuses the shard with data_loss when a paged-out segment a claim needs has gone missing", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const cache = new SegmentBodyCache(1);
    const a = leader(store, "a", clock, cache);
    await enqueue(a, 100);
    await a.read(() => undefined);
    const head = await store.get("queues/jobs/0.json");
    const doc = JSON.parse(text.decode(head?.body));
    await store.delete(SEG + doc.segments[0].name); // behind the leader's back
    cache.put("elsewhere", [], 10); // evicts whatever read-ahead had paged in
    const error = await claim(a, 5).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toMatchObject({ code: "data_loss" });
    expect(a.currentMode).toBe("refused");
    const refusedAt = (await store.get("queues/jobs/0.json"))?.etag;
    const again = await claim(a, 5).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isCasqError(again, "data_loss")).toBe(true);
    // Nothing was written over the head after the refusal.
    expect((await store.get("queues/jobs/0.json"))?.etag).toBe(refusedAt);
  });
});
