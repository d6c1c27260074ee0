/**
 * The v2 head encoder (`"format": "casq.shard.v2"`): everything mutable about
 * a shard, and nothing that grows with its backlog of sealed messages.
 *
 * Compared with v1 the head replaces the full message list by the *tail*
 * (messages not yet sealed, and every redriven message, whose `targets` may
 * still change) and an index of sealed *segments* (`segments`), and writes
 * each subscription's settled offsets above `acked_below` as inclusive
 * ranges. Canonical like v1: the same state gives the same bytes.
 *
 * Cost: O(head) — subscriptions with their live deliveries and settled
 * ranges, the head's own dedup ids (already in offset order: no sort), the
 * head's own dead letters, the tail and one cached entry per segment, dedup
 * segment and dead-letter segment. Sealed messages, dedup ids and dead
 * letters are not touched. The head's dedup ids, most of a busy head (with
 * a dedup id on every message, up to the tail budget of them), are encoded
 * once each: a commit encodes only the ids it added (see dedupList).
 */
import { SHARD_FORMAT } from "./document-formats.ts";
import {
  configJson,
  deadLettersJson,
  dedupEntryJson,
  deliveriesJson,
  headerJson,
  messageJson,
  subscriptionCountersJson,
} from "./record-encoder.ts";
import { requireBody } from "./segment-mechanics.ts";
import type { ShardData } from "./shard-data.ts";
import { compactAckState } from "./shard-mechanics.ts";
import type {
  DeadLetterSegmentState,
  DedupEntry,
  DedupSegmentState,
  SegmentState,
  SubscriptionState,
} from "./shard-records.ts";

const encoder = new TextEncoder();
const json = JSON.stringify;

/**
 * The JSON of one part of a shard's head from its last encode, with the
 * values it was made from: reused while they are the very same values
 * (records never change in place; a changed one is a new object or string).
 */
interface PartCache {
  readonly from: readonly unknown[];
  readonly json: string;
}

/** Most commits change the subscriptions and counters only: these parts are encoded again only when they change. */
const tailParts = new WeakMap<ShardData, PartCache>();
const dedupSegmentParts = new WeakMap<ShardData, PartCache>();
const segmentParts = new WeakMap<ShardData, PartCache>();

/** `cache`'s JSON for `state` when it was made from exactly `from` (same values, same order); else `build()`'s, remembered. */
function cachedPart(
  cache: WeakMap<ShardData, PartCache>,
  state: ShardData,
  from: readonly unknown[],
  build: () => string,
): string {
  const hit = cache.get(state);
  if (hit !== undefined && hit.from.length === from.length && hit.from.every((v, i) => v === from[i]))
    return hit.json;
  const part = build();
  cache.set(state, { from, json: part });
  return part;
}

/** Sorted offsets as `[[from,to],...]` (inclusive). */
export function rangesJson(sorted: readonly number[]): string {
  const parts: string[] = [];
  let i = 0;
  while (i < sorted.length) {
    const from = sorted[i] as number;
    let to = from;
    while (i + 1 < sorted.length && sorted[i + 1] === to + 1) {
      i += 1;
      to += 1;
    }
    parts.push(`[${from},${to}]`);
    i += 1;
  }
  return `[${parts.join(",")}]`;
}

function subscriptionJson(state: ShardData, sub: SubscriptionState): string {
  compactAckState(state, sub);
  const acked = [...sub.settled].sort((a, b) => a - b);
  let sealed = "";
  if (sub.deadSegments.size > 0) {
    const refs: string[] = [];
    for (const seg of sub.deadSegments.values()) refs.push(deadLetterSegmentJson(seg));
    sealed = `,"dead_letter_segments":[${refs.join(",")}]`;
  }
  return `{"name":${json(sub.name)},"created_at":${sub.createdAt},"acked_below":${sub.start},"acked":${rangesJson(acked)},"deliveries":${deliveriesJson(sub)},"dead_letters":${deadLettersJson(sub.headDead.values())}${sealed},"counters":{${subscriptionCountersJson(sub.counters)}}}`;
}

/** The head's index entry of a dead-letter segment (cached until its `gone` set changes). */
function deadLetterSegmentJson(seg: DeadLetterSegmentState): string {
  if (seg.json !== undefined) return seg.json;
  const gone = [...seg.gone].sort((a, b) => a - b);
  seg.json = `{"name":${json(seg.name)},"first":${seg.first},"last":${seg.last},"count":${seg.count},"bytes":${seg.bytes},"sha256":"${seg.sha256}","created_at":${seg.createdAt},"gone":${rangesJson(gone)}}`;
  return seg.json;
}

/** The head's index entry of a segment (cached until its `gone` set changes). */
function segmentJson(seg: SegmentState): string {
  if (seg.json !== undefined) return seg.json;
  const gone = [...seg.gone].sort((a, b) => a - b);
  seg.json = `{"name":${json(seg.name)},"first":${seg.first},"last":${seg.last},"count":${seg.count},"bytes":${seg.bytes},"sha256":"${seg.sha256}","created_at":${seg.createdAt},"priorities":[${seg.priorities[0]},${seg.priorities[1]}],"run_at":[${seg.runAt[0]},${seg.runAt[1]}],"gone":${rangesJson(gone)}}`;
  return seg.json;
}

/** The head's index entry of a dedup segment (immutable, so cached). */
function dedupSegmentJson(seg: DedupSegmentState): string {
  seg.json ??= `{"name":${json(seg.name)},"first":${seg.first},"last":${seg.last},"count":${seg.count},"bytes":${seg.bytes},"sha256":"${seg.sha256}","created_at":${seg.createdAt},"expires_at":${seg.expiresAt}}`;
  return seg.json;
}

/**
 * The head's dedup entries as the last encode wrote them: the entries, where
 * each one's JSON ends, and the bytes that encode produced (the list's JSON
 * is `bytes[start, start + ends[last])`).
 */
interface DedupListCache {
  readonly entries: DedupEntry[];
  /** `ends[i]`: the bytes of the list's JSON through entry `i` (the commas between entries included). */
  readonly ends: number[];
  bytes: Uint8Array;
  start: number;
}

const dedupLists = new WeakMap<ShardData, DedupListCache>();

/** The head's dedup list for one encode: a prefix kept from the last encode's bytes, then JSON of the rest. */
interface DedupList {
  readonly cache: DedupListCache;
  /** Entries of the kept prefix, whose JSON is at `cache.bytes[cache.start]`. */
  readonly kept: number;
  readonly keptBytes: number;
  /** The entries after the kept prefix, and where each one's JSON ends (as `DedupListCache.ends`). */
  readonly addedEntries: DedupEntry[];
  readonly addedEnds: number[];
  /** Their JSON (with the leading commas). */
  readonly added: string;
}

/**
 * The head's dedup entries (without the brackets), in offset order.
 *
 * Entries only ever join the head's list at its end (dedup-segments.ts), and
 * with a dedup id on every message each commit adds one or a few to a list
 * of up to ~1,800 (the tail budget), most of the head: so the JSON of the
 * entries the last encode wrote, up to the first one no longer there, is
 * copied from its bytes, and only what follows is encoded. A removal (an
 * expired id replaced, a seal) encodes from the removed entry on. Records
 * never change in place, so identity says the JSON still holds.
 */
function dedupList(state: ShardData): DedupList {
  let cache = dedupLists.get(state);
  if (cache === undefined) {
    cache = { entries: [], ends: [], bytes: new Uint8Array(0), start: 0 };
    dedupLists.set(state, cache);
  }
  const { entries, ends } = cache;
  const current = state.recentDedup.values();
  let next = current.next();
  let kept = 0;
  while (!next.done && kept < entries.length && entries[kept] === next.value) {
    kept += 1;
    next = current.next();
  }
  const keptBytes = kept === 0 ? 0 : (ends[kept - 1] as number);
  let end = keptBytes;
  const pieces: string[] = [];
  const addedEntries: DedupEntry[] = [];
  const addedEnds: number[] = [];
  for (; !next.done; next = current.next()) {
    const piece = (kept + addedEntries.length > 0 ? "," : "") + dedupEntryJson(next.value);
    pieces.push(piece);
    end += Buffer.byteLength(piece);
    addedEntries.push(next.value);
    addedEnds.push(end);
  }
  return { cache, kept, keptBytes, addedEntries, addedEnds, added: pieces.join("") };
}

/** After an encode that wrote `dedup` into `bytes` at `start`: the cache describes that encode. */
function rememberDedupList(dedup: DedupList, bytes: Uint8Array, start: number): void {
  const { cache } = dedup;
  cache.entries.length = dedup.kept;
  cache.ends.length = dedup.kept;
  for (const e of dedup.addedEntries) cache.entries.push(e);
  for (const end of dedup.addedEnds) cache.ends.push(end);
  cache.bytes = bytes;
  cache.start = start;
}

/** The index of dedup segments (when there are any). */
function dedupSegmentsPartJson(state: ShardData): string {
  if (state.dedupSegments.size === 0) return "";
  const segments = [...state.dedupSegments.values()];
  return cachedPart(dedupSegmentParts, state, segments, () => {
    const refs: string[] = [];
    for (const seg of segments) refs.push(dedupSegmentJson(seg));
    return `,"dedup_segments":[${refs.join(",")}]`;
  });
}

/** The index of sealed segments (each entry cached until its `gone` set changes). */
function segmentsPartJson(state: ShardData): string {
  const entries: string[] = [];
  for (const seg of state.segments.values()) entries.push(segmentJson(seg));
  return cachedPart(segmentParts, state, entries, () => `,"segments":[${entries.join(",")}]`);
}

/** The tail's messages in offset order (a redriven one with its `targets`, which change as it settles). */
function tailPartJson(state: ShardData): string {
  const tail = state.sortedTail();
  const from: unknown[] = [];
  for (const m of tail) from.push(m.msg, m.targets);
  return cachedPart(tailParts, state, from, () => {
    const parts: string[] = [];
    for (const m of tail) parts.push(messageJson(requireBody(m.msg), m.targets)); // the tail holds whole records
    return `,"messages":[${parts.join(",")}]`;
  });
}

/** The canonical v2 head bytes of a shard. O(head). */
export function encodeHead(state: ShardData): Uint8Array {
  const c = state.counters;
  const parts: string[] = [
    headerJson(state, SHARD_FORMAT),
    `,"next_offset":${state.nextOffset},"config":${configJson(state.config)}`,
    `,"counters":{${subscriptionCountersJson(c)},"dropped":${c.dropped}}`,
    `,"subscriptions":[`,
  ];
  state.subscriptionNames().forEach((name, i) => {
    const sub = state.subs.get(name);
    if (sub !== undefined) parts.push((i > 0 ? "," : "") + subscriptionJson(state, sub));
  });
  parts.push(`],"dedup":[`);
  const dedup = dedupList(state);
  parts.push(dedup.added);
  const before = encoder.encode(parts.join(""));
  const after = encoder.encode(
    `]${dedupSegmentsPartJson(state)}${segmentsPartJson(state)}${tailPartJson(state)}}`,
  );
  // The head's opening, then the dedup list's kept prefix (copied from the last encode's bytes)
  // spliced in before the JSON of the entries added since, then the rest.
  const { cache, keptBytes } = dedup;
  const opening = before.length - Buffer.byteLength(dedup.added);
  const out = new Uint8Array(before.length + keptBytes + after.length);
  out.set(before.subarray(0, opening), 0);
  out.set(cache.bytes.subarray(cache.start, cache.start + keptBytes), opening);
  out.set(before.subarray(opening), opening + keptBytes);
  out.set(after, before.length + keptBytes);
  rememberDedupList(dedup, out, opening);
  return out;
}
