import { describe, expect, it } from "vitest";
import {
  claim,
  docJson,
  docText,
  enqueue,
  expectCasqError,
  msg,
  newShard,
  T0,
} from "../../testing/model-test-helpers.ts";
import { applyOperation } from "./apply-operation.ts";
import { deadLetterSealCandidates, sealDeadLetterSegment } from "./dead-letter-segments.ts";
import { encodeDeadLetterSegment, sha256Hex } from "./segment-codec.ts";
import { parseDeadLetterSegmentDocument } from "./segment-parser.ts";
import { listDeadLetters } from "./shard-inspect.ts";
import type { DeadLetterRecord } from "./shard-records.ts";
import { ShardState } from "./shard-state.ts";
import { computeStats } from "./shard-stats.ts";

/** Dead-letters `ids` on `subscription` (enqueued first). */
function kill(state: ShardState, now: number, ids: string[], subscription = "default") {
  enqueue(state, now, ...ids.map((id) => msg(id)));
  const claimed = claim(state, now, { subscription, max: ids.length });
  applyOperation(
    state,
    { kind: "nack", subscription, receipts: claimed.map((m) => m.receipt), deadLetter: true, reason: "bad" },
    now,
  );
}

/** Seals every head dead letter as the broker would; returns the objects written, by name. */
function sealAll(state: ShardState, now: number, objects: Map<string, Uint8Array>) {
  let n = objects.size;
  for (const { sub, letters } of deadLetterSealCandidates(state, 0)) {
    const name = `${String(n++).padStart(20, "0")}-1-x.dead.json`;
    const bytes = encodeDeadLetterSegment(state.queue, state.shard, sub.name, letters);
    objects.set(name, bytes);
    sealDeadLetterSegment(state, sub, letters, {
      name,
      bytes: bytes.byteLength,
      sha256: sha256Hex(bytes),
      createdAt: now,
    });
  }
}

function reload(state: ShardState, objects: Map<string, Uint8Array>): ShardState {
  return ShardState.decode(state.encode(), {
    deadLetterSegments: (ref, subscription) => {
      const bytes = objects.get(ref.name);
      return (
        bytes &&
        parseDeadLetterSegmentDocument(bytes, { queue: state.queue, shard: state.shard, subscription, ref })
      );
    },
  });
}

const listed = (state: ShardState, subscription = "default") =>
  listDeadLetters(state, subscription, { limit: 1000 }).map((dl) => dl.message.id);

describe("dead-letter segments", () => {
  it("sealing moves dead letters out of the head; they stay listed, counted and canonical across a reload", () => {
    const s = newShard();
    kill(s, T0, ["a", "b", "c"]);
    expect(deadLetterSealCandidates(s, 1_000_000)).toEqual([]); // within budget
    const before = s.approxBytes();
    const objects = new Map<string, Uint8Array>();
    sealAll(s, T0, objects);
    expect(s.headDeadLetterSize).toBe(0);
    expect(s.approxBytes()).toBeLessThan(before);
    kill(s, T0 + 1, ["d"]); // a newer one stays in the head
    const doc = docJson(s);
    const sub = doc.subscriptions.find((x: { name: string }) => x.name === "default");
    expect(sub.dead_letters.map((dl: { message: { id: string } }) => dl.message.id)).toEqual(["d"]);
    expect(sub.dead_letter_segments).toHaveLength(1);
    expect(sub.dead_letter_segments[0]).toMatchObject({ first: 0, last: 2, count: 3, gone: [] });
    expect(listed(s)).toEqual(["a", "b", "c", "d"]);

    const r = reload(s, objects);
    expect(docText(r)).toBe(docText(s)); // canonical: same state, same bytes
    expect(listed(r)).toEqual(["a", "b", "c", "d"]);
    expect(computeStats(r, T0).dead).toBe(4);
    expect(r.approxBytes()).toBe(s.approxBytes());
  });

  it("a redrive marks the position gone; a segment with nothing left retires", () => {
    const s = newShard();
    kill(s, T0, ["a", "b"]);
    const objects = new Map<string, Uint8Array>();
    sealAll(s, T0, objects);
    const [name] = [...objects.keys()];
    applyOperation(s, { kind: "redrive", subscription: "default", ids: ["b"] }, T0 + 1);
    let sub = docJson(s).subscriptions[0];
    expect(sub.dead_letter_segments[0].gone).toEqual([[1, 1]]);
    expect(listed(reload(s, objects))).toEqual(["a"]);
    applyOperation(s, { kind: "redrive", subscription: "default" }, T0 + 2);
    sub = docJson(s).subscriptions[0];
    expect(sub.dead_letter_segments).toBeUndefined();
    expect(s.takeRetiredSegments()).toEqual([name]);
    expect(listed(reload(s, objects))).toEqual([]);
  });

  it("a purge of dead letters and a subscription delete retire whole segments", () => {
    const s = newShard();
    applyOperation(s, { kind: "createSubscription", name: "audit" }, T0);
    kill(s, T0, ["a", "b"]);
    const objects = new Map<string, Uint8Array>();
    sealAll(s, T0, objects);
    const claimed = claim(s, T0, { subscription: "audit", max: 2 });
    applyOperation(
      s,
      { kind: "nack", subscription: "audit", receipts: claimed.map((m) => m.receipt), deadLetter: true },
      T0,
    );
    sealAll(s, T0, objects);
    const [forDefault, forAudit] = [...objects.keys()];
    const purge = applyOperation(s, { kind: "purge", subscription: "default", deadLetters: true }, T0);
    expect(purge).toMatchObject({ deadLettersPurged: 2 });
    expect(s.takeRetiredSegments()).toEqual([forDefault]);
    const del = applyOperation(s, { kind: "deleteSubscription", name: "audit" }, T0);
    expect(del).toMatchObject({ deadLettersDropped: 2 });
    expect(s.takeRetiredSegments()).toEqual([forAudit]);
    expect(s.segmentNames()).toEqual([]);
  });

  it("refuses a dead-letter segment that is not what the head says, or that the head does not give", () => {
    const s = newShard();
    kill(s, T0, ["a", "b"]);
    const objects = new Map<string, Uint8Array>();
    sealAll(s, T0, objects);
    const [name] = [...objects.keys()];
    const ref = docJson(s).subscriptions[0].dead_letter_segments[0];
    const parseRef = { ...ref, createdAt: ref.created_at };
    const bytes = objects.get(name as string) as Uint8Array;
    const expect1 = { queue: s.queue, shard: s.shard, ref: parseRef };
    expect(parseDeadLetterSegmentDocument(bytes, { ...expect1, subscription: "default" })).toHaveLength(2);
    expectCasqError(
      () => parseDeadLetterSegmentDocument(bytes, { ...expect1, subscription: "audit" }),
      "data_loss",
    );
    expectCasqError(
      () =>
        parseDeadLetterSegmentDocument(bytes, {
          ...expect1,
          subscription: "default",
          ref: { ...parseRef, count: 3 },
        }),
      "data_loss",
    );
    expectCasqError(() => ShardState.decode(s.encode()), "data_loss"); // referenced but not given
    // one object indexed under two subscriptions
    const twice = docJson(s);
    twice.subscriptions.push({ ...twice.subscriptions[0], name: "zz", dead_letters: [] });
    const records = s.deadLetterSegmentRecords("default", name as string);
    expectCasqError(
      () =>
        ShardState.decode(new TextEncoder().encode(JSON.stringify(twice)), {
          deadLetterSegments: () => records,
        }),
      "data_loss",
    );
    const lookup = (): DeadLetterRecord[] => [];
    expectCasqError(() => ShardState.decode(s.encode(), { deadLetterSegments: lookup }), "data_loss");
  });
});
