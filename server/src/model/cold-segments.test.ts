import { describe, expect, it } from "vitest";
import {
  claim,
  docText,
  enqueue,
  expectCasqError,
  msg,
  newShard,
  T0,
} from "../../testing/model-test-helpers.ts";
import { seededRandom } from "../util/random.ts";
import { applyOperation } from "./apply-operation.ts";
import { coolable, coolSegment, warmSegment } from "./cold-segments.ts";
import { sealCandidates, sealSegment } from "./segment-mechanics.ts";
import { coldFront, coldFrontOf } from "./segment-residency.ts";
import { type MessageMeta, type MessageRecord, metaOf } from "./shard-records.ts";
import { ShardState } from "./shard-state.ts";
import { computeStats } from "./shard-stats.ts";

/** Seals the whole tail into segments of `per` messages; returns each segment's meta by name. */
function sealAll(s: ShardState, per: number): Map<string, MessageMeta[]> {
  const out = new Map<string, MessageMeta[]>();
  const all = sealCandidates(s, 0);
  for (let i = 0; i < all.length; i += per) {
    const chunk = all.slice(i, i + per);
    const name = `${String(chunk[0]?.msg.offset).padStart(20, "0")}-1-${i}.json`;
    const seg = sealSegment(s, chunk, { name, bytes: 100, sha256: "0".repeat(64), createdAt: T0 });
    out.set(name, seg.records.map(metaOf));
  }
  return out;
}

/** Cools every segment that may go cold; returns how many did. */
function coolAll(s: ShardState, now: number): number {
  let n = 0;
  for (const seg of s.segments.values())
    if (coolable(s, seg)) {
      coolSegment(s, seg, now);
      n += 1;
    }
  return n;
}

/** What the broker does before a batch: warms the cold segments at the claim fronts. */
function warmFronts(s: ShardState, metas: Map<string, MessageMeta[]>, now: number): void {
  for (let front = coldFront(s, now); front.length > 0; front = coldFront(s, now))
    for (const seg of front) warmSegment(s, seg, metas.get(seg.name) as MessageMeta[], now);
}

/** A shard with `n` messages of random priorities and delays, sealed into segments of 7, plus a second subscription. */
function mixedShard(n: number, seed: number): { s: ShardState; metas: Map<string, MessageMeta[]> } {
  const s = newShard();
  applyOperation(s, { kind: "createSubscription", name: "audit" }, T0);
  const random = seededRandom(seed);
  for (let i = 0; i < n; i++) {
    const priority = Math.floor(random.next() * 3);
    const delayed = random.next() < 0.2;
    enqueue(
      s,
      T0,
      msg(`m${i}`, { priority, ...(delayed ? { runAt: T0 + 1 + Math.floor(random.next() * 50) } : {}) }),
    );
  }
  return { s, metas: sealAll(s, 7) };
}

describe("cold segments", () => {
  it("claims come out in the same order, and the head is the same bytes, whether segments are cold or warm", () => {
    for (const seed of [1, 2, 3, 4]) {
      const warm = mixedShard(60, seed);
      const cold = mixedShard(60, seed);
      expect(coolAll(cold.s, T0)).toBe(cold.s.segments.size);
      expect(cold.s.messages.size).toBe(0);
      expect(docText(cold.s)).toBe(docText(warm.s));
      const order = (x: { s: ShardState; metas: Map<string, MessageMeta[]> }, sub: string) => {
        const out: string[] = [];
        for (let now = T0; now <= T0 + 60; now += 3) {
          for (;;) {
            warmFronts(x.s, x.metas, now);
            const got = claim(x.s, now, { max: 4, subscription: sub });
            if (got.length === 0) break;
            out.push(...got.map((c) => c.id));
            applyOperation(x.s, { kind: "ack", subscription: sub, receipts: got.map((c) => c.receipt) }, now);
          }
        }
        return out;
      };
      const expected = order(warm, "default");
      expect(expected).toHaveLength(60);
      expect(order(cold, "default")).toEqual(expected);
      expect(docText(cold.s)).toBe(docText(warm.s));
      expect(order(cold, "audit")).toEqual(order(warm, "audit"));
      expect(docText(cold.s)).toBe(docText(warm.s));
    }
  });

  it("a claim stops at a cold segment, and the segment is the front until warmed", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"), msg("c"), msg("d"));
    const metas = sealAll(s, 2);
    const [first, second] = [...s.segments.values()];
    if (first === undefined || second === undefined) throw new Error("two segments expected");
    coolSegment(s, second, T0);
    expect(claim(s, T0, { max: 4 }).map((c) => c.id)).toEqual(["a", "b"]);
    expect(coldFrontOf(s, "default", T0)).toBe(second);
    expect(claim(s, T0, { max: 4 })).toEqual([]);
    warmSegment(s, second, metas.get(second.name) as MessageMeta[], T0);
    expect(coldFrontOf(s, "default", T0)).toBeUndefined();
    expect(claim(s, T0, { max: 4 }).map((c) => c.id)).toEqual(["c", "d"]);
    expect(first.cold).toBe(false);
  });

  it("only an untouched segment may go cold: not one with a delivery, an ack, or a subscription part-way through", () => {
    const s = newShard({ retentionMs: 3_600_000 }); // acked messages stay
    enqueue(s, T0, msg("a"), msg("b"), msg("c"), msg("d"));
    sealAll(s, 2);
    const [first, second] = [...s.segments.values()];
    if (first === undefined || second === undefined) throw new Error("two segments expected");
    const got = claim(s, T0, { max: 1 });
    expect(coolable(s, first)).toBe(false); // a is leased
    applyOperation(s, { kind: "ack", subscription: "default", receipts: got.map((c) => c.receipt) }, T0);
    expect(coolable(s, first)).toBe(false); // acked a, b still owed: the subscription is part-way through
    expect(coolable(s, second)).toBe(true);
    applyOperation(s, { kind: "createSubscription", name: "late", from: "latest" }, T0);
    expect(coolable(s, second)).toBe(true); // "late" owes none of it
    // Once its acked message leaves the shard, the rest of the first segment is untouched again.
    applyOperation(s, { kind: "expire" }, T0 + 3_600_001);
    expect(coolable(s, first)).toBe(true);
  });

  it("stats count a cold segment by its run_at range, and the messages it holds", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"), msg("c", { runAt: T0 + 100 }), msg("d", { runAt: T0 + 200 }));
    sealAll(s, 2);
    const before = computeStats(s, T0);
    coolAll(s, T0);
    const after = computeStats(s, T0);
    expect(after.messages).toBe(4);
    expect(after.subscriptions[0]).toMatchObject({ ready: 2, delayed: 2, lag: 4 });
    expect(after.subscriptions[0]?.oldestUnackedAgeMs).toBe(before.subscriptions[0]?.oldestUnackedAgeMs);
  });

  it("decodes a head whose segments are not given as cold only when asked to, and only untouched ones", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"), msg("c"), msg("d"));
    const metas = sealAll(s, 2);
    claim(s, T0, { max: 1 }); // a is leased: its segment must be given
    const bytes = s.encode();
    const [first, second] = [...s.segments.keys()];
    expectCasqError(() => ShardState.decode(bytes, {}), "data_loss");
    expectCasqError(() => ShardState.decode(bytes, { cold: true }), "data_loss"); // the first is touched
    const decoded = ShardState.decode(bytes, {
      cold: true,
      segments: (ref) => (metas.get(ref.name) && ref.name === first ? metas.get(ref.name) : undefined),
    });
    expect(decoded.segments.get(first as string)?.cold).toBe(false);
    expect(decoded.segments.get(second as string)?.cold).toBe(true);
    expect(decoded.coldMessages).toBe(2);
    expect(docText(decoded)).toBe(docText(s));
    expect(claim(decoded, T0, { max: 4 }).map((c) => c.id)).toEqual(["b"]);
    expect(coldFrontOf(decoded, "default", T0)?.name).toBe(second);
  });

  it("the acked frontier never moves past a cold segment it owes", () => {
    const s = newShard({ retentionMs: 0 });
    enqueue(s, T0, msg("a"), msg("b"), msg("c"), msg("d"));
    sealAll(s, 2);
    const got = claim(s, T0, { max: 2 });
    applyOperation(s, { kind: "ack", subscription: "default", receipts: got.map((c) => c.receipt) }, T0);
    coolAll(s, T0);
    const doc = JSON.parse(docText(s));
    expect(doc.subscriptions[0].acked_below).toBe(2);
    expect(s.messages.size).toBe(0);
  });

  it("purge and deleting a subscription need every segment warm: unavailable, nothing changed", () => {
    const s = newShard();
    applyOperation(s, { kind: "createSubscription", name: "audit" }, T0);
    enqueue(s, T0, msg("a"), msg("b"));
    sealAll(s, 2);
    coolAll(s, T0);
    const before = docText(s);
    expectCasqError(() => applyOperation(s, { kind: "purge", subscription: "default" }, T0), "unavailable");
    expectCasqError(
      () => applyOperation(s, { kind: "deleteSubscription", name: "audit" }, T0),
      "unavailable",
    );
    expect(docText(s)).toBe(before);
    // Dead letters can be purged without reading any segment.
    expect(applyOperation(s, { kind: "purge", deadLetters: true }, T0)).toMatchObject({ kind: "purge" });
  });

  it("a subscription created from the earliest message owes the cold ones too", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"), msg("c"));
    const metas = sealAll(s, 3);
    coolAll(s, T0);
    const created = applyOperation(s, { kind: "createSubscription", name: "replay", from: "earliest" }, T0);
    expect(created).toMatchObject({ backlog: 3 });
    warmFronts(s, metas, T0);
    expect(claim(s, T0, { max: 5, subscription: "replay" }).map((c) => c.id)).toEqual(["a", "b", "c"]);
    expect(claim(s, T0, { max: 5 }).map((c) => c.id)).toEqual(["a", "b", "c"]);
  });

  it("refuses to warm a segment with records that are not its own", () => {
    const s = newShard();
    enqueue(s, T0, msg("a"), msg("b"));
    const metas = sealAll(s, 2);
    const seg = [...s.segments.values()][0];
    if (seg === undefined) throw new Error("a segment expected");
    coolSegment(s, seg, T0);
    const records = metas.get(seg.name) as MessageRecord[];
    expectCasqError(() => warmSegment(s, seg, records.slice(1), T0), "internal");
    expect(seg.cold).toBe(true);
  });
});
