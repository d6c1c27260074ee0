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

describe("subscriptions", () => {
  it("a new shard has the default subscription", () => {
    expect(newShard().subscriptionNames()).toEqual(["default"]);
    expect(newShard().hasSubscription("default")).toBe(true);
    expect(newShard().hasSubscription("other")).toBe(false);
  });

  it("'latest' sees only messages enqueued after its creation", () => {
    const s = newShard();
    enqueue(s, T0, msg("old"));
    const r = applyOperation(s, { kind: "createSubscription", name: "late" }, T0 + 1);
    expect(r).toEqual({
      kind: "createSubscription",
      name: "late",
      from: "latest",
      backlog: 0,
      changed: true,
    });
    enqueue(s, T0 + 2, msg("new"));
    expect(ids(claim(s, T0 + 2, { subscription: "late" }))).toEqual(["new"]);
    expect(s.subscriptionNames()).toEqual(["default", "late"]);
  });

  it("'earliest' also gets every retained message, but not redriven ones addressed elsewhere", () => {
    const s = newShard({ retentionMs: 60_000 });
    enqueue(s, T0, msg("a"), msg("b"));
    const [a] = claim(s, T0, { max: 1 });
    ack(s, T0, [a?.receipt as Receipt]); // a settled everywhere but retained
    const r = applyOperation(s, { kind: "createSubscription", name: "replay", from: "earliest" }, T0 + 1);
    expect(r.backlog).toBe(2);
    expect(ids(claim(s, T0 + 1, { subscription: "replay" }))).toEqual(["a", "b"]);
    expect(docJson(s).subscriptions[1].counters.enqueued).toBe(2);
  });

  it("delete drops what only it was holding, with its leases and dead letters", () => {
    const s = newShard();
    applyOperation(s, { kind: "createSubscription", name: "audit" }, T0);
    enqueue(s, T0, msg("a"), msg("b"), msg("c"));
    const all = claim(s, T0); // default leases a, b, c
    ack(s, T0, [all[0]?.receipt as Receipt, all[1]?.receipt as Receipt]); // default done with a, b
    const [x] = claim(s, T0, { subscription: "audit", max: 1 });
    applyOperation(
      s,
      { kind: "nack", subscription: "audit", receipts: [x?.receipt as Receipt], deadLetter: true },
      T0,
    ); // audit: a dead
    claim(s, T0, { subscription: "audit", max: 1 }); // audit leases b
    const r = applyOperation(s, { kind: "deleteSubscription", name: "audit" }, T0);
    expect(r).toEqual({
      kind: "deleteSubscription",
      name: "audit",
      messagesDropped: 1, // b (a was already gone; c still owed by default)
      leasesDropped: 1,
      deadLettersDropped: 1,
      changed: true,
    });
    expect(docJson(s).messages.map((m: { id: string }) => m.id)).toEqual(["c"]);
    expect(s.subscriptionNames()).toEqual(["default"]);
  });

  it("allows deleting and re-creating default", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    applyOperation(s, { kind: "deleteSubscription", name: "default" }, T0);
    expect(docJson(s).messages).toEqual([]);
    applyOperation(s, { kind: "createSubscription", name: "default" }, T0);
    enqueue(s, T0, msg("b"));
    expect(ids(claim(s, T0))).toEqual(["b"]);
  });

  it("rejects bad requests without touching the state", () => {
    const s = newShard({ maxSubscriptions: 2 });
    expectRejected(s, { kind: "createSubscription", name: "default" }, T0, "already_exists");
    expectRejected(s, { kind: "createSubscription", name: "Bad Name" }, T0, "invalid_argument");
    expectRejected(
      s,
      { kind: "createSubscription", name: "x", from: "middle" as never },
      T0,
      "invalid_argument",
    );
    expectRejected(s, { kind: "deleteSubscription", name: "nope" }, T0, "not_found");
    applyOperation(s, { kind: "createSubscription", name: "two" }, T0);
    expectRejected(s, { kind: "createSubscription", name: "three" }, T0, "resource_exhausted");
  });
});
