import { describe, expect, it } from "vitest";
import { claim, enqueue, expectCasqError, msg, newShard, T0 } from "../../testing/model-test-helpers.ts";
import { applyOperation } from "./apply-operation.ts";
import { inspectMessage, listDeadLetters } from "./shard-inspect.ts";

describe("inspection", () => {
  it("lists dead letters oldest first, with paging", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"), msg("c"));
    for (const c of claim(s, T0)) {
      applyOperation(
        s,
        {
          kind: "nack",
          subscription: "default",
          receipts: [c.receipt],
          deadLetter: true,
          reason: `r-${c.id}`,
        },
        T0,
      );
    }
    const page1 = listDeadLetters(s, "default", { limit: 2 });
    expect(page1.map((d) => [d.message.id, d.reason, d.attempts])).toEqual([
      ["a", "r-a", 1],
      ["b", "r-b", 1],
    ]);
    const page2 = listDeadLetters(s, "default", { afterOffset: page1[1]?.message.offset as number });
    expect(page2.map((d) => d.message.id)).toEqual(["c"]);
    expectCasqError(() => listDeadLetters(s, "nope"), "not_found");
  });

  it("shows where a message stands in each subscription", () => {
    const s = newShard();
    applyOperation(s, { kind: "createSubscription", name: "audit" }, T0);
    applyOperation(s, { kind: "createSubscription", name: "bulk" }, T0);
    enqueue(s, T0, msg("a"));
    claim(s, T0, { workerId: "w9", leaseTtlMs: 1000 });
    const [x] = claim(s, T0, { subscription: "audit" });
    applyOperation(
      s,
      { kind: "nack", subscription: "audit", receipts: [x?.receipt as never], deadLetter: true },
      T0,
    );
    const view = inspectMessage(s, "a");
    expect(view?.message.id).toBe("a");
    expect(view?.subscriptions).toEqual({
      audit: { state: "dead_lettered", attempts: 1, reason: "dead-lettered by the worker on attempt 1" },
      bulk: { state: "pending", runnableAt: T0, attempts: 0 },
      default: { state: "in_flight", attempts: 1, worker: "w9", leaseDeadline: T0 + 1000 },
    });
    expect(inspectMessage(s, 0)?.message.id).toBe("a");
    expect(inspectMessage(s, "zzz")).toBeUndefined();
  });
});
