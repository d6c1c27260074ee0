import { describe, expect, it } from "vitest";
import { docJson, enqueue, msg, newShard, T0 } from "../../testing/model-test-helpers.ts";
import { dedupSealCandidates, forgetDedup, sealDedupSegment } from "./dedup-segments.ts";
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
