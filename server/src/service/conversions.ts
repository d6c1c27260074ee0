/**
 * Conversions between the engine's plain values and the casq.v1 protobuf
 * messages: milliseconds <-> Timestamp / Duration, numbers <-> uint64
 * (bigint), and the model's messages, results, stats and config <-> their
 * wire forms.
 *
 * casq keeps time in whole milliseconds: finer parts of incoming Durations
 * and Timestamps are dropped. Incoming values are checked here (sign, range)
 * and rejected with `invalid_argument` naming the field.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { type Duration, durationFromMs, type Timestamp, timestampFromMs } from "@bufbuild/protobuf/wkt";
import type {
  QueueStatsSchema,
  ShardStatusSchema,
  SubscriptionStatsSchema,
} from "@casq/api/casq/v1/admin_service_pb.ts";
import {
  AckOutcome,
  type AckResultSchema,
  type ClaimedMessageSchema,
  HeartbeatOutcome,
  type HeartbeatResultSchema,
  type MessageSchema,
  NackOutcome,
  type NackResultSchema,
  type TraceContext,
  type TraceContextSchema,
} from "@casq/api/casq/v1/message_pb.ts";
import {
  type BackoffPolicy as ProtoBackoff,
  type QueueConfig as ProtoQueueConfig,
  QueueConfigSchema,
} from "@casq/api/casq/v1/queue_config_pb.ts";
import { type ShardLeader, ShardLeaderSchema } from "@casq/api/casq/v1/shard_pb.ts";
import { CasqError } from "../errors.ts";
import type {
  AckItemResult,
  ClaimedMessage,
  MessageView,
  HeartbeatResult as ModelHeartbeatResult,
  NackItemResult,
  Receipt,
} from "../model/operations.ts";
import type { BackoffPolicy, QueueConfig, QueueConfigPatch } from "../model/queue-config.ts";
import type { BrokerRecord } from "../model/shard-records.ts";
import type { ShardStats, SubscriptionStats } from "../model/shard-stats.ts";
import { formatReceipt } from "./receipts.ts";

// ---------------------------------------------------------------- time

/** Largest Duration / Timestamp seconds protobuf allows (10,000 years). */
const MAX_PROTO_SECONDS = 315_576_000_000n;

/** A Timestamp for `ms` milliseconds since the epoch. */
export function toTimestamp(ms: number): Timestamp {
  return timestampFromMs(ms);
}

/** A Duration of `ms` milliseconds. */
export function toDuration(ms: number): Duration {
  return durationFromMs(ms);
}

/**
 * Milliseconds of a Duration, checked to lie within [minMs, maxMs]. Throws
 * `invalid_argument` naming `field` for a malformed or out-of-range value.
 */
export function durationToMs(duration: Duration, field: string, minMs: number, maxMs: number): number {
  const { seconds, nanos } = duration;
  const mixedSigns = (seconds > 0n && nanos < 0) || (seconds < 0n && nanos > 0);
  if (
    seconds > MAX_PROTO_SECONDS ||
    seconds < -MAX_PROTO_SECONDS ||
    Math.abs(nanos) > 999_999_999 ||
    mixedSigns
  )
    throw new CasqError("invalid_argument", `${field} is not a valid google.protobuf.Duration`);
  const ms = Number(seconds) * 1000 + Math.trunc(nanos / 1_000_000);
  if (ms < minMs || ms > maxMs)
    throw new CasqError(
      "invalid_argument",
      `${field} must be between ${formatMs(minMs)} and ${formatMs(maxMs)}, got ${formatMs(ms)}`,
    );
  return ms;
}

/** Milliseconds since the epoch of a Timestamp; throws `invalid_argument` naming `field` when malformed. */
export function timestampToMs(timestamp: Timestamp, field: string): number {
  const { seconds, nanos } = timestamp;
  if (seconds < -62_135_596_800n || seconds > 253_402_300_799n || nanos < 0 || nanos > 999_999_999)
    throw new CasqError("invalid_argument", `${field} is not a valid google.protobuf.Timestamp`);
  return Number(seconds) * 1000 + Math.floor(nanos / 1_000_000);
}

/** Human form of a duration in ms for error messages: `1500ms`, `20s`, `365d`. */
export function formatMs(ms: number): string {
  if (ms !== 0 && ms % 86_400_000 === 0) return `${ms / 86_400_000}d`;
  if (ms !== 0 && ms % 3_600_000 === 0) return `${ms / 3_600_000}h`;
  if (ms !== 0 && ms % 1000 === 0) return `${ms / 1000}s`;
  return `${ms}ms`;
}

// ---------------------------------------------------------------- messages

/** The wire form of a model trace context (`traceparent` / `tracestate` entries). */
export function traceContextToProto(
  context: Readonly<Record<string, string>> | undefined,
): MessageInitShape<typeof TraceContextSchema> | undefined {
  if (context === undefined) return undefined;
  return { traceparent: context.traceparent ?? "", tracestate: context.tracestate ?? "" };
}

/** The model form of a wire trace context; undefined when it carries nothing. */
export function traceContextFromProto(context: TraceContext | undefined): Record<string, string> | undefined {
  if (context === undefined) return undefined;
  const out: Record<string, string> = {};
  if (context.traceparent !== "") out.traceparent = context.traceparent;
  if (context.tracestate !== "") out.tracestate = context.tracestate;
  return Object.keys(out).length === 0 ? undefined : out;
}

/** The wire form of a stored message. `maxAttempts` is the message's own override (0: the queue's). */
export function messageToProto(
  queue: string,
  shard: number,
  m: Omit<MessageView, "maxAttempts">,
  maxAttempts: number | undefined,
): MessageInitShape<typeof MessageSchema> {
  const traceContext = traceContextToProto(m.traceContext);
  return {
    id: m.id,
    queue,
    shard,
    offset: BigInt(m.offset),
    payload: m.payload,
    headers: { ...m.headers },
    key: m.key ?? "",
    priority: m.priority,
    runAt: toTimestamp(m.runAt),
    maxAttempts: maxAttempts ?? 0,
    dedupId: m.dedupId ?? "",
    enqueuedAt: toTimestamp(m.enqueuedAt),
    ...(traceContext ? { traceContext } : {}),
  };
}

/** The wire form of one delivery. */
export function claimedToProto(
  queue: string,
  shard: number,
  m: ClaimedMessage,
): MessageInitShape<typeof ClaimedMessageSchema> {
  return {
    // The model reports the effective limit of this delivery, not the message's own override.
    message: messageToProto(queue, shard, m, undefined),
    subscription: m.subscription,
    receipt: receiptText(shard, m.receipt),
    attempt: m.attempt,
    maxAttempts: m.maxAttempts,
    leaseDeadline: toTimestamp(m.leaseDeadline),
  };
}

/** The wire receipt of a model receipt in `shard`. */
export function receiptText(shard: number, receipt: Receipt): string {
  return formatReceipt(shard, receipt.offset, receipt.attempt);
}

// ---------------------------------------------------------------- results

/** Key of a (shard, receipt) pair, to match per-shard results back to request order. */
export function receiptKey(shard: number, receipt: Receipt): string {
  return `${shard}.${receipt.offset}.${receipt.attempt}`;
}

/** Heartbeat results of one shard, keyed by {@link receiptKey}. */
export function heartbeatResultsByKey(
  shard: number,
  result: ModelHeartbeatResult,
): Map<string, MessageInitShape<typeof HeartbeatResultSchema>> {
  const out = new Map<string, MessageInitShape<typeof HeartbeatResultSchema>>();
  for (const e of result.extended)
    out.set(receiptKey(shard, e.receipt), {
      outcome: HeartbeatOutcome.EXTENDED,
      leaseDeadline: toTimestamp(e.deadline),
    });
  for (const r of result.lost) out.set(receiptKey(shard, r), { outcome: HeartbeatOutcome.LOST });
  return out;
}

const ACK_OUTCOMES = {
  acked: AckOutcome.ACKED,
  already_acked: AckOutcome.ALREADY_ACKED,
  lease_lost: AckOutcome.LEASE_LOST,
} as const;

/** The wire form of one ack outcome (without the receipt). */
export function ackResultToProto(r: AckItemResult): MessageInitShape<typeof AckResultSchema> {
  return { outcome: ACK_OUTCOMES[r.outcome] };
}

const NACK_OUTCOMES = {
  retry_scheduled: NackOutcome.RETRY_SCHEDULED,
  dead_lettered: NackOutcome.DEAD_LETTERED,
  lease_lost: NackOutcome.LEASE_LOST,
} as const;

/** The wire form of one nack outcome (without the receipt). */
export function nackResultToProto(r: NackItemResult): MessageInitShape<typeof NackResultSchema> {
  return {
    outcome: NACK_OUTCOMES[r.outcome],
    ...(r.outcome === "retry_scheduled" && r.availableAt !== undefined
      ? { retryAt: toTimestamp(r.availableAt) }
      : {}),
  };
}

// ---------------------------------------------------------------- leaders

/** The wire form of a shard's broker record. */
export function leaderToProto(record: BrokerRecord): ShardLeader {
  return create(ShardLeaderSchema, {
    brokerId: record.id,
    address: record.address,
    epoch: BigInt(record.epoch),
    leaseUntil: toTimestamp(record.leaseUntil),
  });
}

// ---------------------------------------------------------------- config

/** The wire form of a complete config (every field set). */
export function configToProto(c: QueueConfig): ProtoQueueConfig {
  return create(QueueConfigSchema, {
    leaseTtl: toDuration(c.leaseTtlMs),
    maxAttempts: c.maxAttempts,
    backoff: {
      initialDelay: toDuration(c.backoff.initialMs),
      multiplier: c.backoff.multiplier,
      maxDelay: toDuration(c.backoff.maxMs),
      jitter: c.backoff.jitter,
    },
    dedupWindow: toDuration(c.dedupWindowMs),
    retention: toDuration(c.retentionMs),
    limits: {
      maxPayloadBytes: c.maxPayloadBytes,
      maxDocumentBytes: BigInt(c.maxDocumentBytes),
      maxBatch: c.maxBatch,
      deadLetterLimit: c.deadLetterLimit,
      maxHeaders: c.maxHeaders,
      maxHeaderBytes: c.maxHeaderBytes,
      maxSubscriptions: c.maxSubscriptions,
    },
  });
}

/**
 * The model patch of a wire config: only the fields that are set. Durations
 * are checked for sign and form here; the ranges are checked by the model
 * (`validateConfigPatch`), which names the field and the range.
 */
export function configPatchFromProto(c: ProtoQueueConfig | undefined): QueueConfigPatch {
  if (c === undefined) return {};
  const patch: { -readonly [K in keyof QueueConfigPatch]: QueueConfigPatch[K] } = {};
  const ms = (d: Duration | undefined, field: string) =>
    d === undefined ? undefined : durationToMs(d, `config.${field}`, 0, Number.MAX_SAFE_INTEGER);
  const set = <K extends keyof QueueConfigPatch>(key: K, value: QueueConfigPatch[K] | undefined) => {
    if (value !== undefined) patch[key] = value;
  };
  set("leaseTtlMs", ms(c.leaseTtl, "lease_ttl"));
  set("maxAttempts", c.maxAttempts);
  set("dedupWindowMs", ms(c.dedupWindow, "dedup_window"));
  set("retentionMs", ms(c.retention, "retention"));
  if (c.backoff !== undefined) set("backoff", backoffPatch(c.backoff, ms));
  const l = c.limits;
  if (l !== undefined) {
    set("maxPayloadBytes", l.maxPayloadBytes);
    if (l.maxDocumentBytes !== undefined) {
      if (l.maxDocumentBytes > BigInt(Number.MAX_SAFE_INTEGER))
        throw new CasqError("invalid_argument", "config.limits.max_document_bytes is too large");
      patch.maxDocumentBytes = Number(l.maxDocumentBytes);
    }
    set("maxBatch", l.maxBatch);
    set("deadLetterLimit", l.deadLetterLimit);
    set("maxHeaders", l.maxHeaders);
    set("maxHeaderBytes", l.maxHeaderBytes);
    set("maxSubscriptions", l.maxSubscriptions);
  }
  return patch;
}

function backoffPatch(
  b: ProtoBackoff,
  ms: (d: Duration | undefined, field: string) => number | undefined,
): Partial<BackoffPolicy> {
  const out: { -readonly [K in keyof BackoffPolicy]?: BackoffPolicy[K] } = {};
  const initialMs = ms(b.initialDelay, "backoff.initial_delay");
  if (initialMs !== undefined) out.initialMs = initialMs;
  if (b.multiplier !== undefined) out.multiplier = b.multiplier;
  const maxMs = ms(b.maxDelay, "backoff.max_delay");
  if (maxMs !== undefined) out.maxMs = maxMs;
  if (b.jitter !== undefined) out.jitter = b.jitter;
  return out;
}

// ---------------------------------------------------------------- stats

type SubscriptionStatsInit = MessageInitShape<typeof SubscriptionStatsSchema>;

/** The wire form of one subscription's figures in one shard. */
export function subscriptionStatsToProto(s: SubscriptionStats): SubscriptionStatsInit {
  const depth = s.ready + s.inFlight + s.delayed;
  return {
    subscription: s.name,
    createdAt: toTimestamp(s.createdAt),
    ready: BigInt(s.ready),
    inFlight: BigInt(s.inFlight),
    delayed: BigInt(s.delayed),
    depth: BigInt(depth),
    dead: BigInt(s.dead),
    ...(s.oldestUnackedAgeMs === undefined ? {} : { oldestUnackedAge: toDuration(s.oldestUnackedAgeMs) }),
    lag: BigInt(s.lag),
    counters: {
      enqueued: BigInt(s.counters.enqueued),
      delivered: BigInt(s.counters.delivered),
      acked: BigInt(s.counters.acked),
      redelivered: BigInt(s.counters.redelivered),
      deadLettered: BigInt(s.counters.deadLettered),
      deadEvicted: BigInt(s.counters.deadEvicted),
      purged: BigInt(s.counters.purged),
      redriven: BigInt(s.counters.redriven),
    },
  };
}

/** Sums per-shard figures of one subscription into whole-queue figures (created_at: the earliest). */
export function sumSubscriptionStats(name: string, parts: readonly SubscriptionStats[]): SubscriptionStats {
  const sum = (pick: (s: SubscriptionStats) => number) => parts.reduce((n, s) => n + pick(s), 0);
  const ages = parts.map((s) => s.oldestUnackedAgeMs).filter((a): a is number => a !== undefined);
  const counter = (k: keyof SubscriptionStats["counters"]) => sum((s) => s.counters[k]);
  return {
    name,
    createdAt: Math.min(...parts.map((s) => s.createdAt)),
    ready: sum((s) => s.ready),
    delayed: sum((s) => s.delayed),
    inFlight: sum((s) => s.inFlight),
    expiredLeases: sum((s) => s.expiredLeases),
    dead: sum((s) => s.dead),
    oldestUnackedAgeMs: ages.length === 0 ? undefined : Math.max(...ages),
    lag: sum((s) => s.lag),
    counters: {
      enqueued: counter("enqueued"),
      delivered: counter("delivered"),
      acked: counter("acked"),
      redelivered: counter("redelivered"),
      deadLettered: counter("deadLettered"),
      deadEvicted: counter("deadEvicted"),
      purged: counter("purged"),
      redriven: counter("redriven"),
    },
  };
}

/** One shard's figures as the admin API shows them. */
export interface ShardFigures {
  readonly shard: number;
  readonly stats: ShardStats | undefined;
  readonly servedHere: boolean;
  readonly documentBytes: number;
  readonly etag: string;
  readonly problem: string;
  readonly leader: BrokerRecord | undefined;
}

/** The wire form of one shard's status. */
export function shardStatusToProto(f: ShardFigures): MessageInitShape<typeof ShardStatusSchema> {
  return {
    shard: f.shard,
    ...(f.leader ? { leader: leaderToProto(f.leader) } : {}),
    servedHere: f.servedHere,
    documentBytes: BigInt(f.documentBytes),
    nextOffset: BigInt(f.stats?.nextOffset ?? 0),
    messages: BigInt(f.stats?.messages ?? 0),
    etag: f.etag,
    subscriptions: (f.stats?.subscriptions ?? []).map(subscriptionStatsToProto),
    problem: f.problem,
  };
}

/** Whole-queue totals over shards. */
export function queueTotalsToProto(
  shards: readonly ShardFigures[],
): MessageInitShape<typeof QueueStatsSchema> {
  let messages = 0;
  let bytes = 0;
  let enqueued = 0;
  let ready = 0;
  let inFlight = 0;
  let delayed = 0;
  let dead = 0;
  let lag = 0;
  let oldest: number | undefined;
  for (const f of shards) {
    bytes += f.documentBytes;
    if (!f.stats) continue;
    messages += f.stats.messages;
    enqueued += f.stats.counters.enqueued;
    for (const s of f.stats.subscriptions) {
      ready += s.ready;
      inFlight += s.inFlight;
      delayed += s.delayed;
      dead += s.dead;
      lag += s.lag;
      if (s.oldestUnackedAgeMs !== undefined && (oldest === undefined || s.oldestUnackedAgeMs > oldest))
        oldest = s.oldestUnackedAgeMs;
    }
  }
  return {
    messages: BigInt(messages),
    documentBytes: BigInt(bytes),
    ready: BigInt(ready),
    inFlight: BigInt(inFlight),
    delayed: BigInt(delayed),
    depth: BigInt(ready + inFlight + delayed),
    dead: BigInt(dead),
    ...(oldest === undefined ? {} : { oldestUnackedAge: toDuration(oldest) }),
    lag: BigInt(lag),
    enqueued: BigInt(enqueued),
  };
}
