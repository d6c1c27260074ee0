import { describe, expect, it } from "vitest";
import { makeShardLeader } from "../../testing/broker-test-support.ts";
import { ManualClock } from "../../testing/manual-clock.ts";
import { isCasqError } from "../errors.ts";
import type { ClaimedMessage } from "../model/operations.ts";
import { MemoryStore } from "../store/memory-store.ts";
import { expectKind } from "./broker.ts";
import { SegmentBodyCache } from "./segment-body-cache.ts";
import type { ShardLeader } from "./shard-leader.ts";

const SEG = "queues/jobs/0/seg/";
const HEAD = "queues/jobs/0.json";
const text = new TextDecoder();
const body = (i: number) => new TextEncoder().encode(`job-${i}-${"x".repeat(300)}`);
/** Segments per index segment in these tests. */
const SIZE = 4;

/** A leader with a 4 KiB tail (segments of ~7 messages), index segments of 4 segments, and a small page cache. */
function leader(store: MemoryStore, name: string, clock: ManualClock, warmSealedMessages = 20) {
  return makeShardLeader(store, name, {
    clock,
    options: { tailBytes: 4096, warmSealedMessages, indexSegmentSize: SIZE },
    bodyCache: new SegmentBodyCache(4096),
    initialConfig: { leaseTtlMs: 30_000, maxAttempts: 1 },
  });
}

/** Enqueues `count` messages from `from`, one per commit (as single-job producers build a backlog). */
async function enqueue(shard: ShardLeader, from: number, count: number) {
  for (let i = from; i < from + count; i++)
    await shard.submit({ kind: "enqueue", messages: [{ id: `m${i}`, payload: body(i) }] });
}

async function claim(shard: ShardLeader, max: number): Promise<ClaimedMessage[]> {
  const result = await shard.submit({ kind: "claim", subscription: "default", workerId: "w", max });
  return [...expectKind(result, "claim").messages];
}

/** Claims and acks everything, `max` at a time; returns the ids in claim order (checking every body). */
async function drain(shard: ShardLeader, max: number): Promise<string[]> {
  const ids: string[] = [];
  for (let got = await claim(shard, max); got.length > 0; got = await claim(shard, max)) {
    for (const m of got) expect(text.decode(m.payload)).toBe(text.decode(body(Number(m.id.slice(1)))));
    ids.push(...got.map((m) => m.id));
    await shard.submit({ kind: "ack", subscription: "default", receipts: got.map((m) => m.receipt) });
  }
  return ids;
}

interface HeadView {
  readonly segments: { name: string; first: number }[];
  readonly index_segments?: { name: string; first: number; last: number; count: number }[];
}

async function head(store: MemoryStore): Promise<HeadView> {
  return JSON.parse(text.decode((await store.get(HEAD))?.body)) as HeadView;
}

async function objects(store: MemoryStore, suffix: string): Promise<string[]> {
  return (await store.list(SEG)).map((o) => o.key.slice(SEG.length)).filter((n) => n.endsWith(suffix));
}

/** Every segment the stored head references, itself and through its index segments (read from the store). */
async function allReferenced(store: MemoryStore): Promise<string[]> {
  const doc = await head(store);
  const names = doc.segments.map((s) => s.name);
  for (const idx of doc.index_segments ?? []) {
    const stored = JSON.parse(text.decode((await store.get(SEG + idx.name))?.body));
    expect(stored.format).toBe("casq.segindex.v1");
    expect(stored.segments).toHaveLength(idx.count);
    names.push(...stored.segments.map((s: { name: string }) => s.name));
  }
  return names;
}

const inOrder = (from: number, n: number) => Array.from({ length: n }, (_, i) => `m${from + i}`);

describe("index segments: a head lists a bounded number of segment entries, however many segments", () => {
  it("moves the entries of untouched segments into index segments, and serves every message in order", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    await enqueue(a, 0, 400);
    const doc = await head(store);
    const indexes = doc.index_segments ?? [];
    expect(indexes.length).toBeGreaterThanOrEqual(5);
    // At most twice the size listed by the head, plus what sealed since the last index segment was taken.
    expect(doc.segments.length).toBeLessThanOrEqual(3 * SIZE);
    for (const idx of indexes) expect(idx.count).toBe(SIZE);
    const referenced = await allReferenced(store);
    const segmentObjects = (await store.list(SEG)).map((o) => o.key.slice(SEG.length));
    for (const name of referenced) expect(segmentObjects).toContain(name);
    expect(new Set(referenced).size).toBe(referenced.length);
    expect(await a.read((state) => state.segments.size)).toBe(referenced.length);
    expect(await drain(a, 25)).toEqual(inOrder(0, 400));
  });

  it("a new leader reads the index segments and serves every message; drained, no index segment is left", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    await enqueue(a, 0, 300);
    await a.stop({ release: true });
    expect((await head(store)).index_segments?.length ?? 0).toBeGreaterThan(2);
    const b = leader(store, "b", clock);
    const first = await claim(b, 5);
    expect(first.map((m) => m.id)).toEqual(inOrder(0, 5));
    await b.submit({ kind: "ack", subscription: "default", receipts: first.map((m) => m.receipt) });
    expect(await drain(b, 30)).toEqual(inOrder(5, 295));
    await b.stop({ release: true });
    expect((await head(store)).index_segments).toBeUndefined();
    expect(await objects(store, ".index.json")).toEqual([]);
    expect(await objects(store, ".json")).toEqual([]);
  });

  it("claims that reach an indexed segment dissolve its index segment: the head lists its entries again, and the object goes", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock, 100_000);
    await enqueue(a, 0, 400);
    const before = await head(store);
    const lowest = (before.index_segments ?? [])[0];
    expect(lowest).toBeDefined();
    // Claim and ack every message below the lowest index segment, then the first one in it.
    const below = lowest?.first ?? 0;
    const got: ClaimedMessage[] = [];
    while (got.length < below + 1) got.push(...(await claim(a, below + 1 - got.length)));
    await a.submit({ kind: "ack", subscription: "default", receipts: got.map((m) => m.receipt) });
    const after = await head(store);
    expect((after.index_segments ?? []).map((i) => i.name)).not.toContain(lowest?.name);
    await a.stop({ release: true });
    expect(await objects(store, ".index.json")).not.toContain(lowest?.name);
    // Its first segment, one message gone, is listed by the head itself now.
    expect(after.segments.some((s) => s.first === lowest?.first)).toBe(true);
    expect(await drain(leader(store, "b", clock), 50)).toEqual(inOrder(below + 1, 400 - below - 1));
  });

  it("a missing index segment refuses the shard with data_loss, and its head is not overwritten", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    await enqueue(a, 0, 300);
    await a.stop({ release: true });
    const name = (await head(store)).index_segments?.[1]?.name as string;
    await store.delete(SEG + name);
    const before = await store.get(HEAD);
    const b = leader(store, "b", clock);
    const error = await b.submit({ kind: "enqueue", messages: [{ id: "x", payload: body(0) }] }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isCasqError(error, "data_loss"), String(error)).toBe(true);
    expect(String(error)).toContain(`index segment ${SEG}${name}`);
    expect(String(error)).toContain("is missing");
    clock.advance(60_000);
    await b.read(() => undefined).catch(() => undefined);
    const after = await store.get(HEAD);
    expect(after?.etag).toBe(before?.etag);
  });

  it("a takeover sweeps an unreferenced index segment of an earlier epoch, and keeps the referenced ones", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    await enqueue(a, 0, 300);
    await a.stop({ release: true });
    const referenced = (await head(store)).index_segments?.map((i) => i.name) ?? [];
    const orphan = `${"0".repeat(15)}99999-1-zzz.index.json`;
    await store.put(SEG + orphan, new TextEncoder().encode("{}"), { ifAbsent: true });
    const b = leader(store, "b", clock);
    await b.submit({ kind: "enqueue", messages: [{ id: "x", payload: body(0) }] });
    await b.stop({ release: true });
    const left = await objects(store, ".index.json");
    expect(left).not.toContain(orphan);
    for (const name of referenced) expect(left).toContain(name);
    expect(await drain(leader(store, "c", clock), 50)).toHaveLength(301);
  });

  /**
   * A shard of 300 single-job enqueues whose stored head `edit` then rewrites: what a new leader's
   * first call fails with.
   */
  async function refusalOfEditedHead(
    edit: (doc: Record<string, unknown[]>, store: MemoryStore) => Promise<void>,
  ) {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    await enqueue(a, 0, 300);
    await a.stop({ release: true });
    const stored = await store.get(HEAD);
    const doc = JSON.parse(text.decode(stored?.body));
    expect(doc.index_segments.length).toBeGreaterThan(0);
    await edit(doc, store);
    await store.put(HEAD, new TextEncoder().encode(JSON.stringify(doc)), { ifMatch: stored?.etag ?? "" });
    const error = await leader(store, "b", clock)
      .submit({ kind: "enqueue", messages: [{ id: "x", payload: body(0) }] })
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(isCasqError(error, "data_loss"), String(error)).toBe(true);
    return String(error);
  }

  it("a head that lists a segment its index segment lists too is refused with data_loss", async () => {
    const error = await refusalOfEditedHead(async (doc, store) => {
      const idx = doc.index_segments?.[0] as { name: string };
      const listed = JSON.parse(text.decode((await store.get(SEG + idx.name))?.body)).segments;
      doc.segments = [...(doc.segments ?? []), listed[0]].sort(
        (x, y) => (x as { first: number }).first - (y as { first: number }).first,
      );
    });
    expect(error).toContain("overlaps");
  });

  it("a head that lists its own segments out of order is refused with data_loss, index segments or not", async () => {
    const error = await refusalOfEditedHead(async (doc) => {
      expect(doc.segments?.length).toBeGreaterThan(1);
      doc.segments?.reverse();
    });
    expect(error).toContain("not in ascending offset order");
  });
});
