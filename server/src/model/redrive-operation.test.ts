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
import type { Receipt } from "./operations.ts";
import type { ShardState } from "./shard-state.ts";

function kill(s: ShardState, now: number, subscription = "default", max = 100) {
  const claimed = claim(s, now, { subscription, max });
  applyOperation(
    s,
    { kind: "nack", subscription, receipts: claimed.map((c) => c.receipt), deadLetter: true },
    now,
  );
  return claimed;
}

describe("redrive", () => {
  it("brings back a message that left the shard, addressed only to that subscription", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"));
    const [a] = kill(s, T0, "default", 1);
    expect(docJson(s).messages.map((m: { id: string }) => m.id)).toEqual(["b"]);
    applyOperation(s, { kind: "createSubscription", name: "late", from: "earliest" }, T0);
    const r = applyOperation(s, { kind: "redrive", subscription: "default" }, T0 + 10);
    expect(r).toEqual({
      kind: "redrive",
      subscription: "default",
      redriven: 1,
      ids: ["a"],
      missing: [],
      changed: true,
    });
    const doc = docJson(s);
    expect(
      doc.messages.map((m: { id: string; offset: number; targets?: string[] }) => [
        m.id,
        m.offset,
        m.targets,
      ]),
    ).toEqual([
      ["a", 0, ["default"]],
      ["b", 1, undefined],
    ]);
    expect(doc.subscriptions[0].dead_letters).toEqual([]);
    expect(doc.subscriptions[0].deliveries).toEqual([{ offset: 0, attempts: 1, attempts_at_redrive: 1 }]);
    // runnable at once, in claim order, with a fresh budget and a new attempt number
    const again = claim(s, T0 + 10);
    expect(ids(again)).toEqual(["a", "b"]);
    expect(again[0]?.receipt).toEqual({ offset: 0, attempt: 2 });
    expect(again[0]?.maxAttempts).toBe(1 + 5);
    // the old receipt cannot settle the new delivery
    expect(ack(s, T0 + 10, [a?.receipt as Receipt])).toEqual(["lease_lost"]);
    // other subscriptions never see it
    expect(ids(claim(s, T0 + 10, { subscription: "late" }))).toEqual(["b"]);
    expect(ack(s, T0 + 10, [again[0]?.receipt as Receipt])).toEqual(["acked"]);
    expect(docJson(s).messages.map((m: { id: string }) => m.id)).toEqual(["b"]);
  });

  it("re-targets a message still in the shard for other subscriptions", () => {
    const s = newShard();
    applyOperation(s, { kind: "createSubscription", name: "audit" }, T0);
    enqueue(s, T0, msg("a"));
    kill(s, T0, "default");
    applyOperation(s, { kind: "redrive", subscription: "default" }, T0);
    expect(docJson(s).messages[0].targets).toEqual(["audit", "default"]);
    const [d] = claim(s, T0);
    ack(s, T0, [d?.receipt as Receipt]);
    expect(docJson(s).messages[0].targets).toEqual(["audit"]);
    const [x] = claim(s, T0, { subscription: "audit" });
    expect(x?.attempt).toBe(1);
    ack(s, T0, [x?.receipt as Receipt], "audit");
    expect(docJson(s).messages).toEqual([]);
  });

  it("redrives by ids and by limit, oldest first, and reports missing ids", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"), msg("c"));
    kill(s, T0);
    const byId = applyOperation(s, { kind: "redrive", subscription: "default", ids: ["c", "zz"] }, T0);
    expect(byId).toMatchObject({ redriven: 1, ids: ["c"], missing: ["zz"] });
    const byLimit = applyOperation(s, { kind: "redrive", subscription: "default", limit: 1 }, T0);
    expect(byLimit).toMatchObject({ redriven: 1, ids: ["a"], missing: [] });
    const both = applyOperation(
      s,
      { kind: "redrive", subscription: "default", ids: ["b", "a"], limit: 5 },
      T0,
    );
    expect(both).toMatchObject({ redriven: 1, ids: ["b"], missing: ["a"] });
    expect(applyOperation(s, { kind: "redrive", subscription: "default" }, T0).changed).toBe(false);
    expect(docJson(s).counters.redriven).toBe(3);
  });

  it("gives a fresh attempt budget after a dead letter by exhaustion", () => {
    const s = newShard({ maxAttempts: 1 });
    enqueue(s, T0, msg("a"));
    const [c] = claim(s, T0);
    applyOperation(s, { kind: "nack", subscription: "default", receipts: [c?.receipt as Receipt] }, T0);
    expect(docJson(s).subscriptions[0].dead_letters.length).toBe(1);
    applyOperation(s, { kind: "redrive", subscription: "default" }, T0);
    const [again] = claim(s, T0);
    expect(again).toMatchObject({ attempt: 2, maxAttempts: 2 });
    applyOperation(s, { kind: "nack", subscription: "default", receipts: [again?.receipt as Receipt] }, T0);
    expect(docJson(s).subscriptions[0].dead_letters[0].attempts).toBe(2);
  });

  it("refuses to re-insert a message whose id was reused, without touching the state", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    kill(s, T0);
    enqueue(s, T0, msg("a")); // the id is free again once the message left
    expectRejected(s, { kind: "redrive", subscription: "default" }, T0, "failed_precondition");
  });

  it("rejects bad input without touching the state", () => {
    const s = newShard();
    expectRejected(s, { kind: "redrive", subscription: "nope" }, T0, "not_found");
    expectRejected(s, { kind: "redrive", subscription: "default", limit: 0 }, T0, "invalid_argument");
    expectRejected(
      s,
      { kind: "redrive", subscription: "default", ids: "a" as never },
      T0,
      "invalid_argument",
    );
  });
});
