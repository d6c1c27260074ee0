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

describe("purge", () => {
  it("of a subscription settles ready, delayed and in-flight messages for it only", () => {
    const s = newShard();
    applyOperation(s, { kind: "createSubscription", name: "audit" }, T0);
    enqueue(s, T0, msg("ready"), msg("delayed", { delayMs: 5000 }), msg("flying"));
    const flying = claim(s, T0, { max: 2 }).find((c) => c.id === "flying");
    const r = applyOperation(s, { kind: "purge", subscription: "default" }, T0);
    expect(r).toEqual({
      kind: "purge",
      subscription: "default",
      messagesPurged: 3,
      leasesDropped: 2,
      deadLettersPurged: 0,
      changed: true,
    });
    expect(claim(s, T0 + 10_000)).toEqual([]);
    expect(ids(claim(s, T0 + 10_000, { subscription: "audit" }))).toEqual(["ready", "delayed", "flying"]);
    // a later ack of a purged delivery is harmless: already_acked
    expect(ack(s, T0, [flying?.receipt as Receipt])).toEqual(["already_acked"]);
    expect(docJson(s).subscriptions[1].counters.purged).toBe(3);
  });

  it("of everything drops every message, keeps dead letters and dedup ids", () => {
    const s = newShard();
    enqueue(s, T0, msg("a", { dedupId: "d" }), msg("b"), msg("c"));
    const [a] = claim(s, T0, { max: 1 });
    applyOperation(
      s,
      { kind: "nack", subscription: "default", receipts: [a?.receipt as Receipt], deadLetter: true },
      T0,
    );
    claim(s, T0, { max: 1 });
    const r = applyOperation(s, { kind: "purge" }, T0);
    expect(r).toMatchObject({ messagesPurged: 2, leasesDropped: 1, subscription: undefined });
    const doc = docJson(s);
    expect(doc.messages).toEqual([]);
    expect(doc.subscriptions[0].deliveries).toEqual([]);
    expect(doc.subscriptions[0].dead_letters.length).toBe(1);
    expect(doc.dedup.length).toBe(1);
    expect(enqueue(s, T0, msg("z", { dedupId: "d" }))[0]?.duplicate).toBe(true);
    expect(s.nextOffset).toBe(3); // offsets are not reused
    expect(enqueue(s, T0, msg("n"))[0]?.offset).toBe(3);
  });

  it("of dead letters clears them (one subscription or all)", () => {
    const s = newShard({ maxAttempts: 1 });
    applyOperation(s, { kind: "createSubscription", name: "audit" }, T0);
    enqueue(s, T0, msg("a"));
    for (const sub of ["default", "audit"]) {
      const [c] = claim(s, T0, { subscription: sub });
      applyOperation(s, { kind: "nack", subscription: sub, receipts: [c?.receipt as Receipt] }, T0);
    }
    expect(
      applyOperation(s, { kind: "purge", subscription: "audit", deadLetters: true }, T0).deadLettersPurged,
    ).toBe(1);
    expect(docJson(s).subscriptions.map((x: { dead_letters: unknown[] }) => x.dead_letters.length)).toEqual([
      0, 1,
    ]);
    expect(applyOperation(s, { kind: "purge", deadLetters: true }, T0).deadLettersPurged).toBe(1);
    expect(applyOperation(s, { kind: "purge", deadLetters: true }, T0).changed).toBe(false);
  });

  it("rejects an unknown subscription without touching the state", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"));
    expectRejected(s, { kind: "purge", subscription: "nope" }, T0, "not_found");
  });
});
