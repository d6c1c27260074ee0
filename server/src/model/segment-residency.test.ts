import { describe, expect, it } from "vitest";
import { claim, docJson, enqueue, msg, newShard, T0 } from "../../testing/model-test-helpers.ts";
import { applyOperation } from "./apply-operation.ts";
import type { Receipt } from "./operations.ts";
import { sealCandidates, sealSegment } from "./segment-mechanics.ts";
import { claimFront, claimPositions, segmentAfter, segmentsNeededBy } from "./segment-residency.ts";
import { hasBody, type MessageRecord } from "./shard-records.ts";
import type { ShardState } from "./shard-state.ts";

/** Seals the whole tail into segments of `per` messages; returns the whole records by segment name. */
function sealAll(s: ShardState, per: number): Map<string, MessageRecord[]> {
  const out = new Map<string, MessageRecord[]>();
  const all = sealCandidates(s, 0);
  for (let i = 0; i < all.length; i += per) {
    const chunk = all.slice(i, i + per);
    const whole = chunk.map((m) => m.msg as MessageRecord);
    const name = `${String(i).padStart(20, "0")}-1-${i}.json`;
    sealSegment(s, chunk, { name, bytes: 100, sha256: "0".repeat(64), createdAt: T0 });
    out.set(name, whole);
  }
  return out;
}

function nackDead(s: ShardState, now: number, receipts: Receipt[]) {
  return applyOperation(s, { kind: "nack", subscription: "default", receipts, deadLetter: true }, now);
}

describe("sealed messages whose bodies are paged out", () => {
  it("are held as meta only, and still claimed in order, naming the segment to fill the body from", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"), msg("c"));
    const names = [...sealAll(s, 2).keys()];
    for (const m of s.messages.values()) expect(hasBody(m.msg)).toBe(false);
    const got = claim(s, T0, { max: 3 });
    expect(got.map((c) => c.id)).toEqual(["a", "b", "c"]);
    expect(got.map((c) => c.bodyIn)).toEqual([names[0], names[0], names[1]]);
    expect(got.every((c) => c.payload.byteLength === 0)).toBe(true);
  });

  it("a dead-letter nack is refused with unavailable and changes nothing until the body is paged in", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"));
    const pages = sealAll(s, 2);
    const got = claim(s, T0, { max: 2 });
    const before = docJson(s);
    expect(() =>
      nackDead(
        s,
        T0 + 1,
        got.map((c) => c.receipt),
      ),
    ).toThrow(/not in memory yet/);
    expect(docJson(s)).toEqual(before);
    // Paged in: the dead letters are whole copies.
    s.bodies = (segment, offset) => pages.get(segment)?.find((r) => r.offset === offset);
    const res = nackDead(
      s,
      T0 + 1,
      got.map((c) => c.receipt),
    );
    expect(res.results.map((r) => r.outcome)).toEqual(["dead_lettered", "dead_lettered"]);
    const whole = [...pages.values()].flat();
    const dead = docJson(s).subscriptions[0].dead_letters as { message: { payload: string } }[];
    expect(dead.map((d) => d.message.payload)).toEqual(
      whole.map((r) => Buffer.from(r.payload).toString("base64")),
    );
  });

  it("a lease expiry that would dead-letter waits for the body, then dead-letters it", () => {
    const s = newShard({ maxAttempts: 1, leaseTtlMs: 1000 });
    enqueue(s, T0, msg("a"));
    const pages = sealAll(s, 1);
    claim(s, T0, { max: 1 });
    const sweep = applyOperation(s, { kind: "expire" }, T0 + 2000);
    expect(sweep).toMatchObject({ leasesExpired: 0, deadLettered: 0 });
    expect(segmentsNeededBy(s, [], T0 + 2000, 0).map((seg) => seg.name)).toEqual([...pages.keys()]);
    s.bodies = (segment, offset) => pages.get(segment)?.find((r) => r.offset === offset);
    const later = applyOperation(s, { kind: "expire" }, T0 + 2001);
    expect(later).toMatchObject({ leasesExpired: 1, deadLettered: 1 });
    expect(docJson(s).subscriptions[0].dead_letters).toHaveLength(1);
  });

  it("names the segments a batch needs, where claims start, and the segment after another", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"), msg("c"), msg("d"));
    const names = [...sealAll(s, 2).keys()];
    expect(claimFront(s, T0).map((seg) => seg.name)).toEqual([names[0]]);
    const first = s.segments.get(names[0] as string);
    expect(first && segmentAfter(s, first)?.name).toBe(names[1]);
    const got = claim(s, T0, { max: 3 });
    expect(claimFront(s, T0).map((seg) => seg.name)).toEqual([names[1]]);
    const ops = [{ kind: "nack" as const, subscription: "default", receipts: [got[2]?.receipt as Receipt] }];
    expect(segmentsNeededBy(s, ops, T0, 0).map((seg) => seg.name)).toEqual([names[1]]);
  });

  it("says whether some subscription is caught up: its next claim is in the head's tail or nothing is runnable", () => {
    const s = newShard();
    applyOperation(s, { kind: "createSubscription", name: "audit" }, T0);
    enqueue(s, T0, msg("a"), msg("b"), msg("c"), msg("d"));
    const names = [...sealAll(s, 2).keys()];
    enqueue(s, T0, msg("e")); // in the tail
    expect(claimPositions(s, T0)).toMatchObject({ caughtUp: false });
    expect(claimPositions(s, T0).front.map((seg) => seg.name)).toEqual([names[0]]);
    claim(s, T0, { max: 4 }); // default's next claim is now "e", in the tail
    expect(claimPositions(s, T0).caughtUp).toBe(true);
    expect(claimPositions(s, T0).front.map((seg) => seg.name)).toEqual([names[0]]); // audit's
    claim(s, T0, { max: 1 }); // default has nothing runnable
    expect(claimPositions(s, T0).caughtUp).toBe(true);
  });
});
