/**
 * The v1 document encoder (`"format": "casq.shard.v1"`): the whole shard in
 * one document. casq writes v2 (`head-encoder.ts`); this stays to test
 * reading v1 documents, their upgrade and the mixed-version rules.
 *
 * Canonical like v2: subscriptions by name, messages by offset, dedup ids by
 * expiry, each record as `record-encoder.ts` writes it.
 */
import { SHARD_FORMAT_V1 } from "./document-formats.ts";
import {
  configJson,
  deadLettersJson,
  dedupEntryJson,
  deliveriesJson,
  headerJson,
  messageJson,
  subscriptionCountersJson,
} from "./record-encoder.ts";
import { bodyOf, requireBody } from "./segment-mechanics.ts";
import type { ShardData } from "./shard-data.ts";
import { isSettled } from "./shard-mechanics.ts";
import type { SubscriptionState } from "./shard-records.ts";

const encoder = new TextEncoder();
const json = JSON.stringify;

type ShardStateMessages = ReturnType<ShardData["sortedMessages"]>;

/** One subscription as v1 writes it: settled offsets as `acked_below` plus a list above it. */
function subscriptionJson(state: ShardData, sub: SubscriptionState, ordered: ShardStateMessages): string {
  // acked_below: the lowest untargeted retained offset this subscription has not settled (else next_offset);
  // acked: settled untargeted retained offsets above it.
  let ackedBelow = state.nextOffset;
  const acked: number[] = [];
  for (const m of ordered) {
    if (m.targets !== undefined) continue;
    if (ackedBelow === state.nextOffset) {
      if (!isSettled(m, sub)) ackedBelow = m.msg.offset;
    } else if (sub.settled.has(m.msg.offset)) {
      acked.push(m.msg.offset);
    }
  }
  return `{"name":${json(sub.name)},"created_at":${sub.createdAt},"acked_below":${ackedBelow},"acked":[${acked.join(",")}],"deliveries":${deliveriesJson(sub)},"dead_letters":${deadLettersJson(sub.dead.values())},"counters":{${subscriptionCountersJson(sub.counters)}}}`;
}

/** The canonical v1 JSON array of every remembered dedup id, by expiry then id. */
export function dedupJson(state: ShardData): string {
  const dedup = [...state.dedup.values()].sort((a, b) =>
    a.expiresAt !== b.expiresAt ? a.expiresAt - b.expiresAt : a.dedupId < b.dedupId ? -1 : 1,
  );
  return `[${dedup.map(dedupEntryJson).join(",")}]`;
}

/**
 * The canonical v1 document bytes of a shard (the whole shard in one
 * document). casq writes v2; this stays to test reading v1 documents and
 * the mixed-version rules. O(document).
 */
export function encodeShardV1(state: ShardData): Uint8Array {
  const c = state.counters;
  const ordered = state.sortedMessages();
  const parts: string[] = [
    headerJson(state, SHARD_FORMAT_V1),
    `,"next_offset":${state.nextOffset},"config":${configJson(state.config)}`,
    `,"counters":{${subscriptionCountersJson(c)},"dropped":${c.dropped}}`,
    `,"subscriptions":[`,
  ];
  const names = state.subscriptionNames();
  names.forEach((name, i) => {
    const sub = state.subs.get(name);
    if (sub !== undefined) parts.push((i > 0 ? "," : "") + subscriptionJson(state, sub, ordered));
  });
  parts.push(`],"dedup":${dedupJson(state)}`, `,"messages":[`);
  ordered.forEach((m, i) => {
    parts.push((i > 0 ? "," : "") + messageJson(requireBody(bodyOf(state, m) ?? m.msg), m.targets));
  });
  parts.push("]}");
  return encoder.encode(parts.join(""));
}
