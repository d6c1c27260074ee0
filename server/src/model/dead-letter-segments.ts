/**
 * Where dead letters live (format v2): the newest of each subscription in
 * the head (`dead_letters`), older ones in sealed *dead-letter segments* —
 * immutable objects of one subscription each, indexed by that subscription
 * in the head (`dead_letter_segments`). Model-internal.
 *
 * - Every dead letter is in its subscription's `dead` map, oldest first,
 *   whichever object holds it; `headDead` is the part the head carries. The
 *   sealed ones always come first in `dead`: sealing takes all of a
 *   subscription's head dead letters at once, and new ones join the head.
 * - When the head's dead letters (all subscriptions together) outgrow their
 *   byte budget the broker seals the subscriptions with the most of them
 *   ({@link deadLetterSealCandidates}, {@link sealDeadLetterSegment}): it
 *   writes the object first (put-if-absent), then the head that indexes it.
 * - A sealed dead letter never changes. When it leaves (redrive, purge,
 *   eviction by `dead_letter_limit`, its subscription deleted) its position
 *   is marked *gone* in its segment ({@link removeDeadLetter}); a segment
 *   whose dead letters are all gone is *retired*: it leaves the index, and
 *   the broker deletes the object once a head without it has landed
 *   (`retiredSegments`, as for message segments).
 *
 * Costs: O(1) per dead letter added, sealed or removed; a purge or a
 * subscription delete retires whole segments without walking them.
 */
import { DEAD_LETTER_SEGMENT_ENTRY_BYTES, deadLetterBytes } from "./approx-size.ts";
import type { ShardData } from "./shard-data.ts";
import type {
  DeadLetter,
  DeadLetterRecord,
  DeadLetterSegmentState,
  SealedObject,
  SubscriptionState,
} from "./shard-records.ts";

/** Adds a dead letter to the subscription, carried by the head (newest last). */
export function addHeadDeadLetter(state: ShardData, sub: SubscriptionState, record: DeadLetterRecord): void {
  const bytes = deadLetterBytes(record.message, record.reason);
  const dl: DeadLetter = { ...record, bytes, segment: undefined, position: 0 };
  const offset = record.message.offset;
  sub.dead.set(offset, dl);
  sub.headDead.set(offset, dl);
  sub.headDeadBytes += bytes;
  state.headDeadBytes += bytes;
  state.bytes += bytes;
}

/** Adds a dead letter read from a dead-letter segment (decode; sealed ones come before the head's). */
export function addSealedDeadLetter(
  sub: SubscriptionState,
  record: DeadLetterRecord,
  seg: DeadLetterSegmentState,
  position: number,
): void {
  const bytes = deadLetterBytes(record.message, record.reason);
  sub.dead.set(record.message.offset, { ...record, bytes, segment: seg, position });
}

/**
 * Removes the dead letter at `offset` (redriven, evicted): from the head, or
 * marked gone in its segment, which retires when nothing is left in it.
 * Returns it, or undefined when there is none.
 */
export function removeDeadLetter(
  state: ShardData,
  sub: SubscriptionState,
  offset: number,
): DeadLetter | undefined {
  const dl = sub.dead.get(offset);
  if (dl === undefined) return undefined;
  sub.dead.delete(offset);
  const seg = dl.segment;
  if (seg === undefined) {
    sub.headDead.delete(offset);
    sub.headDeadBytes -= dl.bytes;
    state.headDeadBytes -= dl.bytes;
    state.bytes -= dl.bytes;
    return dl;
  }
  seg.gone.add(dl.position);
  seg.json = undefined;
  if (seg.gone.size >= seg.count) retireDeadLetterSegment(state, sub, seg);
  return dl;
}

/** Removes every dead letter of `sub` (purge, subscription deleted), retiring all its segments. Returns how many. */
export function dropAllDeadLetters(state: ShardData, sub: SubscriptionState): number {
  const n = sub.dead.size;
  state.headDeadBytes -= sub.headDeadBytes;
  state.bytes -= sub.headDeadBytes;
  sub.headDeadBytes = 0;
  sub.headDead.clear();
  for (const seg of [...sub.deadSegments.values()]) retireDeadLetterSegment(state, sub, seg);
  sub.dead.clear();
  return n;
}

function retireDeadLetterSegment(state: ShardData, sub: SubscriptionState, seg: DeadLetterSegmentState) {
  if (!sub.deadSegments.delete(seg.name)) return;
  state.bytes -= DEAD_LETTER_SEGMENT_ENTRY_BYTES;
  state.retiredSegments.push(seg.name);
}

/** One subscription's head dead letters to seal into one segment, oldest first. */
export interface DeadLetterSealCandidate {
  readonly sub: SubscriptionState;
  readonly letters: readonly DeadLetter[];
}

/**
 * What to seal next once the head's dead letters (all subscriptions) hold
 * more than `budgetBytes`: whole subscriptions, those with the most bytes
 * first, until at most half the budget is left in the head. Empty while
 * within budget.
 */
export function deadLetterSealCandidates(state: ShardData, budgetBytes: number): DeadLetterSealCandidate[] {
  if (state.headDeadBytes <= budgetBytes) return [];
  const subs = [...state.subs.values()]
    .filter((sub) => sub.headDead.size > 0)
    .sort((a, b) => b.headDeadBytes - a.headDeadBytes || (a.name < b.name ? -1 : 1));
  const out: DeadLetterSealCandidate[] = [];
  let left = state.headDeadBytes;
  for (const sub of subs) {
    if (left <= budgetBytes / 2) break;
    out.push({ sub, letters: [...sub.headDead.values()] });
    left -= sub.headDeadBytes;
  }
  return out;
}

/**
 * Records that `letters` (a {@link deadLetterSealCandidates} entry) now live
 * in the dead-letter segment object described by `object`, which the broker
 * has already written. They stay dead letters of `sub`; the head stops
 * carrying them.
 */
export function sealDeadLetterSegment(
  state: ShardData,
  sub: SubscriptionState,
  letters: readonly DeadLetter[],
  object: SealedObject,
): DeadLetterSegmentState {
  const seg = newDeadLetterSegmentState(
    object,
    letters.map(({ message, reason, attempts, deadAt }) => ({ message, reason, attempts, deadAt })),
    new Set(),
  );
  letters.forEach((dl, position) => {
    if (sub.headDead.get(dl.message.offset) !== dl) return;
    sub.headDead.delete(dl.message.offset);
    sub.headDeadBytes -= dl.bytes;
    state.headDeadBytes -= dl.bytes;
    state.bytes -= dl.bytes;
    dl.segment = seg;
    dl.position = position;
  });
  addDeadLetterSegment(state, sub, seg);
  return seg;
}

/** A dead-letter segment record over `letters` (in the object's order, at least one). */
export function newDeadLetterSegmentState(
  object: SealedObject,
  letters: readonly DeadLetterRecord[],
  gone: Set<number>,
): DeadLetterSegmentState {
  let first = Number.POSITIVE_INFINITY;
  let last = Number.NEGATIVE_INFINITY;
  for (const dl of letters) {
    if (dl.message.offset < first) first = dl.message.offset;
    if (dl.message.offset > last) last = dl.message.offset;
  }
  return {
    name: object.name,
    first,
    last,
    count: letters.length,
    bytes: object.bytes,
    sha256: object.sha256,
    createdAt: object.createdAt,
    gone,
    records: letters,
    json: undefined,
  };
}

/** Indexes a dead-letter segment under its subscription (its dead letters are added by the caller). */
export function addDeadLetterSegment(state: ShardData, sub: SubscriptionState, seg: DeadLetterSegmentState) {
  sub.deadSegments.set(seg.name, seg);
  state.bytes += DEAD_LETTER_SEGMENT_ENTRY_BYTES;
}
