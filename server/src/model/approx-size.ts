/**
 * Estimated encoded sizes, for the O(1) running document-size estimate.
 *
 * The shard keeps a running total of these estimates, adding and subtracting
 * as records come and go, so the document-size limit can be enforced on every
 * enqueue without encoding the document. Each estimate depends only on what
 * the document stores about the record (never on index state), so a state
 * decoded from its own document has exactly the same total.
 */
import type { DedupEntry, MessageRecord } from "./shard-records.ts";

/** UTF-8 byte length of a string. */
export function utf8Bytes(text: string): number {
  return Buffer.byteLength(text, "utf8");
}

/** Base64 length of `n` bytes (with padding). */
export function base64Length(n: number): number {
  return Math.ceil(n / 3) * 4;
}

function mapBytes(map: Readonly<Record<string, string>> | undefined): number {
  if (map === undefined) return 0;
  let total = 0;
  for (const key of Object.keys(map)) total += utf8Bytes(key) + utf8Bytes(map[key] ?? "") + 6;
  return total;
}

/** Fixed part of the document: format, queue, shard, write id, broker, config, counters. */
export const DOCUMENT_BASE_BYTES = 1_200;

/** A subscription entry without its deliveries and dead letters. */
export function subscriptionBytes(name: string): number {
  return 260 + utf8Bytes(name);
}

/**
 * One "settled" slot: a (message, subscription) pair where the subscription is
 * done with a retained message. Such pairs show up in the sparse `acked`
 * lists (or are covered by a floor), about one short number each. Counted for
 * every retained message as `subscriptions - pending`, which a decoded state
 * derives identically.
 */
export const SETTLED_SLOT_BYTES = 8;

/** One delivery record (attempts, backoff, lease). */
export const DELIVERY_BYTES = 150;

/** One sealed segment's entry in the head's index (format v2), its `gone` list aside. */
export const SEGMENT_ENTRY_BYTES = 320;

/** One index segment's entry in the head (format v2). */
export const INDEX_SEGMENT_ENTRY_BYTES = 200;

/** One dedup segment's entry in the head's index (format v2). */
export const DEDUP_SEGMENT_ENTRY_BYTES = 230;

/** One message as stored (targets not counted: they are rare and short). */
export function messageBytes(m: MessageRecord): number {
  return (
    110 +
    utf8Bytes(m.id) +
    base64Length(m.payload.byteLength) +
    mapBytes(m.headers) +
    (m.key === undefined ? 0 : utf8Bytes(m.key) + 10) +
    (m.dedupId === undefined ? 0 : utf8Bytes(m.dedupId) + 14) +
    mapBytes(m.traceContext) +
    (m.traceContext === undefined ? 0 : 20)
  );
}

/** One dead letter: a full message copy plus reason, attempts and time. */
export function deadLetterBytes(m: MessageRecord, reason: string): number {
  return messageBytes(m) + 70 + utf8Bytes(reason);
}

/** One dedup entry. */
export function dedupBytes(e: DedupEntry): number {
  return 70 + utf8Bytes(e.dedupId) + utf8Bytes(e.id);
}

/** One dead-letter segment's entry in the head's index (format v2), its `gone` list aside. */
export const DEAD_LETTER_SEGMENT_ENTRY_BYTES = 230;
