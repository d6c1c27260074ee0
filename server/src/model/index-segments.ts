/**
 * Index segments (format v2): where the index entries of sealed segments
 * live once there are many. Model-internal.
 *
 * Every sealed segment has an index entry (name, offsets, size, checksum,
 * priority and `run_at` ranges, `gone` offsets). The head lists the entries
 * of the segments near the work itself (`segments`); once it lists more
 * than twice {@link INDEX_SEGMENT_SIZE}, the broker writes the entries of
 * that many of the segments claims reach last into an immutable *index
 * segment* object (put-if-absent) and the next head lists one small entry
 * for the object instead ({@link indexCandidates}, {@link sealIndexSegment}).
 * So a head carries about `2 × size` segment entries plus one entry per
 * `size` segments of backlog, however the backlog was built.
 *
 * An entry in an index segment never changes: when the entry of one of its
 * segments would (a message leaves it, marking its offset `gone`, or it
 * retires), the index segment is *dissolved* first
 * ({@link dissolveIndexSegment}): the head lists all its segments' entries
 * itself again, and the object is retired like a segment (`retiredSegments`:
 * the broker deletes it once a head without it has landed). Claims reach a
 * backlog's segments by priority, then oldest first, so in a queue whose
 * priorities are not spread over the whole backlog only the index segment
 * where the work is gets dissolved. (When every segment holds messages of
 * the highest priority, claims reach all of them first: index segments are
 * then written and dissolved again as those are claimed, one at a time,
 * each a PUT and a DELETE of ~18 KB, while the head lists the entries of
 * the dissolved ones.)
 *
 * Loading reads every index segment the head references (checked like
 * every segment), so a leader knows every segment's entry: in memory
 * nothing else changes (`state.segments` holds them all).
 *
 * Costs: O(size) per index segment sealed or dissolved; O(segments) to
 * count and pick candidates, which the broker does only past the threshold.
 */
import { INDEX_SEGMENT_ENTRY_BYTES, SEGMENT_ENTRY_BYTES } from "./approx-size.ts";
import { placeholderPriority } from "./cold-segment-index.ts";
import { segmentJson } from "./record-encoder.ts";
import type { ShardData } from "./shard-data.ts";
import type { IndexSegmentState, SealedObject, SegmentState } from "./shard-records.ts";

/** Segments per index segment (the broker's default). */
export const INDEX_SEGMENT_SIZE = 64;

/** A segment and its index entry as written into an index segment. */
export interface IndexedEntry {
  readonly segment: SegmentState;
  /** The entry's JSON (`segmentJson`) when it was written. */
  readonly json: string;
}

/** Segments whose entry the head lists itself. O(index segments). */
export function headListedSegments(state: ShardData): number {
  let indexed = 0;
  for (const idx of state.indexSegments.values()) indexed += idx.segments.length;
  return state.segments.size - indexed;
}

/** The segments whose entry the head lists itself, ascending offsets. */
export function* segmentsListedByHead(state: ShardData): Iterable<SegmentState> {
  for (const seg of state.segments.values()) if (seg.index === undefined) yield seg;
}

/**
 * The next index segment's contents: once the head lists more than
 * `2 × size` segment entries, the `size` of them that claims reach last —
 * the lowest highest priority (of the messages still in it, for a cold
 * segment), then the newest — ascending offsets, each with its entry; else
 * none. (Their entries change last: an entry changes when a message leaves
 * its segment.)
 */
export function indexCandidates(state: ShardData, size: number): IndexedEntry[] {
  if (headListedSegments(state) <= 2 * size) return [];
  const listed = [...segmentsListedByHead(state)];
  listed.sort((a, b) => placeholderPriority(a) - placeholderPriority(b) || b.first - a.first);
  return listed
    .slice(0, size)
    .sort((a, b) => a.first - b.first)
    .map((segment) => ({ segment, json: segmentJson(segment) }));
}

/**
 * Records that `entries` (from {@link indexCandidates}) are now listed by the
 * index segment object `object`, which the broker has already written.
 * Returns it, or undefined (nothing changed; the object is to be deleted)
 * when one of them changed since: retired, already indexed, or its entry
 * is not the one written.
 */
export function sealIndexSegment(
  state: ShardData,
  entries: readonly IndexedEntry[],
  object: SealedObject,
): IndexSegmentState | undefined {
  if (entries.length === 0) return undefined;
  for (const { segment, json } of entries)
    if (
      state.segments.get(segment.name) !== segment ||
      segment.index !== undefined ||
      segmentJson(segment) !== json
    )
      return undefined;
  const idx = newIndexSegmentState(
    object,
    entries.map((e) => e.segment),
  );
  addIndexSegment(state, idx);
  return idx;
}

/** An index segment record over `segments` (ascending offsets, at least one). */
export function newIndexSegmentState(
  object: SealedObject,
  segments: readonly SegmentState[],
): IndexSegmentState {
  return {
    name: object.name,
    first: (segments[0] as SegmentState).first,
    last: (segments[segments.length - 1] as SegmentState).last,
    segments,
    bytes: object.bytes,
    sha256: object.sha256,
    createdAt: object.createdAt,
    json: undefined,
  };
}

/** Indexes an index segment in the state: the head lists its entry instead of its segments'. */
export function addIndexSegment(state: ShardData, idx: IndexSegmentState): void {
  for (const seg of idx.segments) seg.index = idx;
  const list = state.indexSegments;
  let below = false;
  for (const other of list.values()) if (other.first > idx.first) below = true;
  list.set(idx.name, idx);
  if (below) {
    // The head lists index segments in ascending offsets (canonical bytes): re-sort (rare).
    const sorted = [...list.values()].sort((a, b) => a.first - b.first);
    list.clear();
    for (const other of sorted) list.set(other.name, other);
  }
  state.bytes += INDEX_SEGMENT_ENTRY_BYTES - idx.segments.length * SEGMENT_ENTRY_BYTES;
}

/**
 * Dissolves an index segment (one of its entries is about to change): the
 * head lists its segments' entries itself again, and the object is retired
 * (deleted once a head without it has landed; no later head references it,
 * as a new index segment always gets a new name).
 */
export function dissolveIndexSegment(state: ShardData, idx: IndexSegmentState): void {
  for (const seg of idx.segments) if (seg.index === idx) seg.index = undefined;
  if (state.indexSegments.get(idx.name) !== idx) return;
  state.indexSegments.delete(idx.name);
  state.bytes += idx.segments.length * SEGMENT_ENTRY_BYTES - INDEX_SEGMENT_ENTRY_BYTES;
  state.retiredSegments.push(idx.name);
}
