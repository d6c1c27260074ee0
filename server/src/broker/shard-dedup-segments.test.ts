import { describe, expect, it } from "vitest";
import { flush } from "../../testing/broker-test-support.ts";
import { ManualClock } from "../../testing/manual-clock.ts";
import { isCasqError } from "../errors.ts";
import { MemoryStore } from "../store/memory-store.ts";
import type { CallOptions, StoredObject } from "../store/object-store.ts";
import { UnavailableError } from "../store/store-errors.ts";
import { seededRandom } from "../util/random.ts";
import { expectKind } from "./broker.ts";
import { type CommitOptions, ShardLeader } from "./shard-leader.ts";

const HEAD = "queues/jobs/0.json";
const SEG = "queues/jobs/0/seg/";
const MIB = 1024 * 1024;
const WINDOW = 300_000; // the default dedup window
const payload = new TextEncoder().encode("small job payload");
/** Like an SDK producer's default: a random-looking dedup id on every message. */
const dedupOf = (i: number) =>
  `${(i * 2654435761).toString(16).padStart(12, "0")}-dedup-${i}-4a1c-9e2f-7b3d5c8a`;

function leader(
  store: MemoryStore,
  name: string,
  clock: ManualClock,
  tailBytes = 256 * 1024,
  options: Partial<CommitOptions> = {},
) {
  return new ShardLeader({
    store,
    queue: "jobs",
    shard: 0,
    identity: { id: `broker-${name}`, address: `${name}:50051` },
    clock,
    random: seededRandom(name.length),
    options: { tailBytes, ...options },
  });
}

async function enqueue(shard: ShardLeader, from: number, count: number, batch = 10) {
  const results = [];
  for (let i = from; i < from + count; i += batch) {
    const messages = Array.from({ length: Math.min(batch, from + count - i) }, (_, k) => ({
      id: `msg-${i + k}`,
      payload,
      dedupId: dedupOf(i + k),
    }));
    const r = expectKind(await shard.submit({ kind: "enqueue", messages }), "enqueue");
    results.push(...r.results);
  }
  return results;
}

async function head(store: MemoryStore) {
  const stored = await store.get(HEAD);
  if (!stored) throw new Error("no head");
  return { doc: JSON.parse(new TextDecoder().decode(stored.body)), bytes: stored.body.byteLength };
}

async function dedupKeys(store: MemoryStore) {
  return (await store.list(SEG)).map((e) => e.key).filter((k) => k.endsWith(".dedup.json"));
}

async function drain(shard: ShardLeader) {
  let n = 0;
  for (;;) {
    const claim = expectKind(
      await shard.submit({ kind: "claim", subscription: "default", workerId: "w", max: 100 }),
      "claim",
    );
    if (claim.messages.length === 0) return n;
    n += claim.messages.length;
    await shard.submit({
      kind: "ack",
      subscription: "default",
      receipts: claim.messages.map((m) => m.receipt),
    });
  }
}

/** What `promise` rejects with (undefined when it resolves). */
const errorOf = (promise: Promise<unknown>): Promise<unknown> =>
  promise.then(
    () => undefined,
    (e: unknown) => e,
  );

/** A duplicate of message `i`: answered with the original, nothing stored. */
async function expectDuplicate(shard: ShardLeader, i: number, store: MemoryStore) {
  const before = (await head(store)).doc.next_offset;
  const r = expectKind(
    await shard.submit({ kind: "enqueue", messages: [{ id: `retry-${i}`, payload, dedupId: dedupOf(i) }] }),
    "enqueue",
  );
  expect(r.results).toEqual([{ id: `msg-${i}`, offset: i, duplicate: true }]);
  expect((await head(store)).doc.next_offset).toBe(before);
}

describe("shard format v2: dedup ids in dedup segments", () => {
  it("keeps the head under 1 MiB with a dedup id on each of 200k messages enqueued within the window", async () => {
    /** The most bytes of sealed dedup ids `watched` held in memory when a dedup segment was read. */
    let watched: ShardLeader | undefined;
    let mostResident = 0;
    class WatchingStore extends MemoryStore {
      override async get(key: string, options?: CallOptions): Promise<StoredObject | undefined> {
        if (watched !== undefined && key.endsWith(".dedup.json"))
          mostResident = Math.max(mostResident, watched.dedupIdStats.residentBytes);
        return super.get(key, options);
      }
    }
    const store = new WatchingStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    let largest = 0;
    for (let i = 0; i < 200_000; i += 1000) {
      await enqueue(a, i, 1000, 1000);
      clock.advance(1); // all 200k within one window
      largest = Math.max(largest, (await head(store)).bytes);
    }
    expect(largest).toBeLessThan(MIB);
    const { doc } = await head(store);
    expect(doc.next_offset).toBe(200_000);
    expect(doc.dedup_segments.length).toBeGreaterThan(50);
    const sealed = doc.dedup_segments.reduce((n: number, s: { count: number }) => n + s.count, 0);
    expect(sealed + doc.dedup.length).toBe(200_000);
    expect(await a.read((s) => s.recentDedupSize)).toBeLessThanOrEqual(256 * 1024);
    await expectDuplicate(a, 0, store);
    await expectDuplicate(a, 123_457, store);
    await a.stop({ release: true });
    // a takeover reads the dedup segments and still refuses every old id, never holding more
    // than its budget of ids (2 MiB; the 200k ids are ~11 MB) and the segment it is reading
    const b = leader(store, "b", clock);
    watched = b;
    await b.submit({ kind: "enqueue", messages: [{ id: "new-0", payload, dedupId: "new-0" }] }); // the load only
    watched = undefined;
    expect(mostResident).toBeGreaterThan(MIB); // ids paged out while the segments were read ...
    expect(mostResident).toBeLessThan(2 * MIB + 256 * 1024); // ... at the budget
    await expectDuplicate(b, 1, store);
    await expectDuplicate(b, 199_999, store);
    expect(await b.read((s) => s.dedup.size)).toBe(200_001);
    await b.stop({ release: true });
  }, 60_000);

  it("keeps few dedup ids in the head while the window holds few, and seals larger dedup segments as it fills", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock); // the default tail budget, 256 KiB
    await enqueue(a, 0, 300);
    let { doc } = await head(store);
    // 300 ids are ~40 KiB: past the 16 KiB a shard with no dedup segments keeps in its head.
    expect(doc.dedup_segments.length).toBeGreaterThanOrEqual(1);
    expect(await a.read((s) => s.recentDedupSize)).toBeLessThanOrEqual(16 * 1024 + 2048);
    await enqueue(a, 300, 19_700, 50);
    ({ doc } = await head(store));
    const counts: number[] = doc.dedup_segments.map((s: { count: number }) => s.count);
    // With ~2.5 MB of ids sealed, a balanced budget is ~34 KiB: segments twice the first ones.
    expect(counts.at(-1)).toBeGreaterThan(1.5 * (counts[0] as number));
    expect(await a.read((s) => s.recentDedupSize)).toBeLessThan(64 * 1024);
    await expectDuplicate(a, 7, store);
    await expectDuplicate(a, 19_999, store);
    await a.stop({ release: true });
  });

  it("refuses a duplicate of a sealed message after a takeover, a restart, and after it was acked and its segment collected", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock, 2048);
    await enqueue(a, 0, 200);
    let { doc } = await head(store);
    expect(doc.segments.length).toBeGreaterThan(0);
    expect(doc.dedup_segments.length).toBeGreaterThan(0);
    await expectDuplicate(a, 3, store);
    await a.stop({ release: true });

    const b = leader(store, "b", clock, 2048); // takeover
    await expectDuplicate(b, 4, store);
    expect(await drain(b)).toBe(200);
    await b.stop({ release: true });
    ({ doc } = await head(store));
    expect(doc.segments).toEqual([]); // every message acked: message segments retired ...
    expect((await store.list(SEG)).filter((e) => !e.key.endsWith(".dedup.json"))).toEqual([]); // ... and deleted
    expect(doc.messages).toEqual([]);

    const c = leader(store, "c", clock, 2048); // takeover after the GC
    await expectDuplicate(c, 5, store);
    await expectDuplicate(c, 199, store);
    await c.stop({ release: false }); // a crash: the lease is not released
    clock.advance(60_000);
    const restarted = leader(store, "c", clock, 2048); // the same broker, restarted
    await expectDuplicate(restarted, 6, store);
    await restarted.stop({ release: true });
    clock.advance(WINDOW);
    const d = leader(store, "d", clock, 2048);
    const late = expectKind(
      await d.submit({ kind: "enqueue", messages: [{ id: "late-7", payload, dedupId: dedupOf(7) }] }),
      "enqueue",
    );
    expect(late.results[0]?.duplicate).toBe(false); // the window passed
    await d.stop({ release: true });
  });

  it("retires and deletes dedup segments once all their ids expired; a takeover reads only live ones", async () => {
    class CountingStore extends MemoryStore {
      dedupReads = 0;
      override async get(key: string, options?: CallOptions): Promise<StoredObject | undefined> {
        if (key.endsWith(".dedup.json")) this.dedupReads += 1;
        return super.get(key, options);
      }
    }
    const store = new CountingStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock, 2048);
    await enqueue(a, 0, 100);
    await flush(); // the last commit's dedup segment is written ahead once its answers are out
    const early = await dedupKeys(store);
    expect(early.length).toBeGreaterThan(1);
    clock.advance(WINDOW / 2);
    await enqueue(a, 100, 100);
    await a.stop({ release: true });
    const all = await dedupKeys(store);

    // past the first half's window: a takeover skips the expired dedup segments
    clock.advance(WINDOW / 2);
    store.dedupReads = 0;
    const b = leader(store, "b", clock, 2048);
    await b.submit({ kind: "enqueue", messages: [{ id: "x", payload }] }); // a commit: expire runs
    expect(store.dedupReads).toBe(all.length - early.length);
    await b.stop({ release: true }); // waits for background deletions
    const { doc } = await head(store);
    const left = await dedupKeys(store);
    for (const key of early) expect(left).not.toContain(key);
    expect(left.sort()).toEqual(doc.dedup_segments.map((s: { name: string }) => SEG + s.name).sort());
    expect(left.length).toBeGreaterThan(0);

    // past every window: all gone, from the head and the store
    clock.advance(WINDOW);
    const c = leader(store, "c", clock, 2048);
    await c.submit({ kind: "enqueue", messages: [{ id: "y", payload }] });
    await c.stop({ release: true });
    expect((await head(store)).doc.dedup_segments).toBeUndefined();
    expect(await dedupKeys(store)).toEqual([]);
  });

  it("keeps the ids of few dedup segments in memory and reads one back for a duplicate; a failed read stores nothing", async () => {
    class FlakyStore extends MemoryStore {
      dedupReads = 0;
      failDedupReads = false;
      override async get(key: string, options?: CallOptions): Promise<StoredObject | undefined> {
        if (key.endsWith(".dedup.json")) {
          this.dedupReads += 1;
          if (this.failDedupReads) throw new UnavailableError(key, "injected");
        }
        return super.get(key, options);
      }
    }
    const store = new FlakyStore();
    const clock = new ManualClock();
    // ids of a few dedup segments in memory (each holds ~2 KiB of ids)
    const a = leader(store, "a", clock, 2048, { residentDedupIdBytes: 5_000 });
    await enqueue(a, 0, 300);
    const { doc } = await head(store);
    expect(doc.dedup_segments.length).toBeGreaterThan(5);
    await a.submit({ kind: "enqueue", messages: [{ id: "fresh-0", payload, dedupId: "fresh-0" }] });
    const resident = a.dedupIdStats;
    expect(resident.residentBytes).toBeLessThanOrEqual(5_000 + 3_000); // the budget, and what the last commit sealed
    expect(resident.chunks).toBeLessThan(doc.dedup_segments.length);
    // new ids need no read; the duplicate of an early message reads its segment back, once
    expect(store.dedupReads).toBe(0);
    await a.submit({ kind: "enqueue", messages: [{ id: "fresh-1", payload, dedupId: "fresh-1" }] });
    expect(store.dedupReads).toBe(0);
    await expectDuplicate(a, 3, store);
    expect(store.dedupReads).toBe(1);
    await expectDuplicate(a, 4, store); // same segment, still in memory
    expect(store.dedupReads).toBe(1);
    // push it out again, then fail its read: unavailable, nothing stored
    await enqueue(a, 300, 100);
    store.failDedupReads = true;
    const before = (await head(store)).doc.next_offset;
    // in one batch with another enqueue, which is not held up by it
    const [error, other] = await Promise.all([
      errorOf(a.submit({ kind: "enqueue", messages: [{ id: "retry-3", payload, dedupId: dedupOf(3) }] })),
      a.submit({ kind: "enqueue", messages: [{ id: "fresh-2", payload, dedupId: "fresh-2" }] }),
    ]);
    expect(isCasqError(error, "unavailable"), String(error)).toBe(true);
    expect(String(error)).toContain("nothing was stored");
    expect(expectKind(other, "enqueue").results).toEqual([
      { id: "fresh-2", offset: before, duplicate: false },
    ]);
    expect((await head(store)).doc.next_offset).toBe(before + 1);
    store.failDedupReads = false;
    await expectDuplicate(a, 3, store);
    // a dedup segment lost while its ids are paged out: the shard is refused, nothing overwritten
    await enqueue(a, 400, 100);
    await store.delete(SEG + doc.dedup_segments[0].name);
    const etag = (await store.get(HEAD))?.etag;
    const lost = await errorOf(
      a.submit({ kind: "enqueue", messages: [{ id: "retry-0", payload, dedupId: dedupOf(0) }] }),
    );
    expect(isCasqError(lost, "data_loss"), String(lost)).toBe(true);
    expect(String(lost)).toContain("dedup segment");
    expect((await store.get(HEAD))?.etag).toBe(etag);
    await a.stop({ release: false });
  });

  it("keeps the ids a lookup uses; reads back several segments of one batch, one failing alone", async () => {
    class FlakyStore extends MemoryStore {
      dedupReads = 0;
      failing: string | undefined;
      override async get(key: string, options?: CallOptions): Promise<StoredObject | undefined> {
        if (key.endsWith(".dedup.json")) {
          this.dedupReads += 1;
          if (key === this.failing) throw new UnavailableError(key, "injected");
        }
        return super.get(key, options);
      }
    }
    const store = new FlakyStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock, 2048, { residentDedupIdBytes: 5_000 });
    await enqueue(a, 0, 300);
    // the same id again and again while new segments are sealed: read back once, then kept as used
    for (let round = 0; round < 10; round++) {
      await expectDuplicate(a, 3, store);
      await enqueue(a, 300 + round * 40, 40);
    }
    expect(store.dedupReads).toBe(1);
    // duplicates from two paged-out segments in one batch, one of them unreadable
    const { doc } = await head(store);
    const segOf = (i: number) =>
      doc.dedup_segments.find((seg: { first: number; last: number }) => seg.first <= i && i <= seg.last).name;
    expect(segOf(100)).not.toBe(segOf(200));
    store.failing = SEG + segOf(200);
    const [first, second] = await Promise.all([
      a.submit({ kind: "enqueue", messages: [{ id: "again-100", payload, dedupId: dedupOf(100) }] }),
      errorOf(a.submit({ kind: "enqueue", messages: [{ id: "again-200", payload, dedupId: dedupOf(200) }] })),
    ]);
    expect(expectKind(first, "enqueue").results).toEqual([{ id: "msg-100", offset: 100, duplicate: true }]);
    expect(isCasqError(second, "unavailable"), String(second)).toBe(true);
    expect(a.currentMode).toBe("leading");
    await a.stop({ release: true });
  });

  it("a deposed leader that meets a dedup segment its successor deleted is not refused with data_loss", async () => {
    const store = new MemoryStore();
    const early = new ManualClock();
    const events: string[] = [];
    const a = new ShardLeader({
      store,
      queue: "jobs",
      shard: 0,
      identity: { id: "broker-a", address: "a:50051" },
      clock: early,
      random: seededRandom(1),
      options: { tailBytes: 2048, residentDedupIdBytes: 0 },
      observer: { onLeadership: (e) => events.push(e.event) },
    });
    await enqueue(a, 0, 300);
    // b's clock is a window ahead: it takes over (a's lease passed) and retires every dedup segment
    const late = new ManualClock({ startMs: early.now() + WINDOW + 60_000 });
    const b = leader(store, "b", late, 2048);
    await b.submit({ kind: "enqueue", messages: [{ id: "x", payload }] });
    await b.stop({ release: false }); // waits for its deletions; its lease stands
    expect(await dedupKeys(store)).toEqual([]);
    // a still takes itself for the leader, its ids paged out: a resend reads a deleted segment
    const error = await errorOf(
      a.submit({ kind: "enqueue", messages: [{ id: "retry-3", payload, dedupId: dedupOf(3) }] }),
    );
    expect(isCasqError(error, "data_loss"), String(error)).toBe(false);
    expect(isCasqError(error, "unavailable"), String(error)).toBe(true); // retried, it finds the new leader
    expect(events).not.toContain("refused");
    await a.stop({ release: false });
  });

  it("refuses the shard with data_loss when a live dedup segment is missing", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock, 2048);
    await enqueue(a, 0, 100);
    await a.stop({ release: true });
    const { doc } = await head(store);
    await store.delete(SEG + doc.dedup_segments[0].name);
    const before = await store.get(HEAD);
    const b = leader(store, "b", clock, 2048);
    const error = await errorOf(b.submit({ kind: "enqueue", messages: [{ id: "x", payload }] }));
    expect(isCasqError(error, "data_loss"), String(error)).toBe(true);
    expect(String(error)).toContain("dedup segment");
    expect((await store.get(HEAD))?.etag).toBe(before?.etag);
  });
});
