/**
 * Where remembered dedup ids live (format v2): the newest in the head's
 * `dedup` list, older ones in sealed *dedup segments* — immutable objects
 * the head indexes (`dedup_segments`). Model-internal.
 *
 * - Every live entry is in `state.dedup` (the lookup an enqueue uses),
 *   whichever object holds it: `state.recentDedup` is the part the head
 *   carries, in ascending offset order (entries only ever join at the end),
 *   as objects, with their expiries in `state.dedupIndex`; the sealed ones
 *   stay in their segments' compact chunks (`dedup-chunk.ts`), indexed by
 *   `state.sealedDedup` (`sealed-dedup.ts`), which expires them too.
 * - When the head's entries outgrow their byte budget the broker seals all
 *   of them into a dedup segment ({@link dedupSealCandidates},
 *   {@link sealDedupSegment}): it writes the object first (put-if-absent),
 *   then the head that indexes it. So the head's dedup part stays within
 *   the budget plus one small index entry per dedup segment of the window.
 * - A dedup segment whose latest `expires_at` passed remembers nothing: the
 *   expire step retires it ({@link retireExpiredDedupSegments}), and the
 *   broker deletes its object once a head without it has landed, exactly as
 *   for message segments (`retiredSegments`).
 *
 * Costs: O(1) per entry sealed or forgotten, O(log s) per dedup segment
 * retired; nothing here walks all live entries.
 */
import { DEDUP_SEGMENT_ENTRY_BYTES, dedupBytes } from "./approx-size.ts";
import { DedupChunk } from "./dedup-chunk.ts";
import type { ShardData } from "./shard-data.ts";
import type { DedupEntry, DedupSegmentState, SealedObject } from "./shard-records.ts";

/** Stores a new dedup entry in the head's part (replacing an expired one with the same id). */
export function putDedup(state: ShardData, e: DedupEntry): void {
  forgetDedup(state, e.dedupId);
  state.recentDedup.set(e.dedupId, e);
  const bytes = dedupBytes(e);
  state.recentDedupBytes += bytes;
  state.bytes += bytes;
  state.dedupIndex.push({ expiresAt: e.expiresAt, dedupId: e.dedupId });
}

/**
 * Remembers the entries of a dedup segment read back with its head (its
 * state's `chunk`), oldest first. An entry whose id a later segment (or the
 * head) holds again stays indexed until it expires: lookups answer the
 * newest (`sealed-dedup.ts`), so this needs no ids (they may be paged out).
 */
export function putSealedDedup(state: ShardData, seg: DedupSegmentState): void {
  const chunk = seg.chunk;
  if (chunk === undefined) return;
  const no = state.sealedDedup.addChunk(chunk, seg.name);
  for (let pos = 0; pos < chunk.length; pos++) state.sealedDedup.put(no, pos);
}

/**
 * Forgets the head's entry of a dedup id. Returns true when the head held it
 * (so the head changes). A sealed entry of the id is left to expire: one is
 * replaced only once it expired, and lookups answer the newest.
 */
export function forgetDedup(state: ShardData, dedupId: string): boolean {
  const old = state.recentDedup.get(dedupId);
  if (old === undefined) return false;
  state.recentDedup.delete(dedupId);
  const bytes = dedupBytes(old);
  state.recentDedupBytes -= bytes;
  state.bytes -= bytes;
  return true;
}

/**
 * The head's dedup entries to seal next, ascending offsets: all of them once
 * they hold more than `budgetBytes`, none before.
 */
export function dedupSealCandidates(state: ShardData, budgetBytes: number): DedupEntry[] {
  if (state.recentDedupBytes <= budgetBytes || state.recentDedup.size === 0) return [];
  return [...state.recentDedup.values()];
}

/**
 * Records that `entries` (from {@link dedupSealCandidates}) now live in the
 * dedup segment object described by `object`, which the broker has already
 * written. They stay remembered (`state.dedup`, now through the segment's
 * chunk: `sealed-dedup.ts`); the head stops carrying them.
 */
export function sealDedupSegment(
  state: ShardData,
  entries: readonly DedupEntry[],
  object: SealedObject,
): DedupSegmentState {
  const chunk = DedupChunk.from(entries);
  const seg = newDedupSegmentState(object, chunk);
  addDedupSegment(state, seg);
  const no = state.sealedDedup.addChunk(chunk, seg.name);
  entries.forEach((e, pos) => {
    if (state.recentDedup.get(e.dedupId) !== e) return; // forgotten or replaced meanwhile
    state.recentDedup.delete(e.dedupId);
    const bytes = dedupBytes(e);
    state.recentDedupBytes -= bytes;
    state.bytes -= bytes;
    state.sealedDedup.put(no, pos);
  });
  // The head's expiry heap covers the head's own entries only: rebuild it from those left (usually none).
  state.dedupIndex.clear();
  for (const e of state.recentDedup.values())
    state.dedupIndex.push({ expiresAt: e.expiresAt, dedupId: e.dedupId });
  return seg;
}

/** A dedup segment record over `chunk` (ascending offsets, at least one entry; undefined: not loaded). */
export function newDedupSegmentState(
  object: SealedObject & {
    readonly first?: number;
    readonly last?: number;
    readonly count?: number;
    readonly expiresAt?: number;
  },
  chunk: DedupChunk | undefined,
): DedupSegmentState {
  const loaded = chunk !== undefined && chunk.length > 0 ? chunk : undefined;
  return {
    name: object.name,
    first: loaded?.offsetAt(0) ?? object.first ?? 0,
    last: loaded?.offsetAt(loaded.length - 1) ?? object.last ?? 0,
    count: chunk?.length ?? object.count ?? 0,
    bytes: object.bytes,
    sha256: object.sha256,
    createdAt: object.createdAt,
    expiresAt: Math.max(object.expiresAt ?? 0, chunk?.maxExpiresAt ?? 0),
    chunk,
    json: undefined,
  };
}

/** Indexes a dedup segment in the state (its entries are remembered by the caller). */
export function addDedupSegment(state: ShardData, seg: DedupSegmentState): void {
  state.dedupSegments.set(seg.name, seg);
  state.bytes += DEDUP_SEGMENT_ENTRY_BYTES;
  state.dedupSegmentIndex.push({ expiresAt: seg.expiresAt, name: seg.name });
}

/**
 * Retires every dedup segment whose entries all expired by `now`: it leaves
 * the index, and its name joins `retiredSegments` (the broker deletes the
 * object once a head without it has landed). Returns how many.
 */
export function retireExpiredDedupSegments(state: ShardData, now: number): number {
  let retired = 0;
  for (;;) {
    const e = state.dedupSegmentIndex.peek();
    if (e === undefined || e.expiresAt > now) return retired;
    state.dedupSegmentIndex.pop();
    if (!state.dedupSegments.delete(e.name)) continue;
    state.bytes -= DEDUP_SEGMENT_ENTRY_BYTES;
    state.retiredSegments.push(e.name);
    retired += 1;
  }
}
