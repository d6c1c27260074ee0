/**
 * The v2 head encoder as the simplest code writes it — every part encoded
 * afresh, joined into one string, encoded once; no cache of any kind (not
 * even the segments' own cached index JSON) — for tests to hold the real
 * encoder (`src/model/head-encoder.ts`, which copies the bytes of unchanged
 * parts from its last encode) to the same bytes. Not a test file itself.
 */
import { SHARD_FORMAT } from "../src/model/document-formats.ts";
import {
  configJson,
  deadLettersJson,
  dedupEntryJson,
  deliveryJson,
  headerJson,
  messageJson,
  subscriptionCountersJson,
} from "../src/model/record-encoder.ts";
import { requireBody } from "../src/model/segment-mechanics.ts";
import type { ShardData } from "../src/model/shard-data.ts";
import { compactAckState } from "../src/model/shard-mechanics.ts";
import type {
  DeadLetterSegmentState,
  DedupSegmentState,
  IndexSegmentState,
  SegmentState,
  SubscriptionState,
} from "../src/model/shard-records.ts";

const json = JSON.stringify;

function ranges(offsets: Iterable<number>): string {
  const sorted = [...offsets].sort((a, b) => a - b);
  const parts: string[] = [];
  for (let i = 0; i < sorted.length; i++) {
    const from = sorted[i] as number;
    let to = from;
    while (i + 1 < sorted.length && sorted[i + 1] === to + 1) to = sorted[++i] as number;
    parts.push(`[${from},${to}]`);
  }
  return `[${parts.join(",")}]`;
}

function deadLetterSegment(seg: DeadLetterSegmentState): string {
  return `{"name":${json(seg.name)},"first":${seg.first},"last":${seg.last},"count":${seg.count},"bytes":${seg.bytes},"sha256":"${seg.sha256}","created_at":${seg.createdAt},"gone":${ranges(seg.gone)}}`;
}

function segment(seg: SegmentState): string {
  return `{"name":${json(seg.name)},"first":${seg.first},"last":${seg.last},"count":${seg.count},"bytes":${seg.bytes},"sha256":"${seg.sha256}","created_at":${seg.createdAt},"priorities":[${seg.priorities[0]},${seg.priorities[1]}],"run_at":[${seg.runAt[0]},${seg.runAt[1]}],"gone":${ranges(seg.gone)}}`;
}

function indexSegment(idx: IndexSegmentState): string {
  return `{"name":${json(idx.name)},"first":${idx.first},"last":${idx.last},"count":${idx.segments.length},"bytes":${idx.bytes},"sha256":"${idx.sha256}","created_at":${idx.createdAt}}`;
}

function dedupSegment(seg: DedupSegmentState): string {
  return `{"name":${json(seg.name)},"first":${seg.first},"last":${seg.last},"count":${seg.count},"bytes":${seg.bytes},"sha256":"${seg.sha256}","created_at":${seg.createdAt},"expires_at":${seg.expiresAt}}`;
}

function subscription(state: ShardData, sub: SubscriptionState): string {
  compactAckState(state, sub);
  const sealed =
    sub.deadSegments.size > 0
      ? `,"dead_letter_segments":[${[...sub.deadSegments.values()].map(deadLetterSegment).join(",")}]`
      : "";
  return `{"name":${json(sub.name)},"created_at":${sub.createdAt},"acked_below":${sub.start},"acked":${ranges(sub.settled)},"deliveries":[${[
    ...sub.deliveries,
  ]
    .sort(([a], [b]) => a - b)
    .map(([offset, d]) => deliveryJson(offset, d))
    .join(
      ",",
    )}],"dead_letters":${deadLettersJson(sub.headDead.values())}${sealed},"counters":{${subscriptionCountersJson(sub.counters)}}}`;
}

/** The canonical v2 head bytes of `state`, encoded from scratch. */
export function referenceEncodeHead(state: ShardData): Uint8Array {
  const c = state.counters;
  const subs: string[] = [];
  for (const name of state.subscriptionNames()) {
    const sub = state.subs.get(name);
    if (sub !== undefined) subs.push(subscription(state, sub));
  }
  const dedup = [...state.recentDedup.values()].map(dedupEntryJson);
  const dedupSegments =
    state.dedupSegments.size > 0
      ? `,"dedup_segments":[${[...state.dedupSegments.values()].map(dedupSegment).join(",")}]`
      : "";
  const indexSegments =
    state.indexSegments.size > 0
      ? `,"index_segments":[${[...state.indexSegments.values()].map(indexSegment).join(",")}]`
      : "";
  const segments = [...state.segments.values()].filter((seg) => seg.index === undefined).map(segment);
  const messages = state.sortedTail().map((m) => messageJson(requireBody(m.msg), m.targets));
  return new TextEncoder().encode(
    headerJson(state, SHARD_FORMAT) +
      `,"next_offset":${state.nextOffset},"config":${configJson(state.config)}` +
      `,"counters":{${subscriptionCountersJson(c)},"dropped":${c.dropped}}` +
      `,"subscriptions":[${subs.join(",")}]` +
      `,"dedup":[${dedup.join(",")}]${dedupSegments}${indexSegments}` +
      `,"segments":[${segments.join(",")}]` +
      `,"messages":[${messages.join(",")}]}`,
  );
}
