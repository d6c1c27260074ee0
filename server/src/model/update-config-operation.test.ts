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

describe("updateConfig", () => {
  it("changes the config stored in the document", () => {
    const s = newShard();
    const r = applyOperation(
      s,
      { kind: "updateConfig", patch: { leaseTtlMs: 5000, backoff: { jitter: 0 } } },
      T0,
    );
    expect(r.changed).toBe(true);
    expect(r.config.leaseTtlMs).toBe(5000);
    expect(s.config.backoff.jitter).toBe(0);
    expect(docJson(s).config.lease_ttl_ms).toBe(5000);
    enqueue(s, T0, msg("a"));
    expect(claim(s, T0)[0]?.leaseDeadline).toBe(T0 + 5000);
  });

  it("reports no change for an identical config", () => {
    const s = newShard();
    expect(applyOperation(s, { kind: "updateConfig", patch: { maxAttempts: 5 } }, T0).changed).toBe(false);
  });

  it("applies a new retention to already settled messages", () => {
    const s = newShard({ retentionMs: 1_000_000 });
    enqueue(s, T0, msg("a"));
    const [c] = claim(s, T0);
    ack(s, T0, [c?.receipt as Receipt]);
    expect(expire(s, T0 + 10_000).messagesDropped).toBe(0);
    applyOperation(s, { kind: "updateConfig", patch: { retentionMs: 5000 } }, T0 + 10_000);
    expect(expire(s, T0 + 10_000).messagesDropped).toBe(1);
  });

  it("evicts the oldest dead letters when the limit goes down", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"), msg("c"));
    const claimed = claim(s, T0);
    applyOperation(
      s,
      { kind: "nack", subscription: "default", receipts: claimed.map((c) => c.receipt), deadLetter: true },
      T0,
    );
    const r = applyOperation(s, { kind: "updateConfig", patch: { deadLetterLimit: 1 } }, T0);
    expect(r.deadEvicted).toBe(2);
    const sub = docJson(s).subscriptions[0];
    expect(sub.dead_letters.map((d: { message: { id: string } }) => d.message.id)).toEqual(["c"]);
    expect(sub.counters.dead_evicted).toBe(2);
  });

  it("bounds dead letters per subscription, evicting the oldest with a counter", () => {
    const s = newShard({ deadLetterLimit: 2 });
    enqueue(s, T0, msg("a"), msg("b"), msg("c"));
    for (const c of claim(s, T0)) {
      applyOperation(
        s,
        { kind: "nack", subscription: "default", receipts: [c.receipt], deadLetter: true },
        T0,
      );
    }
    const doc = docJson(s);
    expect(doc.subscriptions[0].dead_letters.map((d: { message: { id: string } }) => d.message.id)).toEqual([
      "b",
      "c",
    ]);
    expect(doc.counters.dead_evicted).toBe(1);
  });

  it("rejects invalid patches without touching the state", () => {
    const s = newShard();
    expectRejected(s, { kind: "updateConfig", patch: { maxAttempts: 0 } }, T0, "invalid_argument");
    expectRejected(s, { kind: "updateConfig", patch: { bogus: 1 } as never }, T0, "invalid_argument");
    expectRejected(
      s,
      { kind: "updateConfig", patch: { maxPayloadBytes: 128 * 1024, maxDocumentBytes: 64 * 1024 } },
      T0,
      "invalid_argument",
    );
  });
});
