import { describe, expect, it } from "vitest";
import {
  ack,
  claim,
  docJson,
  enqueue,
  expectRejected,
  expire,
  msg,
  newShard,
  T0,
} from "../../testing/model-test-helpers.ts";
import { applyOperation } from "./apply-operation.ts";
import type { Receipt } from "./operations.ts";
import type { ShardState } from "./shard-state.ts";

function heartbeat(s: ShardState, now: number, receipts: Receipt[]) {
  return applyOperation(s, { kind: "heartbeat", subscription: "default", workerId: "w1", receipts }, now);
}

describe("heartbeat (persistence rule: extend only when less than half the TTL remains)", () => {
  it("answers without a change while at least half the TTL remains", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    const [c] = claim(s, T0, { leaseTtlMs: 30_000 });
    const receipt = c?.receipt as Receipt;
    const before = docJson(s);
    const r = heartbeat(s, T0 + 10_000, [receipt]); // 20 s left >= 15 s
    expect(r).toEqual({
      kind: "heartbeat",
      extended: [{ receipt, deadline: T0 + 30_000 }],
      lost: [],
      changed: false,
    });
    expect(heartbeat(s, T0 + 15_000, [receipt]).changed).toBe(false); // exactly half left
    expect(docJson(s)).toEqual(before);
  });

  it("extends to now + ttl when less than half remains", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    const receipt = claim(s, T0, { leaseTtlMs: 30_000 })[0]?.receipt as Receipt;
    const r = heartbeat(s, T0 + 15_001, [receipt]);
    expect(r.changed).toBe(true);
    expect(r.extended).toEqual([{ receipt, deadline: T0 + 45_001 }]);
    expect(docJson(s).subscriptions[0].deliveries[0].lease.deadline).toBe(T0 + 45_001);
  });

  it("a worker heartbeating every ttl/3 never loses its lease and persists at most ~2 extensions per TTL", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    const ttl = 30_000;
    const receipt = claim(s, T0, { leaseTtlMs: ttl })[0]?.receipt as Receipt;
    let writes = 0;
    const periods = 20;
    for (let t = T0 + ttl / 3; t <= T0 + periods * ttl; t += ttl / 3) {
      expect(expire(s, t).leasesExpired).toBe(0);
      const r = heartbeat(s, t, [receipt]);
      expect(r.lost).toEqual([]);
      if (r.changed) writes += 1;
    }
    expect(writes).toBeLessThanOrEqual(2 * periods);
    expect(writes).toBeGreaterThanOrEqual(periods);
    expect(ack(s, T0 + periods * ttl, [receipt])).toEqual(["acked"]);
  });

  it("extends a lease that ran out but was not swept yet", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    const receipt = claim(s, T0, { leaseTtlMs: 1000 })[0]?.receipt as Receipt;
    const r = heartbeat(s, T0 + 5000, [receipt]);
    expect(r.changed).toBe(true);
    expect(r.extended[0]?.deadline).toBe(T0 + 6000);
    expect(expire(s, T0 + 5500).leasesExpired).toBe(0);
  });

  it("reports lost leases: swept, redelivered, acked, unknown", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"));
    const [a, b] = claim(s, T0, { leaseTtlMs: 1000 });
    const ra = a?.receipt as Receipt;
    const rb = b?.receipt as Receipt;
    ack(s, T0, [rb]);
    expire(s, T0 + 1000); // a swept
    expect(heartbeat(s, T0 + 1001, [ra, rb, { offset: 7, attempt: 1 }]).lost).toEqual([
      ra,
      rb,
      { offset: 7, attempt: 1 },
    ]);
    claim(s, T0 + 1001); // a redelivered as attempt 2
    const r = heartbeat(s, T0 + 1002, [ra, { offset: 0, attempt: 2 }]);
    expect(r.lost).toEqual([ra]);
    expect(r.extended.map((e) => e.receipt)).toEqual([{ offset: 0, attempt: 2 }]);
  });

  it("rejects bad input without touching the state", () => {
    const s = newShard();
    expectRejected(s, { kind: "heartbeat", subscription: "x", workerId: "w", receipts: [] }, T0, "not_found");
    expectRejected(
      s,
      { kind: "heartbeat", subscription: "default", workerId: "w", receipts: [{ offset: -1, attempt: 1 }] },
      T0,
      "invalid_argument",
    );
    expectRejected(
      s,
      { kind: "heartbeat", subscription: "default", workerId: "w", receipts: [{ offset: 0, attempt: 0 }] },
      T0,
      "invalid_argument",
    );
  });
});
