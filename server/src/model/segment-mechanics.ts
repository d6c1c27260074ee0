/**
 * Where a retained message's contents live (format v2): in the head's
 * *tail* (the newest messages, written with every head write) or in a sealed
 * *segment* (an immutable object the head indexes). Model-internal.
 *
 * - New messages join the tail. When the tail outgrows its byte budget the
 *   broker seals its oldest untargeted messages into a segment
 *   ({@link sealCandidates}, {@link sealSegment}): it writes the segment
 *   object first (put-if-absent), then the head that indexes it.
 * - A sealed message never changes. When it leaves the shard, or a redrive
 *   gives it a `targets` list (mutable, so it must live in the head), its
 *   offset is marked *gone* in its segment ({@link leaveSegment}); the copy
 *   moved back to the tail wins on decode.
 * - A segment whose messages are all gone is *retired*: removed from the
 *   index, and its object is deleted by the broker once the head without it
 *   has landed (`retiredSegments`).
 *
 * - Once sealed, a retained message keeps only its meta in memory
 *   ({@link sealSegment}); its body stays in the segment object, and the
 *   broker pages segments' bodies in and out of a bounded cache. Whoever
 *   needs a body asks {@link bodyOf}; the broker pages in, before applying
 *   a batch, the bodies its nacks and lease expiries may dead-letter, and
 *   fills the bodies of claimed messages after the commit.
 *
 * Costs: O(1) per message moved (plus O(k log k) to sort k candidates).
 */
import { CasqError } from "../errors.ts";
import { messageBytes, SEGMENT_ENTRY_BYTES } from "./approx-size.ts";
import { dissolveIndexSegment } from "./index-segments.ts";
import { forgetEncoding } from "./record-encoder.ts";
import type { ShardData } from "./shard-data.ts";
import {
  hasBody,
  type MessageMeta,
  type MessageRecord,
  metaOf,
  type RetainedMessage,
  type SealedObject,
  type SegmentState,
} from "./shard-records.ts";

/** The whole record of a retained message: its own, or its sealed body when paged in (undefined: paged out). */
export function bodyOf(state: ShardData, m: RetainedMessage): MessageRecord | undefined {
  const msg = m.msg;
  if (hasBody(msg)) return msg;
  return m.segment === undefined ? undefined : state.bodies(m.segment.name, msg.offset);
}

/**
 * `m` as a whole record; an internal error when its body is not in memory
 * (a broker bug: whatever reads a body must have it paged in first).
 */
export function requireBody(m: MessageMeta): MessageRecord {
  if (hasBody(m)) return m;
  throw new CasqError(
    "internal",
    `the body of message ${m.offset} is not in memory (it should have been paged in from its segment first)`,
  );
}

/**
 * A retryable refusal of an operation that needs the body of a sealed
 * message which is paged out; nothing has been changed. The broker pages
 * bodies in before a batch, so this happens only when it could not.
 */
export function bodyNotPagedIn(state: ShardData, offset: number): CasqError {
  return new CasqError(
    "unavailable",
    `shard ${state.queue}/${state.shard}: the contents of message ${offset} are not in memory yet (being read from its segment); retry`,
    { queue: state.queue, shard: state.shard },
  );
}

/** Adds a retained message to the shard, its contents in the tail. */
export function retainInTail(state: ShardData, m: RetainedMessage): void {
  const offset = m.msg.offset;
  state.messages.set(offset, m);
  state.ids.set(m.msg.id, offset);
  state.bytes += m.bytes;
  const last = state.tailLastOffset;
  if (last !== undefined && offset < last) state.tailSorted = false;
  state.tail.set(offset, m);
  state.tailLastOffset = last === undefined || offset > last ? offset : last;
  state.tailBytes += m.bytes;
}

/** Takes a message out of the tail or its segment (it is leaving the shard, or moving). */
export function removeContents(state: ShardData, m: RetainedMessage): void {
  if (m.segment !== undefined) {
    leaveSegment(state, m.segment, m.msg.offset);
    m.segment = undefined;
    return;
  }
  if (state.tail.delete(m.msg.offset)) {
    state.tailBytes -= m.bytes;
    state.bytes -= m.bytes;
  }
}

/**
 * Moves a sealed message back into the tail (a redrive is about to give it
 * `targets`), with `whole`, its whole record (e.g. from its dead letter).
 */
export function unsealToTail(state: ShardData, m: RetainedMessage, whole: MessageRecord): void {
  if (m.segment === undefined) return;
  removeContents(state, m);
  m.msg = whole;
  m.bytes = messageBytes(whole);
  state.tail.set(m.msg.offset, m);
  state.tailSorted = false;
  state.tailBytes += m.bytes;
  state.bytes += m.bytes;
}

/**
 * Marks `offset` gone from `seg`; retires the segment when nothing is left
 * in it. Its index entry changes, so the index segment listing it (if any)
 * is dissolved first (`index-segments.ts`).
 */
export function leaveSegment(state: ShardData, seg: SegmentState, offset: number): void {
  if (seg.index !== undefined) dissolveIndexSegment(state, seg.index);
  seg.gone.add(offset);
  seg.json = undefined;
  if (seg.gone.size < seg.count) return;
  state.segments.delete(seg.name);
  state.bytes -= SEGMENT_ENTRY_BYTES;
  state.retiredSegments.push(seg.name);
}

/**
 * The tail messages to seal next, oldest first, when the tail holds more than
 * `budgetBytes`: untargeted messages (a targeted one must stay in the head)
 * until at least half the budget is left in the tail, so sealing happens in
 * chunks of about half the budget. Empty when the tail is within budget.
 */
export function sealCandidates(state: ShardData, budgetBytes: number): RetainedMessage[] {
  if (state.tailBytes <= budgetBytes) return [];
  const ordered = state.sortedTail();
  const out: RetainedMessage[] = [];
  let left = state.tailBytes;
  for (const m of ordered) {
    if (left <= budgetBytes / 2) break;
    if (m.targets !== undefined) continue;
    out.push(m);
    left -= m.bytes;
  }
  return out;
}

/**
 * Records that `messages` (from {@link sealCandidates}, ascending offsets)
 * now live in the segment object described by `object`, which the broker
 * has already written. Each keeps only its meta from now on (the whole
 * records are the caller's to page, or drop). Returns the new segment.
 */
export function sealSegment(
  state: ShardData,
  messages: readonly RetainedMessage[],
  object: SealedObject,
): SegmentState {
  const records = messages.map((m) => metaOf(m.msg));
  const seg = newSegmentState(object, records, new Set());
  for (const [i, m] of messages.entries()) {
    state.tail.delete(m.msg.offset);
    state.tailBytes -= m.bytes;
    state.bytes -= m.bytes;
    if (hasBody(m.msg)) forgetEncoding(m.msg);
    m.msg = records[i] as MessageMeta;
    m.bytes = 0;
    m.segment = seg;
  }
  addSegment(state, seg);
  return seg;
}

/**
 * Records that `written`, the whole records of tail messages that the broker
 * wrote into the segment object `object` ahead of this commit (see
 * `ShardHeadStore.prepareSegment`), now live there. A message that left the
 * tail since (settled and dropped, purged, or redriven: its entry has
 * `targets` now) is in the segment's `gone` set from the start, as if it had
 * left after sealing. Returns the new segment, or undefined (nothing sealed)
 * when none of them is still in the tail as written.
 */
export function sealWrittenSegment(
  state: ShardData,
  written: readonly MessageRecord[],
  object: SealedObject,
): SegmentState | undefined {
  const present: (RetainedMessage | undefined)[] = [];
  const gone = new Set<number>();
  for (const record of written) {
    const m = state.tail.get(record.offset);
    const still = m !== undefined && m.msg === record && m.targets === undefined;
    present.push(still ? m : undefined);
    if (!still) gone.add(record.offset);
  }
  if (gone.size === written.length) return undefined;
  const records = written.map(metaOf);
  const seg = newSegmentState(object, records, gone);
  for (const [i, m] of present.entries()) {
    if (m === undefined) continue;
    state.tail.delete(m.msg.offset);
    state.tailBytes -= m.bytes;
    state.bytes -= m.bytes;
    forgetEncoding(written[i] as MessageRecord);
    m.msg = records[i] as MessageMeta;
    m.bytes = 0;
    m.segment = seg;
  }
  addSegment(state, seg);
  return seg;
}

/** Indexes a segment in the state (its messages are linked by the caller). */
export function addSegment(state: ShardData, seg: SegmentState): void {
  state.segments.set(seg.name, seg);
  state.bytes += SEGMENT_ENTRY_BYTES;
}

/** A segment record over `records` (ascending offsets, at least one). */
export function newSegmentState(
  object: SealedObject,
  records: readonly MessageMeta[],
  gone: Set<number>,
): SegmentState {
  let minPriority = Number.POSITIVE_INFINITY;
  let maxPriority = Number.NEGATIVE_INFINITY;
  let minRunAt = Number.POSITIVE_INFINITY;
  let maxRunAt = Number.NEGATIVE_INFINITY;
  for (const r of records) {
    if (r.priority < minPriority) minPriority = r.priority;
    if (r.priority > maxPriority) maxPriority = r.priority;
    if (r.runAt < minRunAt) minRunAt = r.runAt;
    if (r.runAt > maxRunAt) maxRunAt = r.runAt;
  }
  return {
    name: object.name,
    first: (records[0] as MessageMeta).offset,
    last: (records[records.length - 1] as MessageMeta).offset,
    count: records.length,
    bytes: object.bytes,
    sha256: object.sha256,
    createdAt: object.createdAt,
    priorities: [minPriority, maxPriority],
    runAt: [minRunAt, maxRunAt],
    gone,
    records,
    cold: false,
    liveSummary: undefined,
    json: undefined,
    index: undefined,
  };
}
