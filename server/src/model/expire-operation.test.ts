import { describe, expect, it } from "vitest";
import {
  ack,
  claim,
  docJson,
  enqueue,
  expire,
  ids,
  msg,
  newShard,
  T0,
} from "../../testing/model-test-helpers.ts";
import { applyOperation } from "./apply-operation.ts";
import type { Receipt } from "./operations.ts";

describe("expire", () => {
  it("does nothing when nothing is due", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    claim(s, T0);
    expect(expire(s, T0 + 1000)).toEqual({
      kind: "expire",
      leasesExpired: 0,
      redelivered: 0,
      deadLettered: 0,
      dedupPruned: 0,
      messagesDropped: 0,
      changed: false,
    });
  });

  it("redelivers an expired lease right away with attempt + 1", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"));
    claim(s, T0, { leaseTtlMs: 1000 });
    expect(expire(s, T0 + 999).leasesExpired).toBe(0);
    const r = expire(s, T0 + 1000);
    expect(r).toMatchObject({ leasesExpired: 2, redelivered: 2, deadLettered: 0, changed: true });
    expect(docJson(s).subscriptions[0].deliveries).toEqual([
      { offset: 0, attempts: 1 },
      { offset: 1, attempts: 1 },
    ]);
    const again = claim(s, T0 + 1000);
    expect(ids(again)).toEqual(["a", "b"]);
    expect(again.map((c) => c.attempt)).toEqual([2, 2]);
    expect(docJson(s).counters.redelivered).toBe(2);
  });

  it("ignores leases that were extended, acked or re-claimed since", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"));
    const [a, b] = claim(s, T0, { leaseTtlMs: 1000 });
    applyOperation(
      s,
      { kind: "heartbeat", subscription: "default", workerId: "w", receipts: [a?.receipt as Receipt] },
      T0 + 600,
    );
    ack(s, T0 + 600, [b?.receipt as Receipt]);
    expect(expire(s, T0 + 1000).leasesExpired).toBe(0);
    expect(expire(s, T0 + 1600).leasesExpired).toBe(1);
  });

  it("dead-letters after max attempts of expired leases", () => {
    const s = newShard({ maxAttempts: 3 });
    enqueue(s, T0, msg("a"));
    let now = T0;
    for (let attempt = 1; attempt <= 3; attempt++) {
      const [c] = claim(s, now, { leaseTtlMs: 1000 });
      expect(c?.attempt).toBe(attempt);
      now += 1000;
      const r = expire(s, now);
      expect(r.leasesExpired).toBe(1);
      expect(r.deadLettered).toBe(attempt === 3 ? 1 : 0);
    }
    expect(claim(s, now)).toEqual([]);
    const dl = docJson(s).subscriptions[0].dead_letters[0];
    expect(dl).toMatchObject({ attempts: 3, dead_at: now });
    expect(dl.reason).toContain("lease expired");
    expect(docJson(s).messages).toEqual([]);
  });

  it("drops settled messages once retention passed", () => {
    const s = newShard({ retentionMs: 10_000 });
    enqueue(s, T0, msg("a"), msg("b"));
    const [a] = claim(s, T0, { max: 1 });
    ack(s, T0 + 1000, [a?.receipt as Receipt]);
    expect(docJson(s).messages.length).toBe(2); // retained
    expect(expire(s, T0 + 9999).messagesDropped).toBe(0);
    expect(expire(s, T0 + 10_000).messagesDropped).toBe(1);
    expect(docJson(s).messages.map((m: { id: string }) => m.id)).toEqual(["b"]);
    // a message settled after its retention passed leaves at once
    const [b] = claim(s, T0 + 20_000);
    ack(s, T0 + 20_000, [b?.receipt as Receipt]);
    expect(docJson(s).messages).toEqual([]);
    expect(docJson(s).counters.dropped).toBe(2);
  });

  it("prunes dedup ids whose window passed", () => {
    const s = newShard({ dedupWindowMs: 5000 });
    enqueue(s, T0, msg("a", { dedupId: "x" }));
    enqueue(s, T0 + 1000, msg("b", { dedupId: "y" }));
    expect(expire(s, T0 + 5000).dedupPruned).toBe(1);
    expect(docJson(s).dedup.map((d: { dedup_id: string }) => d.dedup_id)).toEqual(["y"]);
  });
});
