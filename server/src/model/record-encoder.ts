/**
 * The canonical JSON of the records casq's documents hold — a message, a
 * queue config, counters, a subscription's deliveries, a dead letter, a
 * dedup entry, and the shard header members — shared by the v2 head encoder
 * (`head-encoder.ts`), the v1 document encoder (`v1-document-encoder.ts`) and
 * the segment encoders (`segment-codec.ts`). See `docs/document-format.md`
 * for every field; `record-parser.ts` and `shard-document-parser.ts` read
 * them back.
 *
 * Canonical: keys in a fixed order, collections in a fixed order
 * (deliveries by offset, dead letters oldest first), defaults omitted, no
 * whitespace. The same record always gives the same bytes, and
 * `encode(decode(bytes))` reproduces `bytes`.
 */
import type { BytePieces } from "./byte-pieces.ts";
import type { QueueConfig } from "./queue-config.ts";
import type { ShardData } from "./shard-data.ts";
import type {
  DeadLetterRecord,
  DedupEntry,
  Delivery,
  Lease,
  MessageRecord,
  SegmentState,
  SubscriptionCounters,
  SubscriptionState,
} from "./shard-records.ts";

const json = JSON.stringify;

/**
 * Cached JSON of a message's immutable contents before `targets` (its
 * offset, ids, times, headers...). The payload's base64 is not cached: it is
 * most of a message's JSON, and held from a message's first head encode to
 * its seal it outlived young-generation collections and became old-generation
 * garbage (~2.8 KB per 1 KiB job); made when written, it dies young.
 */
const fragments = new WeakMap<MessageRecord, string>();

function messageHead(m: MessageRecord): string {
  let head = fragments.get(m);
  if (head !== undefined) return head;
  head = `{"offset":${m.offset},"id":${json(m.id)},"enqueued_at":${m.enqueuedAt}`;
  if (m.runAt !== m.enqueuedAt) head += `,"run_at":${m.runAt}`;
  if (m.priority !== 0) head += `,"priority":${m.priority}`;
  if (m.key !== undefined) head += `,"key":${json(m.key)}`;
  if (m.maxAttempts !== undefined) head += `,"max_attempts":${m.maxAttempts}`;
  if (m.dedupId !== undefined) head += `,"dedup_id":${json(m.dedupId)}`;
  if (Object.keys(m.headers).length > 0) head += `,"headers":${json(m.headers)}`;
  if (m.traceContext !== undefined) head += `,"trace_context":${json(m.traceContext)}`;
  fragments.set(m, head);
  return head;
}

function payloadBase64(m: MessageRecord): string {
  return Buffer.from(m.payload.buffer, m.payload.byteOffset, m.payload.byteLength).toString("base64");
}

/**
 * Drops the cached JSON of `m` (it was sealed into a segment: the head will
 * not encode it again).
 */
export function forgetEncoding(m: MessageRecord): void {
  fragments.delete(m);
}

/** The canonical JSON of a message (`targets` only on a redriven one). */
export function messageJson(m: MessageRecord, targets: readonly string[] | undefined): string {
  const head = messageHead(m);
  const tail = `,"payload":"${payloadBase64(m)}"}`;
  return targets === undefined ? head + tail : `${head},"targets":${json(targets)}${tail}`;
}

/**
 * Appends {@link messageJson} of `m` to `out` (without `targets`, as a
 * segment holds it, unless given), its parts one by one: joined, the string
 * would be copied flat once more before it is written.
 */
export function writeMessageJson(out: BytePieces, m: MessageRecord, targets?: readonly string[]): void {
  out.text(messageHead(m));
  if (targets !== undefined) out.text(`,"targets":${json(targets)}`);
  out.text(',"payload":"');
  out.text(payloadBase64(m));
  out.text('"}');
}

/** The canonical JSON of a queue config. */
export function configJson(c: QueueConfig): string {
  return json({
    lease_ttl_ms: c.leaseTtlMs,
    max_attempts: c.maxAttempts,
    backoff: {
      initial_ms: c.backoff.initialMs,
      multiplier: c.backoff.multiplier,
      max_ms: c.backoff.maxMs,
      jitter: c.backoff.jitter,
    },
    dedup_window_ms: c.dedupWindowMs,
    retention_ms: c.retentionMs,
    max_payload_bytes: c.maxPayloadBytes,
    max_document_bytes: c.maxDocumentBytes,
    max_batch: c.maxBatch,
    dead_letter_limit: c.deadLetterLimit,
    max_headers: c.maxHeaders,
    max_header_bytes: c.maxHeaderBytes,
    max_subscriptions: c.maxSubscriptions,
  });
}

/** The canonical JSON members of a counters object (without braces). */
export function subscriptionCountersJson(c: SubscriptionCounters): string {
  return `"enqueued":${c.enqueued},"delivered":${c.delivered},"acked":${c.acked},"redelivered":${c.redelivered},"dead_lettered":${c.deadLettered},"dead_evicted":${c.deadEvicted},"purged":${c.purged},"redriven":${c.redriven}`;
}

/** One delivery's canonical JSON (the deliveries of a head, v1 document alike). */
export function deliveryJson(offset: number, d: Delivery): string {
  let s = `{"offset":${offset},"attempts":${d.attempt}`;
  if (d.base !== 0) s += `,"attempts_at_redrive":${d.base}`;
  if (d.availableAt !== undefined) s += `,"available_at":${d.availableAt}`;
  if (d.lease !== undefined) {
    const l = d.lease;
    s += `,"lease":{"worker":${json(l.worker)},"claimed_at":${l.claimedAt},"deadline":${l.deadline},"ttl_ms":${l.ttlMs}}`;
  }
  return `${s}}`;
}

/** A delivery's JSON and what it was made from: a delivery changes in place, its lease is replaced. */
interface EncodedDelivery {
  readonly offset: number;
  readonly attempt: number;
  readonly base: number;
  readonly availableAt: number | undefined;
  readonly lease: Lease | undefined;
  readonly json: string;
}

/**
 * The last JSON of each delivery: a head encodes every live lease on every
 * commit, and a worker's window keeps a thousand of them live, most unchanged
 * since the last commit.
 */
const encodedDeliveries = new WeakMap<Delivery, EncodedDelivery>();

/** {@link deliveryJson}, reused (the same string) while the delivery's fields are those it was made from. */
export function cachedDeliveryJson(offset: number, d: Delivery): string {
  const e = encodedDeliveries.get(d);
  if (
    e !== undefined &&
    e.offset === offset &&
    e.attempt === d.attempt &&
    e.base === d.base &&
    e.availableAt === d.availableAt &&
    e.lease === d.lease
  )
    return e.json;
  const encoded = deliveryJson(offset, d);
  encodedDeliveries.set(d, {
    offset,
    attempt: d.attempt,
    base: d.base,
    availableAt: d.availableAt,
    lease: d.lease,
    json: encoded,
  });
  return encoded;
}

/** The offsets of a subscription's deliveries, ascending. */
export function deliveryOffsets(sub: SubscriptionState): number[] {
  const offsets = [...sub.deliveries.keys()];
  // Claims mostly deliver in offset order, so the map is often in order already.
  let ordered = true;
  for (let i = 1; i < offsets.length && ordered; i++)
    ordered = (offsets[i - 1] as number) < (offsets[i] as number);
  if (!ordered) offsets.sort((a, b) => a - b);
  return offsets;
}

/** The canonical JSON array of a subscription's deliveries, by offset. */
export function deliveriesJson(sub: SubscriptionState): string {
  const deliveries: string[] = [];
  for (const offset of deliveryOffsets(sub)) {
    const d = sub.deliveries.get(offset);
    if (d !== undefined) deliveries.push(cachedDeliveryJson(offset, d));
  }
  return `[${deliveries.join(",")}]`;
}

/** One dead letter's canonical JSON (head, v1 document and dead-letter segment alike). */
export function deadLetterJson(dl: DeadLetterRecord): string {
  return `{"dead_at":${dl.deadAt},"attempts":${dl.attempts},"reason":${json(dl.reason)},"message":${messageJson(dl.message, undefined)}}`;
}

/** The canonical JSON array of dead letters, in the order given (oldest first). */
export function deadLettersJson(letters: Iterable<DeadLetterRecord>): string {
  const dead: string[] = [];
  for (const dl of letters) dead.push(deadLetterJson(dl));
  return `[${dead.join(",")}]`;
}

/** One dedup entry's canonical JSON (head, v1 document and dedup segment alike). */
export function dedupEntryJson(e: DedupEntry): string {
  return `{"dedup_id":${json(e.dedupId)},"id":${json(e.id)},"offset":${e.offset},"expires_at":${e.expiresAt}}`;
}

/** The canonical JSON members before `next_offset` shared by both formats (from `format` to `broker`). */
export function headerJson(state: ShardData, format: string): string {
  const broker = state.broker;
  return (
    `{"format":"${format}","queue":${json(state.queue)},"shard":${state.shard},"created_at":${state.createdAt}` +
    `,"write_id":${state.writeId === undefined ? "null" : json(state.writeId)}` +
    `,"recent_write_ids":[${state.recentWriteIds.map((id) => json(id)).join(",")}]` +
    `,"broker":${broker === undefined ? "null" : `{"id":${json(broker.id)},"address":${json(broker.address)},"epoch":${broker.epoch},"lease_until":${broker.leaseUntil}}`}`
  );
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

/** The head's index entry of a segment (cached until its `gone` set changes). */
export function segmentJson(seg: SegmentState): string {
  if (seg.json !== undefined) return seg.json;
  const gone = [...seg.gone].sort((a, b) => a - b);
  seg.json = `{"name":${json(seg.name)},"first":${seg.first},"last":${seg.last},"count":${seg.count},"bytes":${seg.bytes},"sha256":"${seg.sha256}","created_at":${seg.createdAt},"priorities":[${seg.priorities[0]},${seg.priorities[1]}],"run_at":[${seg.runAt[0]},${seg.runAt[1]}],"gone":${rangesJson(gone)}}`;
  return seg.json;
}
