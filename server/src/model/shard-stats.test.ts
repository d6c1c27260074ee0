import { describe, expect, it } from "vitest";
import { ack, claim, enqueue, expire, msg, newShard, T0 } from "../../testing/model-test-helpers.ts";
import { applyOperation } from "./apply-operation.ts";
import type { Receipt } from "./operations.ts";
import { ShardState } from "./shard-state.ts";
import { computeStats, hasRunnable, nextHousekeepingAt, nextWakeAt } from "./shard-stats.ts";

describe("computeStats", () => {
  it("counts ready, delayed, in flight, dead per subscription with counters", () => {
    const s = newShard();
    applyOperation(s, { kind: "createSubscription", name: "audit" }, T0);
    enqueue(s, T0, msg("a"), msg("b"), msg("c", { delayMs: 10_000 }), msg("d"));
    const [a, b] = claim(s, T0 + 100, { max: 2, leaseTtlMs: 1000 });
    ack(s, T0 + 100, [a?.receipt as Receipt]);
    applyOperation(
      s,
      { kind: "nack", subscription: "default", receipts: [b?.receipt as Receipt], deadLetter: true },
      T0 + 100,
    );
    claim(s, T0 + 100, { max: 1, leaseTtlMs: 1000 }); // d in flight
    const stats = computeStats(s, T0 + 5000);
    expect(stats).toMatchObject({
      queue: "jobs",
      shard: 0,
      nextOffset: 4,
      messages: 4,
      ready: 3, // audit: a, b, d
      delayed: 2, // c in both
      inFlight: 1,
      dead: 1,
      dedupIds: 0,
      broker: undefined,
    });
    expect(stats.approxBytes).toBe(s.approxBytes());
    const def = stats.subscriptions.find((x) => x.name === "default");
    expect(def).toMatchObject({
      ready: 0,
      delayed: 1,
      inFlight: 1,
      expiredLeases: 1,
      dead: 1,
      oldestUnackedAgeMs: 5000,
      lag: 2, // next offset 4 minus c (offset 2), the lowest it has not settled
    });
    expect(stats.subscriptions.find((x) => x.name === "audit")?.lag).toBe(4);
    expect(def?.counters).toMatchObject({ enqueued: 4, delivered: 3, acked: 1, deadLettered: 1 });
    expect(stats.counters).toMatchObject({ enqueued: 4, acked: 1, deadLettered: 1, delivered: 3 });
    expect(stats.subscriptions.map((x) => x.name)).toEqual(["audit", "default"]);
  });

  it("reports no oldest age for an empty subscription", () => {
    expect(computeStats(newShard(), T0).subscriptions[0]?.oldestUnackedAgeMs).toBeUndefined();
    expect(computeStats(newShard(), T0).subscriptions[0]?.lag).toBe(0);
  });
});

describe("nextWakeAt / hasRunnable", () => {
  it("is undefined for an idle shard", () => {
    const s = newShard();
    expect(nextWakeAt(s, T0)).toBeUndefined();
    expect(hasRunnable(s, "default", T0)).toBe(false);
    expect(hasRunnable(s, "missing", T0)).toBe(false);
  });

  it("reports the earliest delay, backoff or lease deadline", () => {
    const s = newShard();
    enqueue(s, T0, msg("later", { delayMs: 5000 }), msg("now"));
    expect(hasRunnable(s, "default", T0)).toBe(true);
    expect(nextWakeAt(s, T0)).toBe(T0 + 5000);
    const [c] = claim(s, T0, { max: 1, leaseTtlMs: 2000 });
    expect(c?.id).toBe("now");
    expect(hasRunnable(s, "default", T0)).toBe(false);
    expect(nextWakeAt(s, T0)).toBe(T0 + 2000);
    applyOperation(
      s,
      { kind: "nack", subscription: "default", receipts: [c?.receipt as Receipt], delayMs: 1000 },
      T0 + 10,
    );
    expect(nextWakeAt(s, T0 + 10)).toBe(T0 + 1010);
    expect(hasRunnable(s, "default", T0 + 1010)).toBe(true);
    // with now, due wake-ups are consumed: the next answer is in the future
    expect(nextWakeAt(s, T0 + 1010)).toBe(T0 + 5000);
    expect(nextWakeAt(s, T0 + 6000)).toBeUndefined();
    expect(hasRunnable(s, "default", T0 + 6000)).toBe(true);
  });

  it("keeps reporting a past lease deadline until expire sweeps it", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    claim(s, T0, { leaseTtlMs: 1000 });
    expect(nextWakeAt(s, T0 + 5000)).toBe(T0 + 1000);
    expire(s, T0 + 5000);
    expect(nextWakeAt(s, T0 + 5000)).toBeUndefined();
    expect(hasRunnable(s, "default", T0 + 5000)).toBe(true);
  });

  it("works on a freshly decoded state", () => {
    const s = newShard();
    enqueue(s, T0, msg("later", { delayMs: 5000 }), msg("now"));
    const d = ShardState.decode(s.encode());
    expect(nextWakeAt(d)).toBe(T0); // without now: due wake-ups are reported as is
    expect(nextWakeAt(d, T0)).toBe(T0 + 5000);
    expect(hasRunnable(d, "default", T0)).toBe(true);
  });

  it("does not change the document", () => {
    const s = newShard();
    enqueue(s, T0, msg("a", { delayMs: 10 }));
    const before = Buffer.from(s.encode()).toString();
    nextWakeAt(s, T0 + 100);
    hasRunnable(s, "default", T0 + 100);
    computeStats(s, T0 + 100);
    expect(Buffer.from(s.encode()).toString()).toBe(before);
  });
});

describe("nextHousekeepingAt", () => {
  it("reports dedup expiry and retention drops", () => {
    const s = newShard({ dedupWindowMs: 10_000, retentionMs: 5000 });
    expect(nextHousekeepingAt(s)).toBeUndefined();
    enqueue(s, T0, msg("a", { dedupId: "x" }));
    expect(nextHousekeepingAt(s)).toBe(T0 + 10_000);
    const [c] = claim(s, T0);
    ack(s, T0, [c?.receipt as Receipt]);
    expect(nextHousekeepingAt(s)).toBe(T0 + 5000);
  });
});
