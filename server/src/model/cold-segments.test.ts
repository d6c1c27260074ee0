import { describe, expect, it } from "vitest";
import {
  ack,
  claim,
  docText,
  enqueue,
  expectCasqError,
  expire,
  msg,
  newShard,
  T0,
} from "../../testing/model-test-helpers.ts";
import { seededRandom } from "../util/random.ts";
import { applyOperation } from "./apply-operation.ts";
import { coolable, coolSegment, warmSegment } from "./cold-segments.ts";
import { sealCandidates, sealSegment } from "./segment-mechanics.ts";
import { coldFront, coldFrontOf, coldSegmentsOfDeadLetters } from "./segment-residency.ts";
import { hasBody, type MessageMeta, type MessageRecord, metaOf } from "./shard-records.ts";
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
  const subs = [...s.subs.keys()];
  for (let front = coldFront(s, now, subs); front.length > 0; front = coldFront(s, now, subs))
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

  it("refuses (data_loss) to warm a segment whose head entry says an offset left that the segment does not hold", () => {
    const s = newShard({ retentionMs: 0 });
    enqueue(s, T0, msg("a"), msg("b"), msg("c"));
    const [, b] = claim(s, T0, { max: 2 });
    if (b === undefined) throw new Error("b expected");
    ack(s, T0, [b.receipt]);
    expire(s, T0); // b leaves before sealing: the segment holds offsets 0 and 2
    const metas = sealAll(s, 10);
    const seg = [...s.segments.values()][0];
    if (seg === undefined || seg.count !== 2) throw new Error("a segment of two expected");
    const records = metas.get(seg.name) as MessageMeta[];
    coolSegment(s, seg, T0);
    seg.gone.add(1); // a corrupt head: offset 1 never was in the segment
    expectCasqError(() => warmSegment(s, seg, records, T0), "data_loss");
    expect(seg.cold).toBe(true);
  });

  it("the acked frontier passes the offsets that left a cold segment, as it would were the segment warm", () => {
    const build = () => {
      const s = newShard({ retentionMs: 0 });
      enqueue(s, T0, msg("a"), msg("b", { priority: 5 }), msg("c"), msg("d"));
      const all = sealCandidates(s, 0);
      const object = (name: string) => ({ name, bytes: 100, sha256: "0".repeat(64), createdAt: T0 });
      sealSegment(s, all.slice(0, 1), object("00000000000000000000-1-0.json"));
      const second = sealSegment(s, all.slice(1), object("00000000000000000001-1-1.json"));
      const got = claim(s, T0, { max: 1 }); // b, the second segment's first message, leaves the shard
      applyOperation(s, { kind: "ack", subscription: "default", receipts: got.map((c) => c.receipt) }, T0);
      return { s, second };
    };
    const warm = build();
    const cold = build();
    expect(coolable(cold.s, cold.second)).toBe(true);
    coolSegment(cold.s, cold.second, T0);
    for (const { s } of [warm, cold]) {
      const got = claim(s, T0, { max: 1 });
      expect(got.map((c) => c.id)).toEqual(["a"]);
      applyOperation(s, { kind: "ack", subscription: "default", receipts: got.map((c) => c.receipt) }, T0);
    }
    expect(JSON.parse(docText(cold.s)).subscriptions[0].acked_below).toBe(2);
    expect(docText(cold.s)).toBe(docText(warm.s));
  });

  it("a redriven message inside a segment's range keeps the segment warm (a state and its head agree)", () => {
    const s = newShard({ retentionMs: 0, maxAttempts: 1 });
    enqueue(s, T0, msg("a"), msg("b"), msg("c", { priority: 9 }));
    sealAll(s, 3);
    const seg = [...s.segments.values()][0];
    if (seg === undefined) throw new Error("a segment expected");
    s.bodies = (_segment, offset) =>
      offset === 2
        ? ({ ...seg.records[2], payload: new Uint8Array(0), headers: {}, traceContext: undefined } as never)
        : undefined;
    const got = claim(s, T0, { max: 1 });
    expect(got.map((c) => c.id)).toEqual(["c"]);
    applyOperation(
      s,
      { kind: "nack", subscription: "default", receipts: got.map((c) => c.receipt), deadLetter: true },
      T0,
    );
    applyOperation(s, { kind: "redrive", subscription: "default" }, T0);
    expect(coolable(s, seg)).toBe(false);
  });
});

/**
 * A broker-like driver: before each operation the cold segments its claims
 * (or a redrive, purge) need are warmed; after it, the head is encoded and
 * every coolable segment goes cold. Checks after every step that the head
 * decodes with those segments cold and encodes to the same bytes.
 */
function drive(seed: number, cooling: boolean): { claimed: string[]; head: string } {
  const random = seededRandom(seed);
  const s = newShard({ retentionMs: random.next() < 0.5 ? 0 : 30, maxAttempts: 2, leaseTtlMs: 100 });
  applyOperation(s, { kind: "createSubscription", name: "audit" }, T0);
  const whole = new Map<number, MessageRecord>();
  const metas = new Map<string, MessageMeta[]>();
  s.bodies = (_segment, offset) => whole.get(offset);
  const claimed: string[] = [];
  const leased: { sub: string; receipt: { offset: number; attempt: number } }[] = [];
  let n = 0;
  let now = T0;
  const warm = (segs: Iterable<(typeof s.coldSegments)[number]>) => {
    for (const seg of [...segs]) warmSegment(s, seg, metas.get(seg.name) as MessageMeta[], now);
  };
  /** As the broker does before a claim: warm the fronts until the front is a message. */
  const warmFrontOf = (sub: string) => {
    for (let front = coldFront(s, now, [sub]); front.length > 0; front = coldFront(s, now, [sub]))
      warm(front);
  };
  for (let step = 0; step < 120; step++) {
    now += Math.floor(random.next() * 20);
    const roll = random.next();
    const sub = random.next() < 0.6 ? "default" : "audit";
    if (roll < 0.35) {
      const batch = Array.from({ length: 1 + Math.floor(random.next() * 4) }, () =>
        msg(`m${n++}`, {
          priority: Math.floor(random.next() * 3),
          ...(random.next() < 0.2 ? { runAt: now + Math.floor(random.next() * 80) } : {}),
        }),
      );
      enqueue(s, now, ...batch);
      for (const m of s.tail.values()) {
        const record = m.msg;
        if (hasBody(record)) whole.set(record.offset, record);
      }
      const sealed = sealCandidates(s, 600);
      if (sealed.length > 0) {
        const name = `${String(sealed[0]?.msg.offset).padStart(20, "0")}-1-${step}.json`;
        const seg = sealSegment(s, sealed, { name, bytes: 100, sha256: "0".repeat(64), createdAt: now });
        metas.set(name, seg.records.map(metaOf));
      }
    } else if (roll < 0.7) {
      // One at a time, warming first (a claim stops at a cold segment: the broker warms it for the next).
      for (let k = 1 + Math.floor(random.next() * 3); k > 0; k--) {
        if (cooling) warmFrontOf(sub);
        const got = claim(s, now, { max: 1, subscription: sub });
        claimed.push(...got.map((c) => `${sub}:${c.id}`));
        for (const c of got) leased.push({ sub, receipt: c.receipt });
      }
    } else if (roll < 0.9 && leased.length > 0) {
      const [l] = leased.splice(Math.floor(random.next() * leased.length), 1);
      if (l === undefined) continue;
      const dead = random.next() < 0.3;
      applyOperation(
        s,
        dead
          ? { kind: "nack", subscription: l.sub, receipts: [l.receipt], deadLetter: true }
          : { kind: "ack", subscription: l.sub, receipts: [l.receipt] },
        now,
      );
    } else if (roll < 0.95) {
      if (cooling) warm(coldSegmentsOfDeadLetters(s, [{ kind: "redrive", subscription: sub }]));
      applyOperation(s, { kind: "redrive", subscription: sub }, now);
    } else {
      applyOperation(s, { kind: "expire" }, now);
    }
    const head = docText(s);
    if (cooling)
      for (const seg of [...s.segments.values()].reverse()) if (coolable(s, seg)) coolSegment(s, seg, now);
    const decoded = ShardState.decode(s.encode(), {
      cold: true,
      segments: (ref) => {
        const seg = s.segments.get(ref.name);
        return seg === undefined || seg.cold ? undefined : seg.records;
      },
    });
    expect(docText(decoded)).toBe(docText(s));
    expect(docText(s)).toBe(head);
  }
  // Drain both subscriptions.
  for (let round = 0; round < 50; round++) {
    now += 100;
    applyOperation(s, { kind: "expire" }, now);
    for (const sub of ["default", "audit"]) {
      for (;;) {
        if (cooling) warmFrontOf(sub);
        const got = claim(s, now, { max: 1, subscription: sub });
        if (got.length === 0) break;
        claimed.push(...got.map((c) => `${sub}:${c.id}`));
        applyOperation(s, { kind: "ack", subscription: sub, receipts: got.map((c) => c.receipt) }, now);
      }
    }
  }
  return { claimed, head: docText(s) };
}

describe("cold segments under a random mix of operations", () => {
  it("deliver exactly what an all-warm shard delivers, in the same order, and the heads agree", () => {
    for (let seed = 1; seed <= 40; seed++) {
      const warm = drive(seed, false);
      const cold = drive(seed, true);
      expect(cold.claimed, `seed ${seed}`).toEqual(warm.claimed);
      expect(cold.head, `seed ${seed}`).toBe(warm.head);
    }
  });
});
