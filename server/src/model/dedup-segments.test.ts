import { describe, expect, it } from "vitest";
import {
  docJson,
  enqueue,
  expectCasqError,
  expire,
  msg,
  newShard,
  T0,
} from "../../testing/model-test-helpers.ts";
import { dedupSealCandidates, sealDedupSegment } from "./dedup-segments.ts";
import { parseShardDocument } from "./shard-document-parser.ts";
import { ShardState } from "./shard-state.ts";
import { computeStats, nextHousekeepingAt } from "./shard-stats.ts";

const WINDOW = 300_000;

/** Seals the head's dedup ids as the broker would (the object itself is not needed here). */
function seal(state: ShardState, name: string, now: number) {
  const entries = dedupSealCandidates(state, 0);
  return {
    entries,
    seg: sealDedupSegment(state, entries, { name, bytes: 100, sha256: "0".repeat(64), createdAt: now }),
  };
}

function reload(
  state: ShardState,
  entries: ReadonlyMap<string, import("./dedup-chunk.ts").DedupEntries>,
  now?: number,
) {
  return ShardState.decode(state.encode(), {
    segments: (ref) => state.segmentRecords().get(ref.name),
    dedupSegments: (ref) => entries.get(ref.name),
    now,
  });
}

const NAME_A = `${"0".repeat(20)}-1-a.dedup.json`;
const NAME_B = `${"0".repeat(19)}3-1-b.dedup.json`;

describe("dedup segments", () => {
  it("sealing moves the head's dedup ids out of the head, and they still refuse duplicates", () => {
    const s = newShard();
    enqueue(s, T0, msg("m1", { dedupId: "d1" }), msg("m2", { dedupId: "d2" }));
    expect(dedupSealCandidates(s, 1_000_000)).toEqual([]); // within budget: nothing to seal
    expect(s.recentDedupSize).toBeGreaterThan(0);
    const { entries, seg } = seal(s, NAME_A, T0);
    expect(entries.map((e) => e.dedupId)).toEqual(["d1", "d2"]);
    expect(s.recentDedupSize).toBe(0);
    const doc = docJson(s);
    expect(doc.dedup).toEqual([]);
    expect(doc.dedup_segments).toEqual([
      {
        name: NAME_A,
        first: 0,
        last: 1,
        count: 2,
        bytes: 100,
        sha256: "0".repeat(64),
        created_at: T0,
        expires_at: T0 + WINDOW,
      },
    ]);
    expect(seg.expiresAt).toBe(T0 + WINDOW);
    const dup = enqueue(s, T0 + 10, msg("m3", { dedupId: "d1" }));
    expect(dup).toEqual([{ id: "m1", offset: 0, duplicate: true }]);
    expect(s.nextOffset).toBe(2);
  });

  it("a decode with the dedup segments remembers their ids; canonical bytes; stats count them", () => {
    const s = newShard();
    enqueue(s, T0, msg("m1", { dedupId: "d1" }), msg("m2", { dedupId: "d2" }));
    const { entries } = seal(s, NAME_A, T0);
    enqueue(s, T0 + 5, msg("m3", { dedupId: "d3" }));
    const loaded = reload(s, new Map([[NAME_A, entries]]), T0 + 100);
    expect(new TextDecoder().decode(loaded.encode())).toBe(new TextDecoder().decode(s.encode()));
    expect(computeStats(loaded, T0 + 100).dedupIds).toBe(3);
    const dup = enqueue(loaded, T0 + 200, msg("x", { dedupId: "d2" }), msg("y", { dedupId: "d3" }));
    expect(dup).toEqual([
      { id: "m2", offset: 1, duplicate: true },
      { id: "m3", offset: 2, duplicate: true },
    ]);
  });

  it("a live dedup segment that was not loaded refuses the head; an expired one is not needed", () => {
    const s = newShard();
    enqueue(s, T0, msg("m1", { dedupId: "d1" }));
    seal(s, NAME_A, T0);
    expectCasqError(() => reload(s, new Map(), T0 + WINDOW - 1), "data_loss");
    const late = reload(s, new Map(), T0 + WINDOW);
    expect(late.dedupSegmentEntries().size).toBe(0);
    // the next expire retires it: out of the index, its object's name handed to the broker to delete
    const result = expire(late, T0 + WINDOW);
    expect(result.changed).toBe(true);
    expect(docJson(late).dedup_segments).toBeUndefined();
    expect(late.takeRetiredSegments()).toEqual([NAME_A]);
  });

  it("expired sealed ids are forgotten, and the segment retires once all of them expired", () => {
    const s = newShard({ dedupWindowMs: 1_000 });
    enqueue(s, T0, msg("m1", { dedupId: "d1" }));
    enqueue(s, T0 + 500, msg("m2", { dedupId: "d2" }));
    const { seg } = seal(s, NAME_A, T0 + 500);
    expect(seg.expiresAt).toBe(T0 + 1_500);
    expire(s, T0 + 1_000);
    expect(computeStats(s, T0 + 1_000).dedupIds).toBe(1);
    expect(docJson(s).dedup_segments).toHaveLength(1);
    expect(s.takeRetiredSegments()).toEqual([]);
    // d1 expired: a new message may take it, in the head, replacing the sealed entry
    const again = enqueue(s, T0 + 1_000, msg("m3", { dedupId: "d1" }));
    expect(again[0]?.duplicate).toBe(false);
    expect(docJson(s).dedup.map((e: { dedup_id: string }) => e.dedup_id)).toEqual(["d1"]);
    expire(s, T0 + 1_500);
    expect(docJson(s).dedup_segments).toBeUndefined();
    expect(s.takeRetiredSegments()).toEqual([NAME_A]);
    expect(computeStats(s, T0 + 1_500).dedupIds).toBe(1);
  });

  it("a later entry of the same id, in a later dedup segment, wins on decode", () => {
    const s = newShard({ dedupWindowMs: 1_000 });
    enqueue(s, T0, msg("m1", { dedupId: "d1" }), msg("m2"), msg("m3"));
    const a = seal(s, NAME_A, T0).entries;
    enqueue(s, T0 + 2_000, msg("m4", { dedupId: "d1" }));
    const b = seal(s, NAME_B, T0 + 2_000).entries;
    const loaded = reload(
      s,
      new Map([
        [NAME_A, a],
        [NAME_B, b],
      ]),
    );
    const dup = enqueue(loaded, T0 + 2_100, msg("x", { dedupId: "d1" }));
    expect(dup).toEqual([{ id: "m4", offset: 3, duplicate: true }]);
  });

  it("the head lists its dedup ids by offset and refuses them out of order or below a dedup segment", () => {
    const s = newShard();
    enqueue(s, T0, msg("m1", { dedupId: "d1" }));
    const { entries } = seal(s, NAME_A, T0);
    enqueue(s, T0 + 1, msg("m2", { dedupId: "d2" }), msg("m3", { dedupId: "d3" }));
    const doc = docJson(s);
    expect(doc.dedup.map((e: { offset: number }) => e.offset)).toEqual([1, 2]);
    const lookup = { dedupSegments: () => entries };
    const swapped = { ...doc, dedup: [doc.dedup[1], doc.dedup[0]] };
    expectCasqError(
      () => ShardState.decode(new TextEncoder().encode(JSON.stringify(swapped)), lookup),
      "data_loss",
    );
    const below = { ...doc, dedup: [{ ...doc.dedup[0], offset: 0 }] };
    expectCasqError(
      () => ShardState.decode(new TextEncoder().encode(JSON.stringify(below)), lookup),
      "data_loss",
    );
    // and a head without dedup segments has no dedup_segments field at all
    expect(parseShardDocument(newShard().encode()).dedupSegments).toEqual([]);
    expect(JSON.parse(new TextDecoder().decode(newShard().encode())).dedup_segments).toBeUndefined();
  });

  it("sealed ids are looked up exactly: an id whose hash collides with a sealed one is new, before and after a reload", () => {
    // two dedup ids with the same 32-bit hash (the sealed lookup's: sealed-dedup.ts)
    const [a, b] = ["job-439599", "job-622382"];
    const s = newShard();
    enqueue(s, T0, msg("m1", { dedupId: a }));
    seal(s, NAME_A, T0);
    expect(enqueue(s, T0 + 1, msg("m2", { dedupId: b }))).toEqual([
      { id: "m2", offset: 1, duplicate: false },
    ]);
    expect(enqueue(s, T0 + 2, msg("m3", { dedupId: a }))).toEqual([{ id: "m1", offset: 0, duplicate: true }]);
    seal(s, NAME_B, T0 + 2);
    // the reload gets the state's own compact chunks, as the broker's cache hands them over
    const loaded = reload(s, s.dedupSegmentEntries(), T0 + 3);
    expect(new TextDecoder().decode(loaded.encode())).toBe(new TextDecoder().decode(s.encode()));
    expect(computeStats(loaded, T0 + 3).dedupIds).toBe(2);
    expect(enqueue(loaded, T0 + 3, msg("x", { dedupId: b }), msg("y", { dedupId: a }))).toEqual([
      { id: "m2", offset: 1, duplicate: true },
      { id: "m1", offset: 0, duplicate: true },
    ]);
    expect(enqueue(loaded, T0 + 4, msg("z", { dedupId: "job-0" }))[0]?.duplicate).toBe(false);
  });

  it("the next housekeeping time covers sealed ids, and their expiry forgets each once", () => {
    const s = newShard({ dedupWindowMs: 1_000 });
    enqueue(s, T0, msg("m1", { dedupId: "d1" }));
    enqueue(s, T0 + 300, msg("m2", { dedupId: "d2" }));
    seal(s, NAME_A, T0 + 300);
    expect(nextHousekeepingAt(s)).toBe(T0 + 1_000);
    expect(expire(s, T0 + 1_000).dedupPruned).toBe(1);
    expect(nextHousekeepingAt(s)).toBe(T0 + 1_300);
    expect(expire(s, T0 + 1_300).dedupPruned).toBe(1);
    expect(computeStats(s, T0 + 1_300).dedupIds).toBe(0);
    expect(expire(s, T0 + 2_000).dedupPruned).toBe(0);
  });
});
