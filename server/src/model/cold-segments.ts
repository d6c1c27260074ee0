/**
 * Cold segments: sealed segments none of whose messages is in memory
 * (format v2; model-internal).
 *
 * A leader holds a sealed message as meta (~370 bytes with its indexes),
 * which at a backlog of a million is most of its memory. A segment deep in
 * the backlog can instead be *cold*: only its index entry (offset range,
 * count, priorities, run_at range) is kept, and each subscription that owes
 * it has one *placeholder* in its runnable (or wake-up) index that sorts
 * before every message of the segment (the segment's highest priority at
 * its first offset). A claim that meets a live placeholder stops there; the
 * broker *warms* the segment (reads its meta back: {@link warmSegment})
 * before the next batch, and the messages take their own places.
 *
 * Only a segment that nothing in the head refers to per message may be
 * cold, so that all of its messages are alike: no message held elsewhere
 * (a redriven one in the tail) has an offset in its range; every
 * subscription either owes all of its messages, untouched (no offset of the
 * range settled or delivered, and below its acked frontier only offsets
 * that left the segment), or none (frontier past its last offset); and at
 * least one owes them. The test reads only what the head says, so a state
 * and its encoded head agree ({@link coolable}; {@link coolableRefs} for a
 * head being decoded). While a segment is cold no operation can touch an
 * offset of its range, and the acked frontier stops at its first offset
 * still in it. Claims,
 * acks, nacks, heartbeats and expiries never touch a cold message (it has
 * no delivery); purge, redrive and deleting a subscription need every
 * segment warm ({@link requireWarm}: the broker warms them first).
 *
 * Costs: cooling or warming is O(count x subscriptions) for the segment;
 * nothing else changes cost.
 */
import { CasqError } from "../errors.ts";
import {
  coldRunAt,
  insertColdSegment,
  placeholderLive,
  placeholderPriority,
  removeColdSegment,
} from "./cold-segment-index.ts";
import type { ShardData } from "./shard-data.ts";
import type { SegmentRef, ShardDocument } from "./shard-document-parser.ts";
import { pendingAt, schedule } from "./shard-mechanics.ts";
import type { MessageMeta, RetainedMessage, SegmentState, SubscriptionState } from "./shard-records.ts";

/** Messages of `seg` still in it. */
export function liveCount(seg: SegmentState): number {
  return seg.count - seg.gone.size;
}

/** The subscriptions that owe the messages of cold segment `seg`. */
export function owingSubscriptions(state: ShardData, seg: SegmentState): SubscriptionState[] {
  const out: SubscriptionState[] = [];
  for (const sub of state.subs.values()) if (sub.start <= seg.last) out.push(sub);
  return out;
}

/**
 * Puts a placeholder of cold segment `seg` into `sub`'s runnable index, or
 * its wake-up index when none of its messages is runnable at `now` (always
 * the wake-up index when `now` is undefined, as while decoding).
 */
export function pushPlaceholder(sub: SubscriptionState, seg: SegmentState, now: number | undefined): void {
  const at = coldRunAt(seg)[0];
  if (now !== undefined && at <= now)
    sub.ready.push({ priority: placeholderPriority(seg), offset: seg.first, cold: seg });
  else sub.delayed.push({ at, offset: seg.first, cold: seg });
}

/** True when the warm segment `seg` may go cold now (see module header). O(range x subscriptions). */
export function coolable(state: ShardData, seg: SegmentState): boolean {
  if (seg.cold || liveCount(seg) === 0) return false;
  for (let offset = seg.first; offset <= seg.last; offset++) {
    const m = state.messages.get(offset);
    if (m !== undefined && m.segment !== seg) return false; // held elsewhere (a redriven message)
  }
  const owing: SubscriptionState[] = [];
  for (const sub of state.subs.values()) {
    if (sub.start > seg.last) continue;
    for (let offset = seg.first; offset < sub.start; offset++) if (!seg.gone.has(offset)) return false;
    for (let offset = seg.first; offset <= seg.last; offset++)
      if (sub.settled.has(offset) || sub.deliveries.has(offset)) return false;
    owing.push(sub);
  }
  if (owing.length === 0) return false;
  for (const r of seg.records) {
    if (seg.gone.has(r.offset)) continue;
    const m = state.messages.get(r.offset);
    if (m === undefined || m.targets !== undefined || m.pending !== owing.length) return false;
  }
  return true;
}

/**
 * Makes a warm segment cold (precondition: {@link coolable}): its messages
 * leave memory and each subscription that owes them gets a placeholder.
 * Index-only: the head's bytes do not change.
 */
export function coolSegment(state: ShardData, seg: SegmentState, now: number): void {
  for (const r of seg.records) {
    if (seg.gone.has(r.offset)) continue;
    const m = state.messages.get(r.offset) as RetainedMessage;
    state.messages.delete(r.offset);
    if (state.ids.get(r.id) === r.offset) state.ids.delete(r.id);
    state.settledSlots -= state.subs.size - m.pending;
  }
  let priority = Number.NEGATIVE_INFINITY;
  let earliest = Number.POSITIVE_INFINITY;
  let latest = Number.NEGATIVE_INFINITY;
  for (const r of seg.records) {
    if (seg.gone.has(r.offset)) continue;
    if (r.priority > priority) priority = r.priority;
    if (r.runAt < earliest) earliest = r.runAt;
    if (r.runAt > latest) latest = r.runAt;
  }
  seg.liveSummary = { priority, runAt: [earliest, latest] };
  seg.records = [];
  seg.cold = true;
  insertColdSegment(state, seg);
  state.coldMessages += liveCount(seg);
  for (const sub of owingSubscriptions(state, seg)) {
    pushPlaceholder(sub, seg, now);
    dropStaleEntries(state, sub);
  }
}

/**
 * Rebuilds `sub`'s runnable and wake-up indexes without their stale entries
 * once those are most of them (cooled messages leave theirs behind):
 * amortised O(1) per cooled message.
 */
function dropStaleEntries(state: ShardData, sub: SubscriptionState): void {
  const live = state.messages.size + state.coldSegments.length;
  const owed = (offset: number) => pendingAt(state, sub, offset) !== undefined;
  if (sub.ready.size > 2 * live + 64)
    sub.ready.retain((e) => (e.cold !== undefined ? placeholderLive(sub, e.cold) : owed(e.offset)));
  if (sub.delayed.size > 2 * live + 64)
    sub.delayed.retain((e) => (e.cold !== undefined ? placeholderLive(sub, e.cold) : owed(e.offset)));
}

/**
 * Brings a cold segment's messages back into memory from `records`, the
 * meta of everything the segment object holds (checked against its index
 * entry by the caller's read). Index-only. Throws `internal` when `records`
 * is not that segment's.
 */
export function warmSegment(
  state: ShardData,
  seg: SegmentState,
  records: readonly MessageMeta[],
  now: number,
): void {
  if (!seg.cold) return;
  const first = records[0];
  const last = records[records.length - 1];
  if (records.length !== seg.count || first?.offset !== seg.first || last?.offset !== seg.last)
    throw new CasqError(
      "internal",
      `shard ${state.queue}/${state.shard}: the records given to warm segment ${seg.name} are not that segment's`,
      { queue: state.queue, shard: state.shard },
    );
  // As when a head is read with its segments: every offset the head says left must be one the
  // segment holds, or messages the head thinks gone would come back, and others be dropped.
  let goneHeld = 0;
  for (const r of records) if (seg.gone.has(r.offset)) goneHeld += 1;
  if (goneHeld !== seg.gone.size)
    throw new CasqError(
      "data_loss",
      `shard ${state.queue}/${state.shard}: the head says offsets left segment ${seg.name} that it does not hold`,
      { queue: state.queue, shard: state.shard },
    );
  const owing = owingSubscriptions(state, seg);
  seg.cold = false;
  seg.liveSummary = undefined;
  seg.records = records;
  removeColdSegment(state, seg);
  state.coldMessages -= liveCount(seg);
  state.messagesSorted = false;
  for (const r of records) {
    if (seg.gone.has(r.offset)) continue;
    const m: RetainedMessage = { msg: r, targets: undefined, pending: owing.length, bytes: 0, segment: seg };
    state.messages.set(r.offset, m);
    state.ids.set(r.id, r.offset);
    state.settledSlots += state.subs.size - owing.length;
    for (const sub of owing) schedule(sub, m, undefined, now);
  }
}

/**
 * Throws `unavailable` (nothing changed) when the shard has cold segments:
 * `what` needs every message in memory, and the broker warms them all
 * before a batch that carries it, so this happens only when it could not.
 */
export function requireWarm(state: ShardData, what: string): void {
  if (state.coldSegments.length === 0) return;
  throw new CasqError(
    "unavailable",
    `shard ${state.queue}/${state.shard}: ${what} needs all ${state.coldSegments.length} segments not in memory read back first; retry`,
    { queue: state.queue, shard: state.shard },
  );
}

/** How many elements of ascending `sorted` lie in [from, to]. */
function countWithin(sorted: readonly number[], from: number, to: number): number {
  const lowerBound = (x: number) => {
    let lo = 0;
    let hi = sorted.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if ((sorted[mid] as number) < x) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  };
  return to < from ? 0 : lowerBound(to + 1) - lowerBound(from);
}

/**
 * For a head `doc` being decoded: a test telling which of its segments may
 * be cold (the same rule as {@link coolable}, from the head alone), so a
 * loading leader need not read them until claims reach them.
 */
export function coolableRefs(doc: ShardDocument): (ref: SegmentRef) => boolean {
  const tail = doc.messages.map((m) => m.msg.offset);
  const subs = doc.subscriptions.map((ds) => ({
    start: ds.ackedBelow,
    acked: ds.acked,
    delivered: ds.deliveries.map((d) => d.offset),
  }));
  return (ref) => {
    if (ref.gone.length >= ref.count) return false;
    if (countWithin(tail, ref.first, ref.last) > 0) return false; // a redriven message in its range
    let owing = 0;
    for (const s of subs) {
      if (s.start > ref.last) continue;
      if (s.start > ref.first && countWithin(ref.gone, ref.first, s.start - 1) !== s.start - ref.first)
        return false;
      if (countWithin(s.acked, ref.first, ref.last) > 0 || countWithin(s.delivered, ref.first, ref.last) > 0)
        return false;
      owing += 1;
    }
    return owing > 0;
  };
}

/** A cold segment's state from the head's index entry `ref` (nothing read from the object). */
export function coldSegmentFromRef(ref: SegmentRef): SegmentState {
  return {
    name: ref.name,
    first: ref.first,
    last: ref.last,
    count: ref.count,
    bytes: ref.bytes,
    sha256: ref.sha256,
    createdAt: ref.createdAt,
    priorities: ref.priorities,
    runAt: ref.runAt,
    gone: new Set(ref.gone),
    records: [],
    cold: true,
    liveSummary: undefined,
    json: undefined,
    index: undefined,
  };
}
