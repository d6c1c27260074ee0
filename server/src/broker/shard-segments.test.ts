import { describe, expect, it } from "vitest";
import { ManualClock } from "../../testing/manual-clock.ts";
import { isCasqError } from "../errors.ts";
import { ShardState } from "../model/shard-state.ts";
import { MemoryStore } from "../store/memory-store.ts";
import type { CallOptions, PutCondition, PutResult } from "../store/object-store.ts";
import { AmbiguousWriteError, UnavailableError } from "../store/store-errors.ts";
import { seededRandom } from "../util/random.ts";
import { expectKind } from "./broker.ts";
import { ShardLeader } from "./shard-leader.ts";

const HEAD = "queues/jobs/0.json";
const SEG = "queues/jobs/0/seg/";
const body = (i: number) => new TextEncoder().encode(`job-${i}-${"x".repeat(200)}`);

function leader(store: MemoryStore, name: string, clock: ManualClock, tailBytes = 4096) {
  return new ShardLeader({
    store,
    queue: "jobs",
    shard: 0,
    identity: { id: `broker-${name}`, address: `${name}:50051` },
    clock,
    random: seededRandom(name.length),
    options: { tailBytes },
  });
}

async function enqueue(shard: ShardLeader, from: number, count: number, priority = 0) {
  for (let i = from; i < from + count; i += 10) {
    const messages = Array.from({ length: Math.min(10, from + count - i) }, (_, k) => ({
      id: `m${i + k}`,
      payload: body(i + k),
      priority,
    }));
    await shard.submit({ kind: "enqueue", messages });
  }
}

async function headJson(store: MemoryStore) {
  const stored = await store.get(HEAD);
  if (!stored) throw new Error("no head");
  return { doc: JSON.parse(new TextDecoder().decode(stored.body)), bytes: stored.body.byteLength };
}

async function segmentKeys(store: MemoryStore) {
  return (await store.list(SEG)).map((e) => e.key);
}

async function drain(shard: ShardLeader, max = 50) {
  const ids: string[] = [];
  for (;;) {
    const claim = expectKind(
      await shard.submit({ kind: "claim", subscription: "default", workerId: "w", max }),
      "claim",
    );
    if (claim.messages.length === 0) return ids;
    ids.push(...claim.messages.map((m) => m.id));
    await shard.submit({
      kind: "ack",
      subscription: "default",
      receipts: claim.messages.map((m) => m.receipt),
    });
  }
}

describe("shard format v2: head and segments", () => {
  it("seals the oldest messages into segments written before the head, keeping the head small", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    await enqueue(a, 0, 300);
    const { doc, bytes } = await headJson(store);
    expect(doc.format).toBe("casq.shard.v2");
    expect(doc.segments.length).toBeGreaterThan(5);
    // The tail stays within twice its budget (beyond the budget, a segment is being written ahead).
    expect(bytes).toBeLessThan(2 * 4096 + 320 * doc.segments.length + 3000);
    // every referenced segment is in the store, with the size the head says
    const keys = await segmentKeys(store);
    for (const seg of doc.segments) {
      expect(keys).toContain(SEG + seg.name);
      expect((await store.get(SEG + seg.name))?.body.byteLength).toBe(seg.bytes);
    }
    // segments + tail hold every message exactly once
    const inSegments = doc.segments.reduce((n: number, s: { count: number }) => n + s.count, 0);
    expect(inSegments + doc.messages.length).toBe(300);
  });

  it("a new leader reads the head and its segments and serves every message in claim order", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    await enqueue(a, 0, 150);
    await enqueue(a, 150, 20, 5); // higher priority, newest: claimed first
    await a.stop({ release: true });
    const b = leader(store, "b", clock);
    const ids = await drain(b);
    expect(ids.slice(0, 20)).toEqual(Array.from({ length: 20 }, (_, i) => `m${150 + i}`));
    expect(ids.slice(20)).toEqual(Array.from({ length: 150 }, (_, i) => `m${i}`));
    await b.stop({ release: false });
    // every segment was settled: all retired and deleted
    const { doc } = await headJson(store);
    expect(doc.segments).toEqual([]);
    expect(await segmentKeys(store)).toEqual([]);
  });

  it("reads a v1 document and writes v2 from its first write", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const v1 = ShardState.create({ queue: "jobs", shard: 0, now: clock.now() });
    const { applyOperation } = await import("../model/apply-operation.ts");
    applyOperation(
      v1,
      {
        kind: "enqueue",
        messages: Array.from({ length: 100 }, (_, i) => ({ id: `m${i}`, payload: body(i) })),
      },
      clock.now(),
    );
    await store.put(HEAD, v1.encodeV1(), { ifAbsent: true });
    const b = leader(store, "b", clock);
    await b.submit({ kind: "enqueue", messages: [{ id: "m100", payload: body(100) }] });
    const { doc } = await headJson(store);
    expect(doc.format).toBe("casq.shard.v2");
    expect(doc.segments.length).toBeGreaterThan(0); // the upgrade sealed the backlog
    expect(await drain(b)).toEqual(Array.from({ length: 101 }, (_, i) => `m${i}`));
  });

  it("refuses the shard with data_loss when a referenced segment is missing or corrupt, and never overwrites it", async () => {
    for (const damage of ["delete", "corrupt"] as const) {
      const store = new MemoryStore();
      const clock = new ManualClock();
      const a = leader(store, "a", clock);
      await enqueue(a, 0, 100);
      await a.stop({ release: true });
      const { doc } = await headJson(store);
      const key = SEG + doc.segments[0].name;
      if (damage === "delete") await store.delete(key);
      else {
        const stored = await store.get(key);
        const bad = Uint8Array.from(stored?.body ?? []);
        bad[bad.length - 10] = (bad[bad.length - 10] ?? 0) ^ 1;
        await store.delete(key);
        await store.put(key, bad, { ifAbsent: true });
      }
      const before = await store.get(HEAD);
      const b = leader(store, "b", clock);
      const error = await b.submit({ kind: "claim", subscription: "default", workerId: "w", max: 1 }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(isCasqError(error, "data_loss"), String(error)).toBe(true);
      expect(String(error)).toContain(damage === "delete" ? "is missing" : "fails its checksum");
      expect((await store.get(HEAD))?.etag).toBe(before?.etag);
      expect(b.currentMode).toBe("refused");
    }
  });

  it("deletes a segment whose head write did not land (crash between segment PUT and head CAS)", async () => {
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
    const a = leader(store, "a", clock);
    await enqueue(a, 0, 10);
    expect(await segmentKeys(store)).toEqual([]);
    store.failHead = true;
    const big = Array.from({ length: 30 }, (_, i) => ({ id: `b${i}`, payload: body(i) }));
    await expect(a.submit({ kind: "enqueue", messages: big })).rejects.toThrow(/head write failed/);
    await a.stop({ release: false }); // waits for background deletions
    expect(await segmentKeys(store)).toEqual([]);
    const { doc } = await headJson(store);
    expect(doc.segments).toEqual([]);
    expect(doc.next_offset).toBe(10);
  });

  it("keeps the segments of an ambiguous head write that lands late, after the re-read found it had not", async () => {
    // The head PUT times out but the store applies it later: after the broker's re-read (which
    // shows it did not land yet) and before the broker's retry, which then loses the race to it.
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
    const a = leader(store, "a", clock);
    await enqueue(a, 0, 10);
    store.delayNext = true;
    const big = Array.from({ length: 30 }, (_, i) => ({ id: `b${i}`, payload: body(i) }));
    await a.submit({ kind: "enqueue", messages: big }); // the late first attempt is what landed
    await a.stop({ release: true }); // waits for background deletions
    const { doc } = await headJson(store);
    expect(doc.segments.length).toBeGreaterThan(0);
    const keys = await segmentKeys(store);
    for (const seg of doc.segments) expect(keys).toContain(SEG + seg.name);
    const b = leader(store, "b", clock);
    expect((await drain(b)).length).toBe(40);
  });

  it("a takeover sweeps orphan segments of earlier epochs but keeps every referenced one", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(store, "a", clock);
    await enqueue(a, 0, 100);
    await a.stop({ release: true });
    const { doc } = await headJson(store);
    const orphan = `${SEG}${"0".repeat(15)}99999-1-zzz.json`;
    await store.put(orphan, new TextEncoder().encode("{}"), { ifAbsent: true });
    const b = leader(store, "b", clock);
    await b.submit({ kind: "enqueue", messages: [{ id: "x", payload: body(0) }] });
    await b.stop({ release: true });
    const keys = await segmentKeys(store);
    expect(keys).not.toContain(orphan);
    for (const seg of doc.segments) expect(keys).toContain(SEG + seg.name);
    expect(await drain(leader(store, "c", clock))).toHaveLength(101);
  });
});
