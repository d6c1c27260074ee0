import { describe, expect, it } from "vitest";
import { ack, claim, docJson, enqueue, expire, msg, newShard, T0 } from "../../testing/model-test-helpers.ts";
import { referenceEncodeHead } from "../../testing/reference-head-encoder.ts";
import { applyOperation } from "./apply-operation.ts";
import { coolable, coolSegment } from "./cold-segments.ts";
import { dedupSealCandidates, forgetDedup, sealDedupSegment } from "./dedup-segments.ts";
import { encodedDedupEntry, encodedTailMessage } from "./head-encoder.ts";
import { indexCandidates, sealIndexSegment } from "./index-segments.ts";
import { encodeDedupSegment, encodeSegment } from "./segment-codec.ts";
import { sealCandidates, sealSegment, sealWrittenSegment } from "./segment-mechanics.ts";
import type { DedupEntry, MessageRecord } from "./shard-records.ts";
import { ShardState } from "./shard-state.ts";

/** The head's dedup list as the state holds it, in the document's shape. */
function expectedDedup(state: ShardState) {
  return [...state.recentDedup.values()].map((e) => ({
    dedup_id: e.dedupId,
    id: e.id,
    offset: e.offset,
    expires_at: e.expiresAt,
  }));
}

describe("head encoder: the head's dedup ids", () => {
  it("encodes what was added, removed or sealed since the last encode as a fresh encode does", () => {
    const s = newShard();
    const check = (ids: string[]) => {
      const bytes = s.encode();
      const doc = docJson(s);
      expect(doc.dedup.map((e: { dedup_id: string }) => e.dedup_id)).toEqual(ids);
      expect(doc.dedup).toEqual(expectedDedup(s));
      // Byte for byte what a state without any kept encoding writes.
      if (s.dedupSegments.size === 0) expect(ShardState.decode(bytes).encode()).toEqual(bytes);
    };
    // Ids of several bytes per character: the kept bytes are counted in bytes.
    const ids = ["d1", "d2-é", "d3-日本", "d4-🙂"];
    enqueue(s, T0, ...ids.map((id, i) => msg(`m${i + 1}`, { dedupId: id })));
    check(ids);
    enqueue(s, T0 + 1, msg("m5", { dedupId: "d5" }));
    check([...ids, "d5"]);
    check([...ids, "d5"]); // nothing changed: the same bytes again
    forgetDedup(s, "d3-日本"); // from the middle
    check(["d1", "d2-é", "d4-🙂", "d5"]);
    forgetDedup(s, "d1"); // the oldest
    enqueue(s, T0 + 2, msg("m6", { dedupId: "d6-ü" }));
    check(["d2-é", "d4-🙂", "d5", "d6-ü"]);
    forgetDedup(s, "d6-ü"); // the newest
    check(["d2-é", "d4-🙂", "d5"]);
    const entries = dedupSealCandidates(s, 0);
    sealDedupSegment(s, entries, {
      name: `${"0".repeat(20)}-1-a.dedup.json`,
      bytes: 100,
      sha256: "0".repeat(64),
      createdAt: T0 + 3,
    });
    check([]);
    enqueue(s, T0 + 4, msg("m7", { dedupId: "d7" }), msg("m8", { dedupId: "d8" }));
    check(["d7", "d8"]);
    expect(docJson(s).dedup_segments).toHaveLength(1);
  });

  it("an encode that fails part-way leaves nothing half-remembered for the next", () => {
    const s = newShard();
    enqueue(s, T0, msg("m1", { dedupId: "d1" }), msg("m2", { dedupId: "d2" }));
    s.encode();
    enqueue(s, T0 + 1, msg("m3", { dedupId: "d3" }));
    // The tail's first message loses its body: that encode throws after the dedup list was made.
    const tail = s.sortedTail();
    const first = tail[0] as (typeof tail)[number];
    const msgRecord = first.msg;
    (first as { msg: unknown }).msg = { ...msgRecord, payload: undefined };
    expect(() => s.encode()).toThrow();
    (first as { msg: unknown }).msg = msgRecord;
    enqueue(s, T0 + 2, msg("m4", { dedupId: "d4" }));
    const bytes = s.encode();
    expect(docJson(s).dedup.map((e: { dedup_id: string }) => e.dedup_id)).toEqual(["d1", "d2", "d3", "d4"]);
    expect(ShardState.decode(bytes).encode()).toEqual(bytes);
  });
});

/**
 * Segments of the tail's messages (those without `targets`, as the broker
 * seals them) and of the head's dedup ids, made with the bytes copied from
 * the last head encode: byte for byte what encoding each record again writes.
 * Returns how many records were copied.
 */
function expectSegmentsCopiedAlike(s: ShardState, what = ""): { messages: number; dedup: number } {
  const copied = { messages: 0, dedup: 0 };
  const records = s
    .sortedTail()
    .filter((m) => m.targets === undefined)
    .map((m) => m.msg as MessageRecord);
  const copyMessage = (r: MessageRecord) => {
    const bytes = encodedTailMessage(s, r);
    if (bytes !== undefined) copied.messages += 1;
    return bytes;
  };
  expect(text(encodeSegment("q", 0, records, copyMessage)), what).toBe(text(encodeSegment("q", 0, records)));
  const entries = [...s.recentDedup.values()];
  const copyEntry = (e: DedupEntry) => {
    const bytes = encodedDedupEntry(s, e);
    if (bytes !== undefined) copied.dedup += 1;
    return bytes;
  };
  expect(text(encodeDedupSegment("q", 0, entries, copyEntry)), what).toBe(
    text(encodeDedupSegment("q", 0, entries)),
  );
  return copied;
}

const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes);

describe("head encoder: segments copy the last head's bytes", () => {
  it("copies each record the last encode wrote unchanged, encodes the others, and writes the same bytes either way", () => {
    const s = newShard();
    applyOperation(s, { kind: "createSubscription", name: "other" }, T0);
    enqueue(
      s,
      T0,
      ...["d1", "d2-é", "d3-日本", "d4-🙂", "d5"].map((id, i) => msg(`m${i + 1}`, { dedupId: id })),
    );
    expect(expectSegmentsCopiedAlike(s)).toEqual({ messages: 0, dedup: 0 }); // nothing encoded yet
    s.encode();
    enqueue(s, T0 + 1, msg("m6", { dedupId: "d6" }), msg("m7", { dedupId: "d7" }));
    // The two new ones were not in the last head: encoded afresh, the five others copied.
    expect(expectSegmentsCopiedAlike(s)).toEqual({ messages: 5, dedup: 5 });
    s.encode();
    expect(expectSegmentsCopiedAlike(s)).toEqual({ messages: 7, dedup: 7 });
    // Another shard's head holds none of these records.
    const other = newShard();
    enqueue(other, T0, msg("x1", { dedupId: "dx" }));
    other.encode();
    const [first] = s.sortedTail();
    expect(encodedTailMessage(other, first?.msg as MessageRecord)).toBeUndefined();
  });
});

describe("head encoder: copying from the last encode", () => {
  it("writes byte for byte what a from-scratch encode writes, through enqueues, claims, acks, seals, redrives and cooling", () => {
    const s = newShard({ maxAttempts: 1 });
    applyOperation(s, { kind: "createSubscription", name: "other" }, T0);
    const wholes = new Map<number, MessageRecord>(); // the bodies of sealed messages, "paged in"
    s.bodies = (_segment, offset) => wholes.get(offset);
    let now = T0;
    const tick = (ms = 10) => {
      now += ms;
      return now;
    };
    let n = 0;
    let sealed = 0;
    const unique = () => {
      sealed += 1;
      return sealed;
    };
    const steps: string[] = [];
    const check = (what: string) => {
      steps.push(what);
      const bytes = s.encode();
      expect(new TextDecoder().decode(bytes), steps.join(" > ")).toBe(
        new TextDecoder().decode(referenceEncodeHead(s)),
      );
      expect(s.encode(), "an unchanged state encodes to the same bytes again").toEqual(bytes);
      // Decoded again (its index segments' entries looked up): the same bytes.
      if (s.indexSegments.size > 0) expect(s.clone().encode(), steps.join(" > ")).toEqual(bytes);
      expectSegmentsCopiedAlike(s, steps.join(" > "));
    };
    const add = (count: number) => {
      const batch = Array.from({ length: count }, () => {
        n += 1;
        return msg(`m${n}`, {
          dedupId: n % 3 === 0 ? `d${n}-é` : `d${n}`,
          ...(n % 5 === 0 ? { priority: 1 } : {}),
        });
      });
      enqueue(s, tick(), ...batch);
      check(`enqueue ${count}`);
    };
    const seal = (budget: number) => {
      const candidates = sealCandidates(s, budget);
      if (candidates.length === 0) return;
      for (const m of candidates) wholes.set(m.msg.offset, m.msg as MessageRecord);
      const name = `${String(candidates[0]?.msg.offset).padStart(20, "0")}-1-${unique()}.json`;
      sealSegment(s, candidates, { name, bytes: 1000, sha256: "0".repeat(64), createdAt: now });
      check("seal");
    };
    for (let round = 0; round < 6; round++) {
      add(1);
      add(7);
      add(2);
      const got = claim(s, tick(), { max: 4 });
      check("claim");
      ack(
        s,
        tick(),
        got.slice(0, 2).map((c) => c.receipt),
      );
      check("ack two");
      ack(
        s,
        tick(),
        got.slice(3).map((c) => c.receipt),
        "default",
      );
      check("ack one more");
      const other = claim(s, tick(), { max: 3, subscription: "other" });
      check("claim other");
      // Dead-lettered (maxAttempts 1), then redriven: back in the tail with `targets`.
      applyOperation(
        s,
        { kind: "nack", subscription: "other", receipts: other.map((c) => c.receipt), deadLetter: true },
        tick(),
      );
      check("dead-letter");
      applyOperation(s, { kind: "redrive", subscription: "other", limit: 2 }, tick());
      check("redrive");
      seal(s.tailBytes / 2);
      add(3);
      // A segment written ahead, then sealed with the messages still in the tail (as the broker does).
      const ahead = sealCandidates(s, 0).map((m) => m.msg as MessageRecord);
      for (const m of ahead) wholes.set(m.offset, m);
      add(1);
      const acked = claim(s, tick(), { max: 1 });
      ack(
        s,
        tick(),
        acked.map((c) => c.receipt),
      );
      check("ack after writing ahead");
      if (ahead.length > 0)
        sealWrittenSegment(s, ahead, {
          name: `${String(ahead[0]?.offset).padStart(20, "0")}-1-${unique()}.json`,
          bytes: 2000,
          sha256: "1".repeat(64),
          createdAt: now,
        });
      check("seal written ahead");
      // One segment's entry into an index segment, once the head lists more than two.
      const indexed = indexCandidates(s, 1);
      if (indexed.length > 0) {
        const first = indexed[0]?.segment.first ?? 0;
        sealIndexSegment(s, indexed, {
          name: `${String(first).padStart(20, "0")}-1-${unique()}.index.json`,
          bytes: 300,
          sha256: "3".repeat(64),
          createdAt: now,
        });
        check("seal index segment");
      }
      const entries = dedupSealCandidates(s, round % 2 === 0 ? 0 : 10_000);
      if (entries.length > 0) {
        sealDedupSegment(s, entries, {
          name: `${String(entries[0]?.offset).padStart(20, "0")}-1-${unique()}.dedup.json`,
          bytes: 100,
          sha256: "2".repeat(64),
          createdAt: now,
        });
        check("seal dedup ids");
      }
    }
    expect(s.dedupSegments.size).toBeGreaterThan(0);
    applyOperation(s, { kind: "expire" }, tick(3_600_000)); // the dedup segments expire too
    check("expire");
    applyOperation(s, { kind: "purge", subscription: "other" }, tick());
    check("purge");
    add(40);
    seal(0);
    add(2);
    const newest = [...s.segments.values()].reverse().find((seg) => !seg.cold && coolable(s, seg));
    expect(newest).toBeDefined();
    if (newest !== undefined) coolSegment(s, newest, now);
    check("cool");
    expect(s.segments.size).toBeGreaterThan(3);
    expect(steps).toContain("seal index segment");
    expect(
      s.retiredSegments.filter((name) => name.endsWith(".index.json")).length,
      "dissolved",
    ).toBeGreaterThan(0);
  });
});

/**
 * A shard (1 s leases) with a clock that `tick` moves on, and `check`, which encodes the head and
 * compares it with the reference encoder's, naming the steps so far when they differ.
 */
function checkedShard(maxAttempts: number) {
  const s = newShard({ maxAttempts, leaseTtlMs: 1_000 });
  let now = T0;
  const tick = (ms: number) => {
    now += ms;
    return now;
  };
  const steps: string[] = [];
  const check = (what: string) => {
    steps.push(what);
    expect(new TextDecoder().decode(s.encode()), steps.join(" > ")).toBe(
      new TextDecoder().decode(referenceEncodeHead(s)),
    );
  };
  return { s, tick, check };
}

describe("head encoder: deliveries", () => {
  it("re-encodes a delivery changed in place (heartbeat, nack, hand-back, lease expiry, a new claim, redrive) and reuses the rest", () => {
    const { s, tick, check } = checkedShard(3);
    enqueue(s, T0, ...Array.from({ length: 12 }, (_, i) => msg(`m${i}`)));
    const first = claim(s, tick(1), { max: 8, workerId: "w1", leaseTtlMs: 1_000 });
    check("claim 8");
    const receipts = first.map((c) => c.receipt);
    applyOperation(
      s,
      { kind: "heartbeat", subscription: "default", workerId: "w1", receipts: receipts.slice(0, 2) },
      tick(100),
    );
    check("heartbeat two");
    applyOperation(
      s,
      { kind: "nack", subscription: "default", receipts: receipts.slice(2, 3), delayMs: 5_000 },
      tick(1),
    );
    check("nack with a delay");
    applyOperation(
      s,
      { kind: "nack", subscription: "default", receipts: receipts.slice(3, 4), release: true },
      tick(1),
    );
    check("hand back");
    ack(s, tick(1), receipts.slice(4, 5));
    check("ack");
    expire(s, tick(5_000)); // leases of m5..m7 and the heartbeated m0, m1 run out
    check("lease expiry");
    claim(s, tick(1), { max: 20, workerId: "w2", leaseTtlMs: 1_000 });
    check("claim again: new attempts, new leases");
    const third = claim(s, tick(1), { max: 20, workerId: "w2" });
    check("claim nothing new");
    for (let round = 0; round < 3; round++) {
      expire(s, tick(2_000));
      check(`expiry ${round}`);
      claim(s, tick(1), { max: 20, workerId: "w3" });
      check(`claim ${round}`);
    }
    applyOperation(s, { kind: "redrive", subscription: "default" }, tick(1));
    check("redrive");
    claim(s, tick(1), { max: 20, workerId: "w4" });
    check("claim after redrive");
    expect(third).toEqual([]);
  });

  it("copies each subscription's deliveries on its own, through a subscription deleted and re-created and deliveries out of offset order", () => {
    const { s, tick, check } = checkedShard(5);
    applyOperation(s, { kind: "createSubscription", name: "audit" }, tick(1));
    enqueue(s, tick(1), ...Array.from({ length: 10 }, (_, i) => msg(`m${i}`)));
    const byDefault = claim(s, tick(1), { max: 6, workerId: "w1" });
    claim(s, tick(1), { subscription: "audit", max: 4, workerId: "a1" });
    check("claims on two subscriptions");
    // m1 handed back, then claimed again after m6..m9: the map holds it last, the head lists it by offset.
    applyOperation(
      s,
      {
        kind: "nack",
        subscription: "default",
        receipts: byDefault.slice(1, 2).map((c) => c.receipt),
        release: true,
      },
      tick(1),
    );
    claim(s, tick(1), { max: 10, workerId: "w2" });
    check("a delivery re-claimed after later offsets");
    ack(
      s,
      tick(1),
      byDefault.slice(0, 1).map((c) => c.receipt),
    );
    claim(s, tick(1), { subscription: "audit", max: 2, workerId: "a1" });
    check("ack on one, claims on the other");
    applyOperation(s, { kind: "deleteSubscription", name: "audit" }, tick(1));
    check("audit deleted");
    applyOperation(s, { kind: "createSubscription", name: "audit", from: "earliest" }, tick(1));
    check("audit re-created");
    claim(s, tick(1), { subscription: "audit", max: 3, workerId: "a2" });
    check("claims on the new audit");
    expire(s, tick(5_000));
    check("every lease expired");
  });
});
