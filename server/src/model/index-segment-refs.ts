/**
 * The index entries of a v2 head's sealed segments as parsed refs
 * (model-internal): all of a document's, including those its index
 * segments list (`index-segments.ts`), and the entry of a segment in memory.
 */
import type { IndexSegmentRef, SegmentRef, ShardDocument } from "./shard-document-parser.ts";
import type { SegmentState } from "./shard-records.ts";

/** The index entry of `seg`, as a head or index segment lists it. */
export function segmentRefOf(seg: SegmentState): SegmentRef {
  return {
    name: seg.name,
    first: seg.first,
    last: seg.last,
    count: seg.count,
    bytes: seg.bytes,
    sha256: seg.sha256,
    createdAt: seg.createdAt,
    priorities: seg.priorities,
    runAt: seg.runAt,
    gone: [...seg.gone].sort((a, b) => a - b),
  };
}

/**
 * Every sealed segment's index entry of the head `doc`: those it lists
 * itself and those of its index segments (`lookup` gives each one's
 * entries, undefined when not loaded), ascending offsets. Calls `fail` for
 * segments or index segments out of order and an index segment that is not
 * loaded; overlaps are for the caller to find (`ShardState.decode` checks
 * them).
 */
export function sealedSegmentRefs(
  doc: ShardDocument,
  lookup: (ref: IndexSegmentRef) => readonly SegmentRef[] | undefined,
  fail: (what: string) => never,
): readonly SegmentRef[] {
  let previous = -1;
  for (const ref of doc.segments) {
    if (ref.first <= previous) fail(`segment ${ref.name} is not in ascending offset order`);
    previous = ref.first;
  }
  if (doc.indexSegments.length === 0) return doc.segments;
  const all = [...doc.segments];
  previous = -1;
  for (const ref of doc.indexSegments) {
    if (ref.first <= previous) fail(`index segment ${ref.name} is not in ascending offset order`);
    previous = ref.first;
    const entries = lookup(ref);
    if (entries === undefined) fail(`index segment ${ref.name} is referenced by the head but was not loaded`);
    all.push(...(entries as readonly SegmentRef[]));
  }
  return all.sort((a, b) => a.first - b.first);
}
