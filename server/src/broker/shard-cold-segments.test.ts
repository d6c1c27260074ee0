import { describe, expect, it } from "vitest";
import { CountingStore, makeShardLeader } from "../../testing/broker-test-support.ts";
import { ManualClock } from "../../testing/manual-clock.ts";
import { isCasqError } from "../errors.ts";
import type { ClaimedMessage } from "../model/operations.ts";
import { MemoryStore } from "../store/memory-store.ts";
import { expectKind } from "./broker.ts";
import { SegmentBodyCache } from "./segment-body-cache.ts";
import type { ShardLeader, ShardLeaderParams } from "./shard-leader.ts";

const SEG = "queues/jobs/0/seg/";
const HEAD = "queues/jobs/0.json";
const text = new TextDecoder();
const body = (i: number) => new TextEncoder().encode(`job-${i}-${"x".repeat(300)}`);

/** A leader with a 4 KiB tail (segments of ~7 messages), at most 20 sealed messages in memory, and a tiny page cache. */
function leader(
  store: MemoryStore,
  name: string,
  clock: ManualClock,
  options: { tailBytes: number; warmSealedMessages: number } = { tailBytes: 4096, warmSealedMessages: 20 },
  extra: Partial<ShardLeaderParams> = {},
) {
  return makeShardLeader(store, name, {
    clock,
    options,
    bodyCache: new SegmentBodyCache(2048),
    initialConfig: { leaseTtlMs: 30_000, maxAttempts: 1 },
    ...extra,
  });
}

async function enqueue(shard: ShardLeader, count: number) {
  for (let i = 0; i < count; i += 10) {
    const messages = Array.from({ length: Math.min(10, count - i) }, (_, k) => ({
      id: `m${i + k}`,
      payload: body(i + k),
    }));
    await shard.submit({ kind: "enqueue", messages });
  }
}

async function claim(shard: ShardLeader, max: number, subscription = "default"): Promise<ClaimedMessage[]> {
  const result = await shard.submit({ kind: "claim", subscription, workerId: "w", max });
  return [...expectKind(result, "claim").messages];
}

/** Claims and acks everything, `max` at a time; returns the ids in claim order (checking every body). */
async function drain(shard: ShardLeader, max: number, subscription = "default"): Promise<string[]> {
  const ids: string[] = [];
  for (
    let got = await claim(shard, max, subscription);
    got.length > 0;
    got = await claim(shard, max, subscription)
  ) {
    for (const m of got) expect(text.decode(m.payload)).toBe(text.decode(body(Number(m.id.slice(1)))));
    ids.push(...got.map((m) => m.id));
    await shard.submit({ kind: "ack", subscription, receipts: got.map((m) => m.receipt) });
  }
  return ids;
}

/** Segments the stored head references that are not in the store. */
async function referencedButMissing(store: MemoryStore): Promise<string[]> {
  const head = JSON.parse(text.decode((await store.get(HEAD))?.body));
  const listed = new Set((await store.list(SEG)).map((o) => o.key.slice(SEG.length)));
  return head.segments.map((ref: { name: string }) => ref.name).filter((n: string) => !listed.has(n));
}

const inOrder = (n: number) => Array.from({ length: n }, (_, i) => `m${i}`);

describe("cold segments: a backlog beyond the warm budget is not held in memory", () => {
  it("keeps only the budget of sealed messages in memory, and still serves every message in order", async () => {
    const store = new CountingStore(SEG, HEAD);
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    await enqueue(a, 300);
    const held = await a.read((state) => ({
      cold: state.coldSegments.length,
      messages: state.messages.size - state.tail.size,
      coldMessages: state.coldMessages,
    }));
    expect(held.cold).toBeGreaterThan(10);
    expect(held.messages).toBeLessThanOrEqual(20 + 10); // the budget (plus the segment that crossed it)
    expect(held.coldMessages + held.messages).toBeGreaterThan(250);
    const stats = await a.read((state) => state.segments.size);
    expect(stats).toBeGreaterThan(held.cold);
    expect(await drain(a, 25)).toEqual(inOrder(300));
  });

  it("a new leader reads only the segments its claims reach, and serves every message in order", async () => {
    const store = new CountingStore(SEG, HEAD);
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    await enqueue(a, 300);
    await a.stop({ release: true });
    const segments = JSON.parse(text.decode((await store.get(HEAD))?.body)).segments.length as number;
    store.gets = 0;
    const b = leader(store, "b", clock);
    const first = await claim(b, 5);
    expect(first.map((m) => m.id)).toEqual(inOrder(5));
    expect(store.gets).toBeLessThan(segments / 2);
    await b.submit({ kind: "ack", subscription: "default", receipts: first.map((m) => m.receipt) });
    expect(await drain(b, 40)).toEqual(inOrder(300).slice(5));
  });

  it("a purge and a subscription deletion warm every cold segment first, then act on all messages", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    await a.submit({ kind: "createSubscription", name: "audit" });
    await enqueue(a, 200);
    expect(await a.read((state) => state.coldSegments.length)).toBeGreaterThan(0);
    const purged = await a.submit({ kind: "purge", subscription: "default" });
    expect(expectKind(purged, "purge").messagesPurged).toBe(200);
    expect(await claim(a, 10)).toEqual([]);
    const deleted = await a.submit({ kind: "deleteSubscription", name: "audit" });
    expect(expectKind(deleted, "deleteSubscription").messagesDropped).toBe(200);
  });

  it("a redrive whose originals sit in cold segments gives them back to that subscription", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    await a.submit({ kind: "createSubscription", name: "audit" });
    await enqueue(a, 100);
    // audit dead-letters everything (max_attempts 1); default has not started.
    for (let got = await claim(a, 50, "audit"); got.length > 0; got = await claim(a, 50, "audit"))
      await a.submit({
        kind: "nack",
        subscription: "audit",
        receipts: got.map((m) => m.receipt),
        deadLetter: true,
      });
    await enqueue(a, 0);
    const redriven = await a.submit({ kind: "redrive", subscription: "audit" });
    expect(expectKind(redriven, "redrive").redriven).toBe(100);
    expect((await drain(a, 30, "audit")).sort()).toEqual(inOrder(100).sort());
    expect(await drain(a, 30)).toEqual(inOrder(100));
  });

  it("refuses the shard with data_loss when a cold segment a claim reaches is missing, and writes nothing after", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    await enqueue(a, 300);
    await a.stop({ release: true });
    const b = leader(store, "b", clock);
    await claim(b, 1);
    const coldName = await b.read((state) => state.coldSegments[0]?.name);
    expect(coldName).toBeDefined();
    await store.delete(SEG + coldName);
    let error: unknown;
    for (let i = 0; i < 100 && error === undefined; i++) {
      const got = await claim(b, 20).catch((e: unknown) => e);
      if (!Array.isArray(got)) error = got;
      else if (got.length > 0)
        error = await b
          .submit({ kind: "ack", subscription: "default", receipts: got.map((m) => m.receipt) })
          .then(
            () => undefined,
            (e: unknown) => e,
          );
    }
    expect(isCasqError(error, "data_loss"), String(error)).toBe(true);
    expect(b.currentMode).toBe("refused");
    const refusedAt = (await store.get(HEAD))?.etag;
    const again = await claim(b, 5).catch((e: unknown) => e);
    expect(isCasqError(again, "data_loss")).toBe(true);
    expect((await store.get(HEAD))?.etag).toBe(refusedAt);
  });

  it("a head write that fails while segments are cold loses nothing: the head never references a deleted segment", async () => {
    const store = new CountingStore(SEG, HEAD);
    const clock = new ManualClock();
    const options = { tailBytes: 4096, warmSealedMessages: 0 };
    const a = leader(store, "a", clock, options, {
      bodyCache: new SegmentBodyCache(1),
      initialConfig: { leaseTtlMs: 30_000, maxAttempts: 1, retentionMs: 0 },
    });
    const messages = Array.from({ length: 30 }, (_, i) => ({
      id: `m${i}`,
      payload: body(i),
      ...(i === 3 ? { priority: 9 } : {}),
    }));
    for (let i = 0; i < 30; i += 10) await a.submit({ kind: "enqueue", messages: messages.slice(i, i + 10) });
    const got = await claim(a, 1);
    expect(got.map((m) => m.id)).toEqual(["m3"]);
    await a.submit({
      kind: "nack",
      subscription: "default",
      receipts: got.map((m) => m.receipt),
      deadLetter: true,
    });
    await a.submit({ kind: "redrive", subscription: "default" }); // m3 back in the tail, inside a segment's range
    store.failGets = true;
    store.failPuts = 1;
    const more = Array.from({ length: 20 }, (_, i) => ({ id: `n${i}`, payload: body(100 + i) }));
    const failed = await a.submit({ kind: "enqueue", messages: more }).catch((e: unknown) => e);
    expect(isCasqError(failed, "unavailable"), String(failed)).toBe(true);
    store.failGets = false;
    await a.submit({ kind: "enqueue", messages: [{ id: "m999", payload: body(999) }] });
    expect(await referencedButMissing(store)).toEqual([]);
    await a.stop({ release: true });
    const b = leader(store, "b", clock, options);
    const ids = await drain(b, 50);
    expect(ids.filter((id) => id !== "m999").sort()).toEqual(inOrder(30).sort());
  });

  it("when the state cannot be rebuilt from the cached segments after a failed write, it is reloaded from the store", async () => {
    const store = new CountingStore(SEG, HEAD);
    const clock = new ManualClock();
    const a = leader(store, "a", clock, { tailBytes: 4096, warmSealedMessages: 1000 });
    await enqueue(a, 40);
    const first = await claim(a, 1); // its segment is touched: a rebuild needs it
    // The broker's cache of segment contents is lost (as after a reload that failed half-way).
    (a as unknown as { head: { segments: Map<string, unknown> } }).head.segments.clear();
    store.failPuts = 1;
    const failed = await a
      .submit({
        kind: "enqueue",
        messages: Array.from({ length: 20 }, (_, i) => ({ id: `m${40 + i}`, payload: body(40 + i) })),
      })
      .catch((e: unknown) => e);
    expect(isCasqError(failed, "unavailable"), String(failed)).toBe(true);
    await a.submit({ kind: "ack", subscription: "default", receipts: first.map((m) => m.receipt) });
    await a.submit({ kind: "enqueue", messages: [{ id: "m999", payload: body(999) }] });
    expect(await referencedButMissing(store)).toEqual([]);
    await a.stop({ release: true });
    const ids = await drain(leader(store, "b", clock), 50);
    expect(ids).toEqual([...inOrder(40).slice(1), "m999"]);
  });
});
