import { describe, expect, it } from "vitest";
import { docJson, enqueue, msg, newShard, T0 } from "../../testing/model-test-helpers.ts";
import { dedupSealCandidates, forgetDedup, sealDedupSegment } from "./dedup-segments.ts";
import type { ShardState } from "./shard-state.ts";

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
  it("encodes what was added, removed or sealed since the last encode (the list is kept between encodes)", () => {
    const s = newShard();
    const check = (ids: string[]) => {
      const doc = docJson(s);
      expect(doc.dedup.map((e: { dedup_id: string }) => e.dedup_id)).toEqual(ids);
      expect(doc.dedup).toEqual(expectedDedup(s));
    };
    enqueue(s, T0, ...["1", "2", "3", "4"].map((n) => msg(`m${n}`, { dedupId: `d${n}` })));
    check(["d1", "d2", "d3", "d4"]);
    enqueue(s, T0 + 1, msg("m5", { dedupId: "d5" }));
    check(["d1", "d2", "d3", "d4", "d5"]);
    check(["d1", "d2", "d3", "d4", "d5"]); // nothing changed: the same bytes again
    forgetDedup(s, "d3"); // from the middle
    check(["d1", "d2", "d4", "d5"]);
    forgetDedup(s, "d1"); // the oldest
    enqueue(s, T0 + 2, msg("m6", { dedupId: "d6" }));
    check(["d2", "d4", "d5", "d6"]);
    forgetDedup(s, "d6"); // the newest
    check(["d2", "d4", "d5"]);
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
});
