/**
 * Where the cold segments of a shard are (see `cold-segments.ts`), and when a
 * placeholder in a subscription's runnable or wake-up index still stands
 * for one. Model-internal; no other model module is imported, so the
 * primitive transitions (`shard-mechanics.ts`) can ask it too.
 *
 * Costs: O(log s) per lookup for s cold segments, O(s) to add or remove one.
 */
import type { ShardData } from "./shard-data.ts";
import type { SegmentState, SubscriptionState } from "./shard-records.ts";

/** The cold segment whose offset range holds `offset`, or undefined. */
export function coldSegmentAt(state: ShardData, offset: number): SegmentState | undefined {
  const list = state.coldSegments;
  if (list.length === 0 || offset < (list[0] as SegmentState).first) return undefined;
  let lo = 0;
  let hi = list.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    const seg = list[mid] as SegmentState;
    if (offset < seg.first) hi = mid - 1;
    else if (offset > seg.last) lo = mid + 1;
    else return seg;
  }
  return undefined;
}

/** Adds `seg` to the shard's cold segments, keeping them in offset order. */
export function insertColdSegment(state: ShardData, seg: SegmentState): void {
  const list = state.coldSegments;
  let i = list.length;
  while (i > 0 && (list[i - 1] as SegmentState).first > seg.first) i -= 1;
  list.splice(i, 0, seg);
}

/** Removes `seg` from the shard's cold segments (if there). */
export function removeColdSegment(state: ShardData, seg: SegmentState): void {
  const list = state.coldSegments;
  let lo = 0;
  let hi = list.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    const at = list[mid] as SegmentState;
    if (at === seg) {
      list.splice(mid, 1);
      return;
    }
    if (at.first < seg.first) lo = mid + 1;
    else hi = mid - 1;
  }
}

/**
 * True while a placeholder of `seg` in `sub`'s indexes stands for messages
 * `sub` still owes: the segment is cold and `sub` owes all of it (its acked
 * frontier is not past the segment: below it are only offsets that left the
 * segment, see `cold-segments.ts`). Otherwise
 * the placeholder is stale (the segment was warmed; its messages have
 * entries of their own).
 */
export function placeholderLive(sub: SubscriptionState, seg: SegmentState): boolean {
  return seg.cold && sub.start <= seg.last;
}

/** The priority a cold segment's placeholder sorts by: the highest among its messages. */
export function placeholderPriority(seg: SegmentState): number {
  return seg.liveSummary?.priority ?? seg.priorities[1];
}

/** The earliest and latest `run_at` among a cold segment's messages. */
export function coldRunAt(seg: SegmentState): readonly [number, number] {
  return seg.liveSummary?.runAt ?? seg.runAt;
}
