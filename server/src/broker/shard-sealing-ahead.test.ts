/**
 * Segments written ahead: once a head write lands with the tail at its
 * budget, the tail's messages are written into a segment in the background
 * (started the turn after that commit's answers, or by the next commit),
 * and the first commit after that write indexes it. Commits meanwhile do not
 * wait for it (a commit costs one head write even when it seals), unless the
 * tail reaches twice the budget. The head's dedup ids go into dedup segments
 * the same way.
 */
import { describe, expect, it } from "vitest";
import { flush } from "../../testing/broker-test-support.ts";
import { ManualClock } from "../../testing/manual-clock.ts";
import { MemoryStore } from "../store/memory-store.ts";
import type { CallOptions, PutCondition, PutResult } from "../store/object-store.ts";
import { seededRandom } from "../util/random.ts";
import { expectKind } from "./broker.ts";
import { ShardLeader } from "./shard-leader.ts";

const HEAD = "queues/jobs/0.json";
const SEG = "queues/jobs/0/seg/";
const TAIL_BYTES = 4096;
const body = (i: number) => new TextEncoder().encode(`job-${i}-${"x".repeat(200)}`);

/** A memory store that holds every segment PUT while `holding` (heads go through). */
class SegmentGate extends MemoryStore {
  holding = true;
  private held: (() => void)[] = [];
  /** Keys of the segment PUTs held so far. */
  readonly heldKeys: string[] = [];

  get heldPuts(): number {
    return this.held.length;
  }

  release(): void {
    this.holding = false;
    for (const go of this.held.splice(0)) go();
  }

  override async put(
    key: string,
    body: Uint8Array,
    condition: PutCondition,
    options?: CallOptions,
  ): Promise<PutResult> {
    if (key.startsWith(SEG) && this.holding) {
      this.heldKeys.push(key);
      await new Promise<void>((resolve) => this.held.push(resolve));
    }
    return super.put(key, body, condition, options);
  }
}

function leader(store: MemoryStore, clock = new ManualClock(), tailBytes = TAIL_BYTES) {
  return new ShardLeader({
    store,
    queue: "jobs",
    shard: 0,
    identity: { id: "broker-a", address: "a:50051" },
    clock,
    random: seededRandom(1),
    options: { tailBytes },
  });
}

let next = 0;
function enqueue(shard: ShardLeader, count: number) {
  const messages = Array.from({ length: count }, () => {
    const i = next++;
    return { id: `m${i}`, payload: body(i) };
  });
  return shard.submit({ kind: "enqueue", messages });
}

/** Enqueues one message a commit until the tail reaches its budget and a segment write starts; returns how many. */
async function fillTail(shard: ShardLeader, store: SegmentGate): Promise<number> {
  let n = 0;
  while (store.heldPuts === 0) {
    await enqueue(shard, 1);
    await flush(); // the write ahead starts once the commit's answers are out
    n += 1;
  }
  return n;
}

/** How many one-job commits start the segment write of a full tail (on a leader of its own); `next` starts over. */
async function commitsToFillTail(): Promise<number> {
  next = 0;
  const probe = new SegmentGate();
  const p = leader(probe);
  const n = await fillTail(p, probe);
  probe.release();
  await p.stop({ release: false });
  next = 0;
  return n;
}

/** The first `n - 1` of the `n` one-job commits that fill the tail: no segment is written yet. */
async function enqueueAllButTheLast(shard: ShardLeader, store: SegmentGate, n: number): Promise<void> {
  for (let i = 0; i < n - 1; i++) {
    await enqueue(shard, 1);
    await flush();
  }
  expect(store.heldPuts).toBe(0);
}

/** Expects `commit` not to land while the one held segment write is held, and to land once it is released. */
async function expectWaitsForHeldSegment(store: SegmentGate, commit: Promise<unknown>): Promise<void> {
  let landed = false;
  const waiting = commit.then(() => {
    landed = true;
  });
  await flush();
  expect(landed).toBe(false);
  expect(store.heldPuts).toBe(1);
  store.release();
  await waiting;
}

async function head(store: MemoryStore) {
  const stored = await store.get(HEAD);
  if (!stored) throw new Error("no head");
  return JSON.parse(new TextDecoder().decode(stored.body)) as {
    segments: { name: string; first: number; last: number; count: number; gone: number[][] }[];
    messages: { offset: number }[];
    dedup?: { dedup_id: string }[];
    dedup_segments?: { name: string; first: number; last: number; count: number }[];
  };
}

describe("segments written ahead of the head", () => {
  it("commits go on while the segment of a full tail is written; the first commit after it indexes it", async () => {
    next = 0;
    const store = new SegmentGate();
    const a = leader(store);
    const n = await fillTail(a, store);
    // The segment write is held, and commits still land (they would wait for it if sealing were inline).
    await enqueue(a, 1);
    await enqueue(a, 1);
    expect((await head(store)).segments).toEqual([]);
    expect((await head(store)).messages).toHaveLength(n + 2);
    store.release();
    await flush();
    await enqueue(a, 1);
    const doc = await head(store);
    expect(doc.segments).toHaveLength(1);
    const [seg] = doc.segments;
    expect(seg).toMatchObject({ first: 0, last: n - 1, count: n, gone: [] });
    // Every message exactly once: the segment's, the rest still in the tail.
    expect(doc.messages.map((m) => m.offset)).toEqual([n, n + 1, n + 2]);
    expect((await store.list(SEG)).map((e) => e.key)).toEqual([SEG + seg?.name]);
    await a.stop({ release: true });
  });

  it("messages that left the tail while their segment was written are gone in it from the start", async () => {
    next = 0;
    const store = new SegmentGate();
    const a = leader(store);
    const n = await fillTail(a, store);
    // The five oldest are claimed and acked (retention 0: they leave the shard) meanwhile.
    const claim = expectKind(
      await a.submit({ kind: "claim", subscription: "default", workerId: "w", max: 5 }),
      "claim",
    );
    await a.submit({ kind: "ack", subscription: "default", receipts: claim.messages.map((m) => m.receipt) });
    store.release();
    await flush();
    await enqueue(a, 1);
    const doc = await head(store);
    expect(doc.segments).toHaveLength(1);
    expect(doc.segments[0]).toMatchObject({ first: 0, last: n - 1, count: n, gone: [[0, 4]] });
    // A new leader reads it back and serves exactly the 15 left and the new one, in order.
    await a.stop({ release: true });
    const b = leader(store);
    const ids: string[] = [];
    for (;;) {
      const got = expectKind(
        await b.submit({ kind: "claim", subscription: "default", workerId: "w", max: 50 }),
        "claim",
      );
      if (got.messages.length === 0) break;
      ids.push(...got.messages.map((m) => m.id));
      await b.submit({ kind: "ack", subscription: "default", receipts: got.messages.map((m) => m.receipt) });
    }
    expect(ids).toEqual(Array.from({ length: n - 4 }, (_, i) => `m${i + 5}`));
    await b.stop({ release: true });
  });

  it("a release writes no segment ahead, though its batch fills the tail", async () => {
    const n = await commitsToFillTail();
    const store = new SegmentGate();
    const a = leader(store);
    await enqueueAllButTheLast(a, store, n);
    store.release(); // segment writes go through from here on
    const last = enqueue(a, 1); // rides in the releasing write
    await a.stop({ release: true });
    await last;
    expect(await store.list(SEG)).toEqual([]);
    expect((await head(store)).messages).toHaveLength(n);
  });

  it("the answers of the commit that fills the tail go out before its segment is encoded and written ahead", async () => {
    const n = await commitsToFillTail();
    const store = new SegmentGate();
    const a = leader(store);
    await enqueueAllButTheLast(a, store, n);
    await enqueue(a, 1); // answered: its segment is not started yet
    expect(store.heldPuts).toBe(0);
    await flush();
    expect(store.heldPuts).toBe(1);
    store.release();
    await a.stop({ release: true });
  });

  it("a commit that would take the tail past twice the budget waits for the segment being written", async () => {
    next = 0;
    const store = new SegmentGate();
    const a = leader(store);
    const n = await fillTail(a, store);
    // This one takes the tail past twice the budget.
    await expectWaitsForHeldSegment(store, enqueue(a, n + 1));
    const doc = await head(store);
    expect(doc.segments[0]).toMatchObject({ first: 0, last: n - 1, count: n });
    await a.stop({ release: true });
  });
});

/** A leader whose message tail never fills (256 KiB): only its dedup ids (a 16 KiB budget at first) are sealed. */
function dedupLeader(store: MemoryStore, clock = new ManualClock()) {
  return leader(store, clock, 256 * 1024);
}

const dedupOf = (i: number) => `dedup-${i}-7b3d5c8a-9e2f-4a1c-b0d1`;

async function enqueueDeduped(shard: ShardLeader, i: number, id = `m${i}`) {
  const r = expectKind(
    await shard.submit({ kind: "enqueue", messages: [{ id, payload: body(i), dedupId: dedupOf(i) }] }),
    "enqueue",
  );
  return r.results[0];
}

/** Enqueues one deduped message a commit until a dedup segment write starts; returns how many. */
async function fillDedup(shard: ShardLeader, store: SegmentGate): Promise<number> {
  let n = 0;
  while (store.heldPuts === 0) {
    await enqueueDeduped(shard, n++);
    await flush(); // the write ahead starts once the commit's answers are out
  }
  expect(store.heldKeys).toEqual([expect.stringMatching(/\.dedup\.json$/)]);
  return n;
}

describe("dedup segments written ahead of the head", () => {
  it("commits go on while the dedup segment is written; the first commit after it indexes it", async () => {
    const store = new SegmentGate();
    const a = dedupLeader(store);
    const n = await fillDedup(a, store);
    // Held, and commits still land (with the segment written inside the commit they would wait).
    await enqueueDeduped(a, n);
    await enqueueDeduped(a, n + 1);
    let doc = await head(store);
    expect(doc.dedup_segments ?? []).toEqual([]);
    expect(doc.dedup).toHaveLength(n + 2);
    store.release();
    await flush();
    await enqueueDeduped(a, n + 2);
    doc = await head(store);
    expect(doc.dedup_segments).toEqual([expect.objectContaining({ first: 0, last: n - 1, count: n })]);
    expect(doc.dedup).toHaveLength(3); // the newer ids stay in the head
    expect((await store.list(SEG)).map((e) => e.key)).toEqual(store.heldKeys);
    // Every id is still remembered, sealed or not, by this leader and by the next.
    expect(await enqueueDeduped(a, 0)).toEqual({ id: "m0", offset: 0, duplicate: true });
    await a.stop({ release: true });
    const b = dedupLeader(store);
    for (const i of [0, n - 1, n, n + 2])
      expect(await enqueueDeduped(b, i)).toEqual({ id: `m${i}`, offset: i, duplicate: true });
    await b.stop({ release: true });
  });

  it("a dedup segment whose ids expired while it was written is deleted, not indexed", async () => {
    const store = new SegmentGate();
    const clock = new ManualClock();
    const a = dedupLeader(store, clock);
    const n = await fillDedup(a, store);
    // The whole window passes while the write is held: the next commit forgets every id.
    clock.advance(300_001);
    await enqueueDeduped(a, n);
    store.release();
    await flush();
    await enqueueDeduped(a, n + 1);
    await flush();
    const doc = await head(store);
    expect(doc.dedup_segments ?? []).toEqual([]);
    expect(doc.dedup?.map((e) => e.dedup_id)).toEqual([dedupOf(n), dedupOf(n + 1)]);
    expect(await store.list(SEG)).toEqual([]);
    // The forgotten ids are new again.
    const again = await enqueueDeduped(a, 0, "m0-again");
    expect(again).toMatchObject({ id: "m0-again" });
    expect(again?.duplicate).toBeFalsy();
    await a.stop({ release: true });
    // A takeover reads a head that references no deleted object.
    const b = dedupLeader(store, clock);
    expect(await enqueueDeduped(b, 0, "m0-third")).toMatchObject({ id: "m0-again", duplicate: true });
    await b.stop({ release: true });
  });

  it("ids that would pass twice their budget wait for the dedup segment being written", async () => {
    const store = new SegmentGate();
    const a = dedupLeader(store);
    const n = await fillDedup(a, store);
    const messages = Array.from({ length: n + 1 }, (_, k) => ({
      id: `m${n + k}`,
      payload: body(n + k),
      dedupId: dedupOf(n + k),
    }));
    await expectWaitsForHeldSegment(store, a.submit({ kind: "enqueue", messages }));
    const doc = await head(store);
    expect(doc.dedup_segments?.[0]).toMatchObject({ first: 0, last: n - 1, count: n });
    await a.stop({ release: true });
  });
});
