import { describe, expect, it } from "vitest";
import {
  claim,
  docJson,
  enqueue,
  expectRejected,
  ids,
  msg,
  newShard,
  T0,
} from "../../testing/model-test-helpers.ts";
import { applyOperation } from "./apply-operation.ts";
import { DEFAULT_SUBSCRIPTION } from "./shard-state.ts";
import { hasRunnable } from "./shard-stats.ts";

describe("claim", () => {
  it("orders by priority (high first), then offset", () => {
    const s = newShard();
    enqueue(
      s,
      T0,
      msg("low", { priority: -5 }),
      msg("n1"),
      msg("high", { priority: 10 }),
      msg("n2"),
      msg("high2", { priority: 10 }),
    );
    expect(ids(claim(s, T0, { max: 2 }))).toEqual(["high", "high2"]);
    expect(ids(claim(s, T0, { max: 10 }))).toEqual(["n1", "n2", "low"]);
    expect(claim(s, T0)).toEqual([]);
  });

  it("skips messages that are not runnable yet, and prefers priority only among runnable ones", () => {
    const s = newShard();
    enqueue(s, T0, msg("urgent-later", { priority: 100, delayMs: 1000 }), msg("now"));
    expect(ids(claim(s, T0))).toEqual(["now"]);
    expect(ids(claim(s, T0 + 999))).toEqual([]);
    expect(ids(claim(s, T0 + 1000))).toEqual(["urgent-later"]);
  });

  it("keeps a due message claimable when a look at an earlier time comes after the one that found it due", () => {
    // A leader looks at its claim order with the batch's time before warming a segment, and
    // warming schedules with a later one (simulation seed 72143455 lost the message until its
    // segment was cooled and warmed again).
    const s = newShard();
    enqueue(s, T0, msg("delayed", { priority: 5, delayMs: 1000 }), msg("plain"));
    expect(hasRunnable(s, DEFAULT_SUBSCRIPTION, T0 + 1005)).toBe(true); // due: moved to the runnable index
    expect(hasRunnable(s, DEFAULT_SUBSCRIPTION, T0 + 990)).toBe(true); // "plain" is; "delayed" is not yet
    expect(ids(claim(s, T0 + 1010, { max: 1 }))).toEqual(["delayed"]);
  });

  it("leases a message to one worker at a time and bumps the attempt per claim", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    const [c] = claim(s, T0, { workerId: "w1", leaseTtlMs: 5000 });
    expect(c?.receipt).toEqual({ offset: 0, attempt: 1 });
    expect(c?.leaseDeadline).toBe(T0 + 5000);
    expect(claim(s, T0 + 1000, { workerId: "w2" })).toEqual([]);
    const doc = docJson(s);
    expect(doc.subscriptions[0].deliveries).toEqual([
      { offset: 0, attempts: 1, lease: { worker: "w1", claimed_at: T0, deadline: T0 + 5000, ttl_ms: 5000 } },
    ]);
  });

  it("uses the queue's lease TTL by default and caps max at max_batch", () => {
    const s = newShard({ leaseTtlMs: 7000, maxBatch: 3 });
    enqueue(s, T0, msg("a"), msg("b"));
    enqueue(s, T0, msg("c"), msg("d"));
    const claimed = claim(s, T0, { max: 100 });
    expect(claimed.length).toBe(3);
    expect(claimed[0]?.leaseDeadline).toBe(T0 + 7000);
  });

  it("a Work stream's claim (credited) is bounded by its credit, not max_batch", () => {
    const s = newShard({ maxBatch: 3 });
    enqueue(s, T0, msg("a"), msg("b"), msg("c"));
    enqueue(s, T0, msg("d"), msg("e"), msg("f"));
    expect(ids(claim(s, T0, { max: 5, credited: true }))).toEqual(["a", "b", "c", "d", "e"]);
    expect(ids(claim(s, T0, { max: 5, credited: true }))).toEqual(["f"]);
  });

  it("an empty claim changes nothing", () => {
    const s = newShard();
    const r = applyOperation(s, { kind: "claim", subscription: "default", workerId: "w", max: 5 }, T0);
    expect(r).toEqual({ kind: "claim", messages: [], changed: false });
  });

  it("rejects bad claims without touching the state", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    const m = expectRejected(
      s,
      { kind: "claim", subscription: "nope", workerId: "w", max: 1 },
      T0,
      "not_found",
    );
    expect(m).toContain("create it first");
    expectRejected(
      s,
      { kind: "claim", subscription: "default", workerId: "w", max: 0 },
      T0,
      "invalid_argument",
    );
    expectRejected(
      s,
      { kind: "claim", subscription: "default", workerId: "", max: 1 },
      T0,
      "invalid_argument",
    );
    expectRejected(
      s,
      { kind: "claim", subscription: "default", workerId: "w", max: 1, leaseTtlMs: 5 },
      T0,
      "invalid_argument",
    );
  });
});
