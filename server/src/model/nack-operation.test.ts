import { describe, expect, it } from "vitest";
import {
  ack,
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
import { backoffDelayMs } from "./backoff.ts";
import type { NackOperation, Receipt } from "./operations.ts";
import { DEFAULT_QUEUE_CONFIG } from "./queue-config.ts";
import type { ShardState } from "./shard-state.ts";

function nack(s: ShardState, now: number, receipts: Receipt[], extra: Partial<NackOperation> = {}) {
  return applyOperation(s, { kind: "nack", subscription: "default", receipts, ...extra }, now);
}

describe("nack with release", () => {
  it("hands a job back at once without counting the delivery: never dead-letters, limits shift by one", () => {
    const s = newShard({ maxAttempts: 1 });
    enqueue(s, T0, msg("a"));
    const first = claim(s, T0)[0];
    expect(first?.maxAttempts).toBe(1);
    const res = nack(s, T0 + 5, [first?.receipt as Receipt], { release: true });
    expect(res.results).toEqual([
      { receipt: first?.receipt, outcome: "retry_scheduled", availableAt: T0 + 5 },
    ]);
    expect(docJson(s).subscriptions[0].dead_letters).toEqual([]);
    // Claimable at once, as delivery 2 that is still the first counted attempt.
    const second = claim(s, T0 + 5)[0];
    expect(second?.receipt).toEqual({ offset: 0, attempt: 2 });
    expect(second?.maxAttempts).toBe(2);
    // A real failure now uses up the one allowed attempt.
    const failed = nack(s, T0 + 6, [second?.receipt as Receipt]);
    expect(failed.results[0]?.outcome).toBe("dead_lettered");
  });

  it("is refused together with dead_letter or a delay, changing nothing", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    const r = claim(s, T0)[0]?.receipt as Receipt;
    expectRejected(
      s,
      { kind: "nack", subscription: "default", receipts: [r], release: true, deadLetter: true },
      T0,
      "invalid_argument",
    );
    expectRejected(
      s,
      { kind: "nack", subscription: "default", receipts: [r], release: true, delayMs: 10 },
      T0,
      "invalid_argument",
    );
  });
});

describe("nack", () => {
  it("schedules a retry with the backoff policy (deterministic jitter)", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    const r = claim(s, T0)[0]?.receipt as Receipt;
    const res = nack(s, T0 + 10, [r]);
    const delay = backoffDelayMs(DEFAULT_QUEUE_CONFIG.backoff, 1, "a", 1);
    expect(delay).toBeGreaterThanOrEqual(800);
    expect(delay).toBeLessThanOrEqual(1200);
    expect(res.results).toEqual([{ receipt: r, outcome: "retry_scheduled", availableAt: T0 + 10 + delay }]);
    expect(res.changed).toBe(true);
    expect(claim(s, T0 + 10 + delay - 1)).toEqual([]);
    const again = claim(s, T0 + 10 + delay);
    expect(again[0]?.receipt).toEqual({ offset: 0, attempt: 2 });
    expect(docJson(s).counters.redelivered).toBe(1);
  });

  it("grows the delay per failure", () => {
    const s = newShard({ backoff: { jitter: 0 }, maxAttempts: 10 });
    enqueue(s, T0, msg("a"));
    let now = T0;
    const delays: number[] = [];
    for (let i = 0; i < 4; i++) {
      const r = claim(s, now)[0]?.receipt as Receipt;
      const at = nack(s, now, [r]).results[0]?.availableAt as number;
      delays.push(at - now);
      now = at;
    }
    expect(delays).toEqual([1000, 2000, 4000, 8000]);
  });

  it("honours an explicit delay, including 0", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    let r = claim(s, T0)[0]?.receipt as Receipt;
    expect(nack(s, T0, [r], { delayMs: 0 }).results[0]?.availableAt).toBe(T0);
    r = claim(s, T0)[0]?.receipt as Receipt;
    expect(r.attempt).toBe(2);
    expect(nack(s, T0, [r], { delayMs: 5000 }).results[0]?.availableAt).toBe(T0 + 5000);
  });

  it("dead-letters on request, with the reason and a full copy", () => {
    const s = newShard();
    enqueue(s, T0, msg("a", { headers: { h: "v" } }));
    const r = claim(s, T0)[0]?.receipt as Receipt;
    expect(nack(s, T0 + 5, [r], { deadLetter: true, reason: "bad input" }).results[0]?.outcome).toBe(
      "dead_lettered",
    );
    const doc = docJson(s);
    expect(doc.messages).toEqual([]);
    expect(doc.subscriptions[0].dead_letters).toEqual([
      {
        dead_at: T0 + 5,
        attempts: 1,
        reason: "bad input",
        message: {
          offset: 0,
          id: "a",
          enqueued_at: T0,
          headers: { h: "v" },
          payload: Buffer.from("payload of a").toString("base64"),
        },
      },
    ]);
    expect(doc.subscriptions[0].counters.dead_lettered).toBe(1);
    // retried dead-letter nack: same outcome; ack of it: lease_lost
    expect(nack(s, T0 + 6, [r], { deadLetter: true }).results[0]?.outcome).toBe("dead_lettered");
    expect(ack(s, T0 + 6, [r])).toEqual(["lease_lost"]);
  });

  it("dead-letters when attempts are used up (per-message max_attempts wins)", () => {
    const s = newShard({ maxAttempts: 5 });
    enqueue(s, T0, msg("a", { maxAttempts: 2 }));
    let r = claim(s, T0)[0]?.receipt as Receipt;
    nack(s, T0, [r], { delayMs: 0 });
    const c = claim(s, T0)[0];
    expect(c?.attempt).toBe(2);
    expect(c?.maxAttempts).toBe(2);
    r = c?.receipt as Receipt;
    const res = nack(s, T0, [r], { delayMs: 0, reason: "boom" });
    expect(res.results[0]?.outcome).toBe("dead_lettered");
    expect(docJson(s).subscriptions[0].dead_letters[0]).toMatchObject({ attempts: 2, reason: "boom" });
    expect(claim(s, T0 + 1_000_000)).toEqual([]);
  });

  it("is idempotent for a released delivery and lease_lost for others", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"));
    const [a, b] = claim(s, T0);
    const ra = a?.receipt as Receipt;
    const first = nack(s, T0, [ra], { delayMs: 1000 });
    const before = docJson(s);
    const second = nack(s, T0 + 1, [ra], { delayMs: 9999 });
    expect(second.results).toEqual(first.results);
    expect(second.changed).toBe(false);
    expect(docJson(s)).toEqual(before);
    ack(s, T0, [b?.receipt as Receipt]);
    expect(
      nack(s, T0, [b?.receipt as Receipt, { offset: 0, attempt: 5 }]).results.map((r) => r.outcome),
    ).toEqual(["lease_lost", "lease_lost"]);
  });

  it("truncates long reasons", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    const r = claim(s, T0)[0]?.receipt as Receipt;
    nack(s, T0, [r], { deadLetter: true, reason: "x".repeat(10_000) });
    expect(docJson(s).subscriptions[0].dead_letters[0].reason.length).toBe(2048);
  });

  it("keeps claim order after a nack", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"));
    const [a] = claim(s, T0, { max: 1 });
    nack(s, T0, [a?.receipt as Receipt], { delayMs: 0 });
    expect(ids(claim(s, T0))).toEqual(["a", "b"]);
  });

  it("rejects bad input without touching the state", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    const r = claim(s, T0)[0]?.receipt as Receipt;
    expectRejected(
      s,
      { kind: "nack", subscription: "default", receipts: [r], delayMs: -5 },
      T0,
      "invalid_argument",
    );
    expectRejected(
      s,
      { kind: "nack", subscription: "default", receipts: [r], reason: 5 as never },
      T0,
      "invalid_argument",
    );
    expectRejected(s, { kind: "nack", subscription: "x", receipts: [r] }, T0, "not_found");
  });
});
