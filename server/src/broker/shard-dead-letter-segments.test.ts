import { describe, expect, it } from "vitest";
import { ManualClock } from "../../testing/manual-clock.ts";
import { isCasqError } from "../errors.ts";
import { listDeadLetters } from "../model/shard-inspect.ts";
import { computeStats } from "../model/shard-stats.ts";
import { MemoryStore } from "../store/memory-store.ts";
import type { CallOptions, PutCondition, PutResult } from "../store/object-store.ts";
import { AmbiguousWriteError, UnavailableError } from "../store/store-errors.ts";
import { seededRandom } from "../util/random.ts";
import { expectKind } from "./broker.ts";
import { ShardLeader } from "./shard-leader.ts";
import { readShardSnapshot } from "./shard-snapshot.ts";

const HEAD = "queues/jobs/0.json";
const SEG = "queues/jobs/0/seg/";
const MIB = 1024 * 1024;
const payload = new TextEncoder().encode("small job payload");

interface DeadSegmentEntry {
  readonly name: string;
  readonly count: number;
  readonly gone: [number, number][];
}

function leader(store: MemoryStore, name: string, clock: ManualClock, tailBytes = 256 * 1024) {
  return new ShardLeader({
    store,
    queue: "jobs",
    shard: 0,
    identity: { id: `broker-${name}`, address: `${name}:50051` },
    clock,
    random: seededRandom(name.length),
    options: { tailBytes },
    initialConfig: { deadLetterLimit: 1_000_000, maxBatch: 1000 },
  });
}

/** Enqueues `count` messages from id `from` and dead-letters them on `subscription`, `batch` at a time. */
async function deadLetter(
  shard: ShardLeader,
  from: number,
  count: number,
  batch = 100,
  subscription = "default",
) {
  for (let i = from; i < from + count; i += batch) {
    const n = Math.min(batch, from + count - i);
    const messages = Array.from({ length: n }, (_, k) => ({ id: `msg-${i + k}`, payload }));
    await shard.submit({ kind: "enqueue", messages });
    const claim = expectKind(
      await shard.submit({ kind: "claim", subscription, workerId: "w", max: n }),
      "claim",
    );
    expect(claim.messages.length).toBe(n);
    await shard.submit({
      kind: "nack",
      subscription,
      receipts: claim.messages.map((m) => m.receipt),
      deadLetter: true,
      reason: `failed ${i}`,
    });
  }
}

async function head(store: MemoryStore) {
  const stored = await store.get(HEAD);
  if (!stored) throw new Error("no head");
  return { doc: JSON.parse(new TextDecoder().decode(stored.body)), bytes: stored.body.byteLength };
}

function deadSegments(doc: { subscriptions: { name: string; dead_letter_segments?: DeadSegmentEntry[] }[] }) {
  return doc.subscriptions.flatMap((s) => s.dead_letter_segments ?? []);
}

async function deadKeys(store: MemoryStore) {
  return (await store.list(SEG)).map((e) => e.key).filter((k) => k.endsWith(".dead.json"));
}

/** Every dead letter's message id of `subscription`, in list order (paging through ListDeadLetters' model view). */
async function listedIds(shard: ShardLeader, subscription = "default"): Promise<string[]> {
  return shard.read((state) => {
    const ids: string[] = [];
    let afterOffset: number | undefined;
    for (;;) {
      const page = listDeadLetters(state, subscription, {
        limit: 1000,
        ...(afterOffset === undefined ? {} : { afterOffset }),
      });
      if (page.length === 0) return ids;
      for (const dl of page) ids.push(dl.message.id);
      afterOffset = page[page.length - 1]?.message.offset;
    }
  });
}

async function failure(call: Promise<unknown>): Promise<unknown> {
  return call.then(
    () => undefined,
    (error: unknown) => error,
  );
}

describe("shard format v2: dead letters in dead-letter segments", () => {
  it("keeps the head under 1 MiB with 100k dead letters, and a takeover lists, redrives and purges them", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    let largest = 0;
    for (let i = 0; i < 100_000; i += 5000) {
      await deadLetter(a, i, 5000, 1000);
      clock.advance(1);
      largest = Math.max(largest, (await head(store)).bytes);
    }
    expect(largest).toBeLessThan(MIB);
    const { doc } = await head(store);
    const sealed = deadSegments(doc);
    expect(sealed.length).toBeGreaterThan(20);
    const defaultSub = doc.subscriptions.find((s: { name: string }) => s.name === "default");
    expect(sealed.reduce((n, s) => n + s.count, 0) + defaultSub.dead_letters.length).toBe(100_000);
    expect(doc.messages).toEqual([]); // every message left the shard: the dead letters hold the only copies
    expect(await a.read((s) => s.headDeadLetterSize)).toBeLessThanOrEqual(256 * 1024);
    await a.stop({ release: true });

    const b = leader(store, "b", clock); // takeover: reads every dead-letter segment
    expect(await b.read((s) => computeStats(s, clock.now()).dead)).toBe(100_000);
    const ids = await listedIds(b);
    expect(ids.length).toBe(100_000);
    expect(ids[0]).toBe("msg-0");
    expect(ids[99_999]).toBe("msg-99999");
    const redrive = expectKind(
      await b.submit({ kind: "redrive", subscription: "default", limit: 3 }),
      "redrive",
    );
    expect(redrive.ids).toEqual(["msg-0", "msg-1", "msg-2"]);
    const claim = expectKind(
      await b.submit({ kind: "claim", subscription: "default", workerId: "w", max: 10 }),
      "claim",
    );
    expect(claim.messages.map((m) => m.id)).toEqual(["msg-0", "msg-1", "msg-2"]);
    const purged = expectKind(
      await b.submit({ kind: "purge", subscription: "default", deadLetters: true }),
      "purge",
    );
    expect(purged.deadLettersPurged).toBe(99_997);
    await b.stop({ release: true }); // waits for the deletions
    const after = await head(store);
    expect(deadSegments(after.doc)).toEqual([]);
    expect(await deadKeys(store)).toEqual([]);
    expect(after.bytes).toBeLessThan(64 * 1024);
  }, 120_000);

  it("lists, redrives and evicts across sealed dead letters after a takeover and a restart; a segment with nothing left is deleted", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock, 2048);
    await a.submit({ kind: "createSubscription", name: "audit" });
    await deadLetter(a, 0, 60, 10);
    let { doc } = await head(store);
    expect(deadSegments(doc).length).toBeGreaterThan(2);
    const expected = Array.from({ length: 60 }, (_, i) => `msg-${i}`);
    expect(await listedIds(a)).toEqual(expected);
    await a.stop({ release: true });

    const b = leader(store, "b", clock, 2048); // takeover
    expect(await listedIds(b)).toEqual(expected);
    // redrive by ids from the oldest sealed segment and the newest, and one missing id
    const first = deadSegments(doc)[0] as DeadSegmentEntry;
    const r = expectKind(
      await b.submit({ kind: "redrive", subscription: "default", ids: ["msg-1", "msg-58", "nope"] }),
      "redrive",
    );
    expect([...r.ids].sort()).toEqual(["msg-1", "msg-58"]);
    expect(r.missing).toEqual(["nope"]);
    ({ doc } = await head(store));
    expect(deadSegments(doc).find((s) => s.name === first.name)?.gone).toEqual([[1, 1]]);
    const claim = expectKind(
      await b.submit({ kind: "claim", subscription: "default", workerId: "w", max: 10 }),
      "claim",
    );
    expect(claim.messages.map((m) => m.id).sort()).toEqual(["msg-1", "msg-58"]);
    // `audit` still owes them all, and did not get the redriven messages twice
    expect(
      await b.read((s) => computeStats(s, clock.now()).subscriptions.find((x) => x.name === "audit")?.ready),
    ).toBe(60);
    await b.stop({ release: false }); // a crash: the lease is not released
    clock.advance(60_000);

    const restarted = leader(store, "b", clock, 2048); // the same broker, restarted
    const left = expected.filter((id) => id !== "msg-1" && id !== "msg-58");
    expect(await listedIds(restarted)).toEqual(left);
    // the old receipts are still leased; dead-letter them again: they join the newest dead letters
    clock.advance(60_000); // the leases expire
    const again = expectKind(
      await restarted.submit({ kind: "claim", subscription: "default", workerId: "w", max: 10 }),
      "claim",
    );
    await restarted.submit({
      kind: "nack",
      subscription: "default",
      receipts: again.messages.map((m) => m.receipt),
      deadLetter: true,
    });
    expect(await listedIds(restarted)).toEqual([...left, ...again.messages.map((m) => m.id)]);

    // eviction by dead_letter_limit removes the oldest: whole sealed segments retire and are deleted
    const before = await deadKeys(store);
    const update = expectKind(
      await restarted.submit({ kind: "updateConfig", patch: { deadLetterLimit: 10 } }),
      "updateConfig",
    );
    expect(update.deadEvicted).toBe(50);
    const kept = await listedIds(restarted);
    expect(kept.length).toBe(10);
    await restarted.stop({ release: true });
    ({ doc } = await head(store));
    const keys = await deadKeys(store);
    expect(keys.length).toBeLessThan(before.length);
    expect(keys.sort()).toEqual(
      deadSegments(doc)
        .map((s) => SEG + s.name)
        .sort(),
    );
    const c = leader(store, "c", clock, 2048);
    expect(await listedIds(c)).toEqual(kept);
    await c.stop({ release: true });
  });

  it("deleting a subscription retires its dead-letter segments, and DeleteQueue's prefix holds them", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock, 2048);
    await a.submit({ kind: "createSubscription", name: "audit" });
    await deadLetter(a, 0, 40, 10, "audit");
    await deadLetter(a, 40, 40, 10, "default");
    let { doc } = await head(store);
    const auditSegments = doc.subscriptions.find(
      (s: { name: string }) => s.name === "audit",
    ).dead_letter_segments;
    expect(auditSegments.length).toBeGreaterThan(0);
    const r = expectKind(await a.submit({ kind: "deleteSubscription", name: "audit" }), "deleteSubscription");
    expect(r.deadLettersDropped).toBe(40);
    await a.stop({ release: true });
    ({ doc } = await head(store));
    const keys = await deadKeys(store);
    for (const s of auditSegments as DeadSegmentEntry[]) expect(keys).not.toContain(SEG + s.name);
    expect(keys.sort()).toEqual(
      deadSegments(doc)
        .map((s) => SEG + s.name)
        .sort(),
    );
    expect(keys.length).toBeGreaterThan(0);
  });

  for (const damage of ["missing", "corrupt"] as const) {
    it(`refuses the shard with data_loss when a dead-letter segment is ${damage}, and never writes over it`, async () => {
      const store = new MemoryStore();
      const clock = new ManualClock();
      const a = leader(store, "a", clock, 2048);
      await deadLetter(a, 0, 40, 10);
      await a.stop({ release: true });
      const { doc } = await head(store);
      const key = SEG + (deadSegments(doc)[0] as DeadSegmentEntry).name;
      if (damage === "missing") await store.delete(key);
      else {
        const stored = await store.get(key);
        const text = new TextDecoder().decode(stored?.body).replace("failed 0", "failed 9");
        await store.put(key, new TextEncoder().encode(text), { ifMatch: stored?.etag ?? "" });
      }
      const before = await store.get(HEAD);
      const b = leader(store, "b", clock, 2048);
      for (const call of [
        b.submit({ kind: "enqueue", messages: [{ id: "x", payload }] }),
        b.submit({ kind: "redrive", subscription: "default" }),
        b.read(() => undefined),
      ]) {
        const error = await failure(call);
        expect(isCasqError(error, "data_loss"), String(error)).toBe(true);
        expect(String(error)).toContain(`dead-letter segment ${key}`);
        expect(String(error)).toContain(damage === "missing" ? "is missing" : "fails its checksum");
      }
      clock.advance(60_000);
      await failure(b.submit({ kind: "purge", subscription: "default", deadLetters: true }));
      expect((await store.get(HEAD))?.etag).toBe(before?.etag);
      expect(await store.get(key).then((s) => s !== undefined)).toBe(damage === "corrupt");
    });
  }

  it("deletes a dead-letter segment whose head write did not land; the dead letters stay in the head", async () => {
    class FailingHeadStore extends MemoryStore {
      failHead = false;
      override async put(
        key: string,
        bytes: Uint8Array,
        condition: PutCondition,
        options?: CallOptions,
      ): Promise<PutResult> {
        if (this.failHead && key === HEAD) throw new UnavailableError(key, "injected: head write failed");
        return super.put(key, bytes, condition, options);
      }
    }
    const store = new FailingHeadStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock, 4096);
    await deadLetter(a, 0, 5, 5); // within the budget: in the head
    await a.submit({
      kind: "enqueue",
      messages: Array.from({ length: 30 }, (_, i) => ({ id: `b${i}`, payload })),
    });
    const claim = expectKind(
      await a.submit({ kind: "claim", subscription: "default", workerId: "w", max: 30 }),
      "claim",
    );
    store.failHead = true;
    const nack = a.submit({
      kind: "nack",
      subscription: "default",
      receipts: claim.messages.map((m) => m.receipt),
      deadLetter: true,
      reason: "x".repeat(200),
    });
    await expect(nack).rejects.toThrow(/head write failed/);
    await a.stop({ release: false }); // waits for background deletions
    expect(await deadKeys(store)).toEqual([]);
    const { doc } = await head(store);
    expect(deadSegments(doc)).toEqual([]);
    expect(doc.subscriptions[0].dead_letters).toHaveLength(5);
    store.failHead = false;
    clock.advance(60_000);
    const b = leader(store, "b", clock, 4096);
    expect(await listedIds(b)).toEqual(["msg-0", "msg-1", "msg-2", "msg-3", "msg-4"]);
    await b.stop({ release: true });
  });

  it("keeps the dead-letter segments of an ambiguous head write that lands late", async () => {
    class LateHeadStore extends MemoryStore {
      delayNext = false;
      held: (() => Promise<unknown>) | undefined;
      override async put(
        key: string,
        bytes: Uint8Array,
        condition: PutCondition,
        options?: CallOptions,
      ): Promise<PutResult> {
        if (key === HEAD && this.delayNext) {
          this.delayNext = false;
          this.held = () => super.put(key, bytes, condition, options);
          throw new AmbiguousWriteError(key, "injected: timed out, lands later");
        }
        if (key === HEAD && this.held) {
          const late = this.held;
          this.held = undefined;
          await late();
        }
        return super.put(key, bytes, condition, options);
      }
    }
    const store = new LateHeadStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock, 2048);
    await a.submit({
      kind: "enqueue",
      messages: Array.from({ length: 20 }, (_, i) => ({ id: `msg-${i}`, payload })),
    });
    const claim = expectKind(
      await a.submit({ kind: "claim", subscription: "default", workerId: "w", max: 20 }),
      "claim",
    );
    store.delayNext = true;
    await a.submit({
      kind: "nack",
      subscription: "default",
      receipts: claim.messages.map((m) => m.receipt),
      deadLetter: true,
    }); // the late first attempt is what landed
    await a.stop({ release: true });
    const { doc } = await head(store);
    expect(deadSegments(doc).length).toBeGreaterThan(0);
    const keys = await deadKeys(store);
    for (const seg of deadSegments(doc)) expect(keys).toContain(SEG + seg.name);
    const b = leader(store, "b", clock, 2048);
    expect((await listedIds(b)).length).toBe(20);
    await b.stop({ release: true });
  });

  it("a takeover sweeps orphan dead-letter segments of earlier epochs, keeps referenced ones; admin reads see sealed dead letters", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock, 2048);
    await deadLetter(a, 0, 40, 10);
    await a.stop({ release: true });
    const { doc } = await head(store);
    const orphan = `${SEG}${"0".repeat(15)}99999-1-zzz.dead.json`;
    await store.put(orphan, new TextEncoder().encode("{}"), { ifAbsent: true });
    // an admin read of the shard (not its leader) loads the dead-letter segments too
    const stored = await store.get(HEAD);
    const snapshot = await readShardSnapshot(store, "jobs", 0, stored as NonNullable<typeof stored>);
    expect(listDeadLetters(snapshot, "default", { limit: 100 })).toHaveLength(40);
    const b = leader(store, "b", clock, 2048);
    await b.submit({ kind: "enqueue", messages: [{ id: "x", payload }] });
    await b.stop({ release: true });
    const keys = await deadKeys(store);
    expect(keys).not.toContain(orphan);
    for (const seg of deadSegments(doc)) expect(keys).toContain(SEG + seg.name);
    expect((await listedIds(leader(store, "c", clock, 2048))).length).toBe(40);
  });
});
