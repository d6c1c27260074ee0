import { describe, expect, it } from "vitest";
import {
  ack,
  claim,
  docJson,
  enqueue,
  expectRejected,
  expire,
  ids,
  msg,
  newShard,
  T0,
} from "../../testing/model-test-helpers.ts";
import { applyOperation } from "./apply-operation.ts";
import type { Receipt } from "./operations.ts";

describe("ack", () => {
  it("acks, drops the message, and is idempotent", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"));
    const [a] = claim(s, T0, { max: 1 });
    const r = a?.receipt as Receipt;
    expect(ack(s, T0, [r])).toEqual(["acked"]);
    expect(docJson(s).messages.map((m: { id: string }) => m.id)).toEqual(["b"]);
    const again = applyOperation(s, { kind: "ack", subscription: "default", receipts: [r] }, T0);
    expect(again.results).toEqual([{ receipt: r, outcome: "already_acked" }]);
    expect(again.changed).toBe(false);
    expect(ids(claim(s, T0))).toEqual(["b"]);
    expect(claim(s, T0 + 10_000_000)).toEqual([]); // never redelivered
  });

  it("answers per receipt in order", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"));
    const [a, b] = claim(s, T0);
    expect(
      ack(s, T0, [
        a?.receipt as Receipt,
        a?.receipt as Receipt,
        { offset: 1, attempt: 2 },
        b?.receipt as Receipt,
      ]),
    ).toEqual(["acked", "already_acked", "lease_lost", "acked"]);
  });

  it("accepts an expired lease while the message was not re-claimed, swept or not", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"));
    const [a, b] = claim(s, T0, { leaseTtlMs: 1000 });
    expect(ack(s, T0 + 5000, [a?.receipt as Receipt])).toEqual(["acked"]); // not swept
    expire(s, T0 + 5000);
    expect(ack(s, T0 + 6000, [b?.receipt as Receipt])).toEqual(["acked"]); // swept, not re-claimed
    expect(claim(s, T0 + 6000)).toEqual([]);
  });

  it("reports lease_lost once the message was redelivered as a later attempt", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    const old = claim(s, T0, { leaseTtlMs: 1000 })[0]?.receipt as Receipt;
    expire(s, T0 + 1000);
    const fresh = claim(s, T0 + 1000)[0]?.receipt as Receipt;
    expect(fresh).toEqual({ offset: 0, attempt: 2 });
    expect(ack(s, T0 + 1001, [old])).toEqual(["lease_lost"]);
    expect(ack(s, T0 + 1001, [fresh])).toEqual(["acked"]);
    expect(ack(s, T0 + 1002, [old])).toEqual(["already_acked"]);
  });

  it("reports lease_lost for a dead-lettered message", () => {
    const s = newShard({ maxAttempts: 1 });
    enqueue(s, T0, msg("a"));
    const r = claim(s, T0, { leaseTtlMs: 1000 })[0]?.receipt as Receipt;
    expect(expire(s, T0 + 1000).deadLettered).toBe(1);
    expect(ack(s, T0 + 1001, [r])).toEqual(["lease_lost"]);
  });

  it("acks only in its own subscription (fan-out)", () => {
    const s = newShard();
    applyOperation(s, { kind: "createSubscription", name: "audit" }, T0);
    enqueue(s, T0, msg("a"));
    const r = claim(s, T0)[0]?.receipt as Receipt;
    expect(ack(s, T0, [r])).toEqual(["acked"]);
    expect(docJson(s).messages.length).toBe(1); // audit still owes it
    expect(ack(s, T0, [r], "audit")).toEqual(["lease_lost"]); // never delivered to audit
    const ra = claim(s, T0, { subscription: "audit" })[0]?.receipt as Receipt;
    expect(ack(s, T0, [ra], "audit")).toEqual(["acked"]);
    expect(docJson(s).messages.length).toBe(0);
  });

  it("rejects bad input without touching the state", () => {
    const s = newShard({ maxBatch: 2 });
    enqueue(s, T0, msg("a"));
    claim(s, T0);
    expectRejected(s, { kind: "ack", subscription: "nope", receipts: [] }, T0, "not_found");
    expectRejected(
      s,
      {
        kind: "ack",
        subscription: "default",
        receipts: [
          { offset: 0, attempt: 1 },
          { offset: 1.5, attempt: 1 },
        ],
      },
      T0,
      "invalid_argument",
    );
    expectRejected(
      s,
      { kind: "ack", subscription: "default", receipts: "x" as never },
      T0,
      "invalid_argument",
    );
    expectRejected(
      s,
      {
        kind: "ack",
        subscription: "default",
        receipts: [
          { offset: 0, attempt: 1 },
          { offset: 0, attempt: 1 },
          { offset: 0, attempt: 1 },
        ],
      },
      T0,
      "resource_exhausted",
    );
  });
});
