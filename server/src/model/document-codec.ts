/**
 * The shard document formats: strict parsing of v1 (`"casq.shard.v1"`, the
 * whole shard in one document) and v2 (`"casq.shard.v2"`, a head plus sealed
 * segments, see `head-encoder.ts` and `segment-codec.ts`), the v1 encoder
 * (kept to test upgrades), and the JSON pieces both encoders share. See
 * `docs/document-format.md` for every field.
 *
 * Canonical: keys in a fixed order, collections in a fixed order
 * (subscriptions by name, messages/deliveries by offset, dedup ids by expiry,
 * dead letters oldest first), defaults omitted, no whitespace. The same state
 * always gives the same bytes, and `encode(decode(bytes))` reproduces `bytes`.
 *
 * Strict: a document that is not UTF-8 JSON, has an unknown format version,
 * a missing or unknown field, or a value of the wrong type or range is
 * refused with `CasqError("data_loss")`. Compatibility rule: casq never
 * writes over a document it cannot fully read; a newer format gets a new
 * version string, and an older casq refuses it instead of downgrading it.
 */
import { CasqError } from "../errors.ts";
import { base64Length } from "./approx-size.ts";
import { PRIORITY_MAX, PRIORITY_MIN } from "./input-validation.ts";
import { type BackoffPolicy, configProblem, type QueueConfig } from "./queue-config.ts";
import type { ShardData } from "./shard-data.ts";
import { isSettled, sortedStringMap } from "./shard-mechanics.ts";
import type {
  BrokerRecord,
  DeadLetterRecord,
  DedupEntry,
  Lease,
  MessageRecord,
  ShardCounters,
  SubscriptionCounters,
  SubscriptionState,
} from "./shard-records.ts";

/** The format version this casq writes. */
export const SHARD_FORMAT = "casq.shard.v2";

/** The older format this casq still reads (and upgrades to v2 with its first write). */
export const SHARD_FORMAT_V1 = "casq.shard.v1";

/** The format of a segment object. */
export const SEGMENT_FORMAT = "casq.segment.v1";

/** The format of a dedup segment object. */
export const DEDUP_SEGMENT_FORMAT = "casq.dedup.v1";

/** The format of a dead-letter segment object. */
export const DEAD_LETTER_SEGMENT_FORMAT = "casq.deadletters.v1";

// ---------------------------------------------------------------- encoding

const encoder = new TextEncoder();
const json = JSON.stringify;

/** Cached JSON of immutable message contents: everything before `targets`, and the payload tail. */
const fragments = new WeakMap<MessageRecord, { head: string; tail: string }>();

function messageFragments(m: MessageRecord): { head: string; tail: string } {
  let f = fragments.get(m);
  if (f !== undefined) return f;
  let head = `{"offset":${m.offset},"id":${json(m.id)},"enqueued_at":${m.enqueuedAt}`;
  if (m.runAt !== m.enqueuedAt) head += `,"run_at":${m.runAt}`;
  if (m.priority !== 0) head += `,"priority":${m.priority}`;
  if (m.key !== undefined) head += `,"key":${json(m.key)}`;
  if (m.maxAttempts !== undefined) head += `,"max_attempts":${m.maxAttempts}`;
  if (m.dedupId !== undefined) head += `,"dedup_id":${json(m.dedupId)}`;
  if (Object.keys(m.headers).length > 0) head += `,"headers":${json(m.headers)}`;
  if (m.traceContext !== undefined) head += `,"trace_context":${json(m.traceContext)}`;
  const payload = Buffer.from(m.payload.buffer, m.payload.byteOffset, m.payload.byteLength).toString(
    "base64",
  );
  f = { head, tail: `,"payload":"${payload}"}` };
  fragments.set(m, f);
  return f;
}

/** The canonical JSON of a message (`targets` only on a redriven one). */
export function messageJson(m: MessageRecord, targets: readonly string[] | undefined): string {
  const f = messageFragments(m);
  return targets === undefined ? f.head + f.tail : `${f.head},"targets":${json(targets)}${f.tail}`;
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

/** The canonical JSON array of a subscription's deliveries, by offset. */
export function deliveriesJson(sub: SubscriptionState): string {
  const deliveries: string[] = [];
  for (const offset of [...sub.deliveries.keys()].sort((a, b) => a - b)) {
    const d = sub.deliveries.get(offset);
    if (d === undefined) continue;
    let s = `{"offset":${offset},"attempts":${d.attempt}`;
    if (d.base !== 0) s += `,"attempts_at_redrive":${d.base}`;
    if (d.availableAt !== undefined) s += `,"available_at":${d.availableAt}`;
    if (d.lease !== undefined) {
      const l = d.lease;
      s += `,"lease":{"worker":${json(l.worker)},"claimed_at":${l.claimedAt},"deadline":${l.deadline},"ttl_ms":${l.ttlMs}}`;
    }
    deliveries.push(`${s}}`);
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

/** The canonical v1 JSON array of every remembered dedup id, by expiry then id. */
export function dedupJson(state: ShardData): string {
  const dedup = [...state.dedup.values()].sort((a, b) =>
    a.expiresAt !== b.expiresAt ? a.expiresAt - b.expiresAt : a.dedupId < b.dedupId ? -1 : 1,
  );
  return `[${dedup.map(dedupEntryJson).join(",")}]`;
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

type ShardStateMessages = ReturnType<ShardData["sortedMessages"]>;

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
    parts.push((i > 0 ? "," : "") + messageJson(m.msg, m.targets));
  });
  parts.push("]}");
  return encoder.encode(parts.join(""));
}

// ---------------------------------------------------------------- parsing

/** A parsed, type-checked document, before cross-references are checked by `ShardState.decode`. */
export interface ShardDocument {
  /** 1 for `casq.shard.v1`, 2 for `casq.shard.v2`. */
  readonly version: 1 | 2;
  readonly queue: string;
  readonly shard: number;
  readonly createdAt: number;
  readonly writeId: string | undefined;
  /** Earlier write ids, oldest first (absent in documents written before it existed: empty). */
  readonly recentWriteIds: readonly string[];
  readonly broker: BrokerRecord | undefined;
  readonly nextOffset: number;
  readonly config: QueueConfig;
  readonly counters: ShardCounters;
  readonly subscriptions: readonly {
    readonly name: string;
    readonly createdAt: number;
    readonly ackedBelow: number;
    readonly acked: readonly number[];
    readonly deliveries: readonly {
      readonly offset: number;
      readonly attempt: number;
      readonly base: number;
      readonly availableAt: number | undefined;
      readonly lease: Lease | undefined;
    }[];
    /** The dead letters the head carries, oldest first (v2: the newest; the rest are in dead-letter segments). */
    readonly deadLetters: readonly DeadLetterRecord[];
    /** v2: the subscription's sealed dead-letter segments, oldest first (empty for v1, and when absent). */
    readonly deadLetterSegments: readonly DeadLetterSegmentRef[];
    readonly counters: SubscriptionCounters;
  }[];
  readonly dedup: readonly DedupEntry[];
  /** v1: every retained message; v2: the head's tail. */
  readonly messages: readonly { readonly msg: MessageRecord; readonly targets: string[] | undefined }[];
  /** v2: the sealed segments, ascending offsets (empty for v1). */
  readonly segments: readonly SegmentRef[];
  /** v2: the sealed dedup segments, ascending offsets (empty for v1, and when absent). */
  readonly dedupSegments: readonly DedupSegmentRef[];
}

/** A sealed dead-letter segment as its subscription in the v2 head indexes it. */
export interface DeadLetterSegmentRef {
  readonly name: string;
  /** Lowest message offset among its dead letters. */
  readonly first: number;
  /** Highest message offset among its dead letters. */
  readonly last: number;
  readonly count: number;
  readonly bytes: number;
  readonly sha256: string;
  readonly createdAt: number;
  /** Positions (0-based, in the object's order) of its dead letters that left, ascending. */
  readonly gone: readonly number[];
}

/** A sealed dedup segment as the v2 head indexes it. */
export interface DedupSegmentRef {
  readonly name: string;
  readonly first: number;
  readonly last: number;
  readonly count: number;
  readonly bytes: number;
  readonly sha256: string;
  readonly createdAt: number;
  /** Latest `expires_at` of its entries. */
  readonly expiresAt: number;
}

/** A sealed segment as the v2 head indexes it. */
export interface SegmentRef {
  readonly name: string;
  readonly first: number;
  readonly last: number;
  readonly count: number;
  readonly bytes: number;
  readonly sha256: string;
  readonly createdAt: number;
  readonly priorities: readonly [number, number];
  readonly runAt: readonly [number, number];
  /** Offsets no longer in it, ascending. */
  readonly gone: readonly number[];
}

/** Segment object names: `<first offset, 20 digits>-<epoch>-<sequence>.json`. */
export const SEGMENT_NAME = /^[0-9]{20}-[0-9]{1,15}-[0-9a-z]{1,32}\.json$/;

/** Dedup segment object names: `<first offset, 20 digits>-<epoch>-<sequence>.dedup.json`. */
export const DEDUP_SEGMENT_NAME = /^[0-9]{20}-[0-9]{1,15}-[0-9a-z]{1,32}\.dedup\.json$/;

/** Dead-letter segment object names: `<lowest offset, 20 digits>-<epoch>-<sequence>.dead.json`. */
export const DEAD_LETTER_SEGMENT_NAME = /^[0-9]{20}-[0-9]{1,15}-[0-9a-z]{1,32}\.dead\.json$/;

class Corrupt extends Error {}

function fail(path: string, problem: string): never {
  throw new Corrupt(`${path}: ${problem}`);
}

type Obj = Record<string, unknown>;

function object(
  value: unknown,
  path: string,
  required: readonly string[],
  optional: readonly string[] = [],
): Obj {
  if (typeof value !== "object" || value === null || Array.isArray(value)) fail(path, "expected an object");
  const o = value as Obj;
  for (const key of required) if (!Object.hasOwn(o, key)) fail(path, `missing field "${key}"`);
  for (const key of Object.keys(o)) {
    if (!required.includes(key) && !optional.includes(key)) fail(path, `unknown field "${key}"`);
  }
  return o;
}

function array(value: unknown, path: string): unknown[] {
  if (!Array.isArray(value)) fail(path, "expected an array");
  return value;
}

function integer(value: unknown, path: string, min = 0, max = Number.MAX_SAFE_INTEGER): number {
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < min || value > max) {
    fail(path, `expected an integer in [${min}, ${max}], got ${json(value)}`);
  }
  return value;
}

function text(value: unknown, path: string, nonEmpty = false): string {
  if (typeof value !== "string") fail(path, `expected a string, got ${json(value)}`);
  if (nonEmpty && value === "") fail(path, "expected a non-empty string");
  return value;
}

function optional<T>(
  o: Obj,
  key: string,
  read: (v: unknown, path: string) => T,
  path: string,
): T | undefined {
  return Object.hasOwn(o, key) ? read(o[key], `${path}.${key}`) : undefined;
}

function stringMap(value: unknown, path: string): Record<string, string> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) fail(path, "expected an object");
  const map = value as Obj;
  for (const key of Object.keys(map)) text(map[key], `${path}.${key}`);
  return sortedStringMap(map as Record<string, string>);
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

function payload(value: unknown, path: string): Uint8Array {
  const s = text(value, path);
  if (s.length % 4 !== 0 || !BASE64.test(s)) fail(path, "expected standard padded base64");
  const bytes = Buffer.from(s, "base64");
  if (base64Length(bytes.byteLength) !== s.length || bytes.toString("base64") !== s) {
    fail(path, "base64 is not canonical");
  }
  return new Uint8Array(bytes);
}

const MESSAGE_REQUIRED = ["offset", "id", "enqueued_at", "payload"] as const;
const MESSAGE_OPTIONAL = [
  "run_at",
  "priority",
  "key",
  "max_attempts",
  "dedup_id",
  "headers",
  "trace_context",
] as const;

function message(value: unknown, path: string, allowTargets: boolean) {
  const o = object(
    value,
    path,
    MESSAGE_REQUIRED,
    allowTargets ? [...MESSAGE_OPTIONAL, "targets"] : MESSAGE_OPTIONAL,
  );
  const enqueuedAt = integer(o.enqueued_at, `${path}.enqueued_at`);
  const runAt = optional(o, "run_at", integer, path) ?? enqueuedAt;
  if (runAt < enqueuedAt) fail(`${path}.run_at`, "must not be before enqueued_at");
  const msg: MessageRecord = {
    id: text(o.id, `${path}.id`, true),
    offset: integer(o.offset, `${path}.offset`),
    payload: payload(o.payload, `${path}.payload`),
    headers: optional(o, "headers", stringMap, path) ?? sortedStringMap({}),
    key: optional(o, "key", text, path),
    priority: optional(o, "priority", (v, p) => integer(v, p, PRIORITY_MIN, PRIORITY_MAX), path) ?? 0,
    runAt,
    maxAttempts: optional(o, "max_attempts", (v, p) => integer(v, p, 1, 1_000), path),
    dedupId: optional(o, "dedup_id", (v, p) => text(v, p, true), path),
    enqueuedAt,
    traceContext: optional(o, "trace_context", stringMap, path),
  };
  const targets = optional(
    o,
    "targets",
    (v, p) => array(v, p).map((t, i) => text(t, `${p}[${i}]`, true)),
    path,
  );
  return { msg, targets };
}

const SUB_COUNTERS = [
  "enqueued",
  "delivered",
  "acked",
  "redelivered",
  "dead_lettered",
  "dead_evicted",
  "purged",
  "redriven",
] as const;

function subscriptionCounters(
  value: unknown,
  path: string,
  extra: readonly string[] = [],
): SubscriptionCounters {
  const o = object(value, path, [...SUB_COUNTERS, ...extra]);
  const n = (key: string) => integer(o[key], `${path}.${key}`);
  return {
    enqueued: n("enqueued"),
    delivered: n("delivered"),
    acked: n("acked"),
    redelivered: n("redelivered"),
    deadLettered: n("dead_lettered"),
    deadEvicted: n("dead_evicted"),
    purged: n("purged"),
    redriven: n("redriven"),
  };
}

function finite(value: unknown, path: string): number {
  if (typeof value !== "number" || !Number.isFinite(value))
    fail(path, `expected a number, got ${json(value)}`);
  return value;
}

function config(value: unknown, path: string): QueueConfig {
  const keys = [
    "lease_ttl_ms",
    "max_attempts",
    "backoff",
    "dedup_window_ms",
    "retention_ms",
    "max_payload_bytes",
    "max_document_bytes",
    "max_batch",
    "dead_letter_limit",
    "max_headers",
    "max_header_bytes",
    "max_subscriptions",
  ];
  const o = object(value, path, keys);
  const b = object(o.backoff, `${path}.backoff`, ["initial_ms", "multiplier", "max_ms", "jitter"]);
  const backoff: BackoffPolicy = {
    initialMs: finite(b.initial_ms, `${path}.backoff.initial_ms`),
    multiplier: finite(b.multiplier, `${path}.backoff.multiplier`),
    maxMs: finite(b.max_ms, `${path}.backoff.max_ms`),
    jitter: finite(b.jitter, `${path}.backoff.jitter`),
  };
  const n = (key: string) => finite(o[key], `${path}.${key}`);
  const c: QueueConfig = {
    leaseTtlMs: n("lease_ttl_ms"),
    maxAttempts: n("max_attempts"),
    backoff: Object.freeze(backoff),
    dedupWindowMs: n("dedup_window_ms"),
    retentionMs: n("retention_ms"),
    maxPayloadBytes: n("max_payload_bytes"),
    maxDocumentBytes: n("max_document_bytes"),
    maxBatch: n("max_batch"),
    deadLetterLimit: n("dead_letter_limit"),
    maxHeaders: n("max_headers"),
    maxHeaderBytes: n("max_header_bytes"),
    maxSubscriptions: n("max_subscriptions"),
  };
  const problem = configProblem(c);
  if (problem !== undefined) fail(path, problem);
  return Object.freeze(c);
}

function lease(value: unknown, path: string): Lease {
  const o = object(value, path, ["worker", "claimed_at", "deadline", "ttl_ms"]);
  return {
    worker: text(o.worker, `${path}.worker`),
    claimedAt: integer(o.claimed_at, `${path}.claimed_at`),
    deadline: integer(o.deadline, `${path}.deadline`),
    ttlMs: integer(o.ttl_ms, `${path}.ttl_ms`, 1),
  };
}

/** `[[from, to], ...]`: inclusive, ascending, disjoint and not touching; expanded to the offsets. */
function ranges(value: unknown, path: string): number[] {
  const out: number[] = [];
  let last = -2;
  array(value, path).forEach((v, i) => {
    const p = `${path}[${i}]`;
    const pair = array(v, p);
    if (pair.length !== 2) fail(p, "expected [from, to]");
    const from = integer(pair[0], `${p}[0]`);
    const to = integer(pair[1], `${p}[1]`);
    if (to < from || from <= last + 1) fail(p, "ranges must ascend, be disjoint and not touch");
    for (let o = from; o <= to; o++) out.push(o);
    last = to;
  });
  return out;
}

function pairOf(value: unknown, path: string, min: number, max: number): [number, number] {
  const pair = array(value, path);
  if (pair.length !== 2) fail(path, "expected [min, max]");
  const a = integer(pair[0], `${path}[0]`, min, max);
  const b = integer(pair[1], `${path}[1]`, min, max);
  if (b < a) fail(path, "max is below min");
  return [a, b];
}

function segmentRef(value: unknown, path: string): SegmentRef {
  const o = object(value, path, [
    "name",
    "first",
    "last",
    "count",
    "bytes",
    "sha256",
    "created_at",
    "priorities",
    "run_at",
    "gone",
  ]);
  const name = text(o.name, `${path}.name`);
  if (!SEGMENT_NAME.test(name)) fail(`${path}.name`, "not a segment object name");
  const sha256 = text(o.sha256, `${path}.sha256`);
  if (!/^[0-9a-f]{64}$/.test(sha256)) fail(`${path}.sha256`, "expected 64 lowercase hex digits");
  const first = integer(o.first, `${path}.first`);
  const last = integer(o.last, `${path}.last`, first);
  const count = integer(o.count, `${path}.count`, 1, last - first + 1);
  const gone = ranges(o.gone, `${path}.gone`);
  if (gone.length >= count) fail(`${path}.gone`, "a segment with nothing left must leave the index");
  for (const offset of gone)
    if (offset < first || offset > last) fail(`${path}.gone`, "offset outside the segment");
  return {
    name,
    first,
    last,
    count,
    bytes: integer(o.bytes, `${path}.bytes`, 1),
    sha256,
    createdAt: integer(o.created_at, `${path}.created_at`),
    priorities: pairOf(o.priorities, `${path}.priorities`, PRIORITY_MIN, PRIORITY_MAX),
    runAt: pairOf(o.run_at, `${path}.run_at`, 0, Number.MAX_SAFE_INTEGER),
    gone,
  };
}

function dedupSegmentRef(value: unknown, path: string): DedupSegmentRef {
  const o = object(value, path, [
    "name",
    "first",
    "last",
    "count",
    "bytes",
    "sha256",
    "created_at",
    "expires_at",
  ]);
  const name = text(o.name, `${path}.name`);
  if (!DEDUP_SEGMENT_NAME.test(name)) fail(`${path}.name`, "not a dedup segment object name");
  const sha256 = text(o.sha256, `${path}.sha256`);
  if (!/^[0-9a-f]{64}$/.test(sha256)) fail(`${path}.sha256`, "expected 64 lowercase hex digits");
  const first = integer(o.first, `${path}.first`);
  const last = integer(o.last, `${path}.last`, first);
  return {
    name,
    first,
    last,
    count: integer(o.count, `${path}.count`, 1, last - first + 1),
    bytes: integer(o.bytes, `${path}.bytes`, 1),
    sha256,
    createdAt: integer(o.created_at, `${path}.created_at`),
    expiresAt: integer(o.expires_at, `${path}.expires_at`),
  };
}

function deadLetterSegmentRef(value: unknown, path: string): DeadLetterSegmentRef {
  const o = object(value, path, ["name", "first", "last", "count", "bytes", "sha256", "created_at", "gone"]);
  const name = text(o.name, `${path}.name`);
  if (!DEAD_LETTER_SEGMENT_NAME.test(name)) fail(`${path}.name`, "not a dead-letter segment object name");
  const sha256 = text(o.sha256, `${path}.sha256`);
  if (!/^[0-9a-f]{64}$/.test(sha256)) fail(`${path}.sha256`, "expected 64 lowercase hex digits");
  const first = integer(o.first, `${path}.first`);
  const last = integer(o.last, `${path}.last`, first);
  const count = integer(o.count, `${path}.count`, 1, last - first + 1);
  const gone = ranges(o.gone, `${path}.gone`);
  if (gone.length >= count) fail(`${path}.gone`, "a segment with nothing left must leave the index");
  for (const position of gone) if (position >= count) fail(`${path}.gone`, "position outside the segment");
  return {
    name,
    first,
    last,
    count,
    bytes: integer(o.bytes, `${path}.bytes`, 1),
    sha256,
    createdAt: integer(o.created_at, `${path}.created_at`),
    gone,
  };
}

function deadLetter(v: unknown, p: string): DeadLetterRecord {
  const d = object(v, p, ["dead_at", "attempts", "reason", "message"]);
  return {
    deadAt: integer(d.dead_at, `${p}.dead_at`),
    attempts: integer(d.attempts, `${p}.attempts`),
    reason: text(d.reason, `${p}.reason`),
    message: message(d.message, `${p}.message`, false).msg,
  };
}

function dedupEntry(v: unknown, p: string): DedupEntry {
  const e = object(v, p, ["dedup_id", "id", "offset", "expires_at"]);
  return {
    dedupId: text(e.dedup_id, `${p}.dedup_id`, true),
    id: text(e.id, `${p}.id`, true),
    offset: integer(e.offset, `${p}.offset`),
    expiresAt: integer(e.expires_at, `${p}.expires_at`),
  };
}

function subscription(value: unknown, path: string, version: 1 | 2): ShardDocument["subscriptions"][number] {
  const o = object(
    value,
    path,
    ["name", "created_at", "acked_below", "acked", "deliveries", "dead_letters", "counters"],
    version === 2 ? ["dead_letter_segments"] : [],
  );
  const name = text(o.name, `${path}.name`, true);
  if (!/^[a-z0-9][a-z0-9._-]{0,127}$/.test(name)) fail(`${path}.name`, "not a valid subscription name");
  return {
    name,
    createdAt: integer(o.created_at, `${path}.created_at`),
    ackedBelow: integer(o.acked_below, `${path}.acked_below`),
    acked:
      version === 1
        ? array(o.acked, `${path}.acked`).map((v, i) => integer(v, `${path}.acked[${i}]`))
        : ranges(o.acked, `${path}.acked`),
    deliveries: array(o.deliveries, `${path}.deliveries`).map((v, i) => {
      const p = `${path}.deliveries[${i}]`;
      const d = object(v, p, ["offset", "attempts"], ["attempts_at_redrive", "available_at", "lease"]);
      return {
        offset: integer(d.offset, `${p}.offset`),
        attempt: integer(d.attempts, `${p}.attempts`),
        base: optional(d, "attempts_at_redrive", integer, p) ?? 0,
        availableAt: optional(d, "available_at", integer, p),
        lease: optional(d, "lease", lease, p),
      };
    }),
    deadLetters: array(o.dead_letters, `${path}.dead_letters`).map((v, i) =>
      deadLetter(v, `${path}.dead_letters[${i}]`),
    ),
    deadLetterSegments:
      o.dead_letter_segments === undefined
        ? []
        : array(o.dead_letter_segments, `${path}.dead_letter_segments`).map((v, i) =>
            deadLetterSegmentRef(v, `${path}.dead_letter_segments[${i}]`),
          ),
    counters: subscriptionCounters(o.counters, `${path}.counters`),
  };
}

/**
 * Parses and type-checks document bytes. Throws `CasqError("data_loss")`
 * for anything that is not a well-formed v1 shard document.
 */
export function parseShardDocument(bytes: Uint8Array): ShardDocument {
  let root: unknown;
  try {
    root = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (error) {
    throw new CasqError(
      "data_loss",
      `shard document is not valid UTF-8 JSON (${error instanceof Error ? error.message : String(error)}); it may be truncated or corrupt — refusing to load or overwrite it, restore it from a backup or move it aside`,
      {},
      { cause: error },
    );
  }
  const top = typeof root === "object" && root !== null && !Array.isArray(root) ? (root as Obj) : undefined;
  const format = top?.format;
  if (format !== SHARD_FORMAT && format !== SHARD_FORMAT_V1) {
    const newer = typeof format === "string" && format.startsWith("casq.shard.");
    throw new CasqError(
      "data_loss",
      newer
        ? `shard document has format ${json(format)}, this casq only understands ${SHARD_FORMAT_V1} and ${SHARD_FORMAT}: written by a newer casq? refusing to touch it — upgrade this broker`
        : `object is not a casq shard document (format ${json(format)}, expected ${SHARD_FORMAT}); refusing to load or overwrite it`,
    );
  }
  const version = format === SHARD_FORMAT ? 2 : 1;
  const queueHint = typeof top?.queue === "string" ? top.queue : "?";
  try {
    const o = object(
      root,
      "document",
      [
        "format",
        "queue",
        "shard",
        "created_at",
        "write_id",
        "broker",
        "next_offset",
        "config",
        "counters",
        "subscriptions",
        "dedup",
        ...(version === 2 ? ["segments"] : []),
        "messages",
      ],
      ["recent_write_ids", ...(version === 2 ? ["dedup_segments"] : [])],
    );
    let broker: BrokerRecord | undefined;
    if (o.broker !== null) {
      const b = object(o.broker, "document.broker", ["id", "address", "epoch", "lease_until"]);
      broker = {
        id: text(b.id, "document.broker.id"),
        address: text(b.address, "document.broker.address"),
        epoch: integer(b.epoch, "document.broker.epoch"),
        leaseUntil: integer(b.lease_until, "document.broker.lease_until"),
      };
    }
    const queue = text(o.queue, "document.queue", true);
    if (!/^[a-z0-9][a-z0-9._-]{0,127}$/.test(queue)) fail("document.queue", "not a valid queue name");
    const shardCounters = object(o.counters, "document.counters", [...SUB_COUNTERS, "dropped"]);
    return {
      version,
      queue,
      shard: integer(o.shard, "document.shard"),
      createdAt: integer(o.created_at, "document.created_at"),
      writeId: o.write_id === null ? undefined : text(o.write_id, "document.write_id"),
      recentWriteIds:
        o.recent_write_ids === undefined
          ? []
          : array(o.recent_write_ids, "document.recent_write_ids").map((v, i) =>
              text(v, `document.recent_write_ids[${i}]`),
            ),
      broker,
      nextOffset: integer(o.next_offset, "document.next_offset"),
      config: config(o.config, "document.config"),
      counters: {
        ...subscriptionCounters(shardCounters, "document.counters", ["dropped"]),
        dropped: integer(shardCounters.dropped, "document.counters.dropped"),
      },
      subscriptions: array(o.subscriptions, "document.subscriptions").map((v, i) =>
        subscription(v, `document.subscriptions[${i}]`, version),
      ),
      dedup: array(o.dedup, "document.dedup").map((v, i) => dedupEntry(v, `document.dedup[${i}]`)),
      messages: array(o.messages, "document.messages").map((v, i) =>
        message(v, `document.messages[${i}]`, true),
      ),
      segments:
        version === 2
          ? array(o.segments, "document.segments").map((v, i) => segmentRef(v, `document.segments[${i}]`))
          : [],
      dedupSegments:
        o.dedup_segments === undefined
          ? []
          : array(o.dedup_segments, "document.dedup_segments").map((v, i) =>
              dedupSegmentRef(v, `document.dedup_segments[${i}]`),
            ),
    };
  } catch (error) {
    if (!(error instanceof Corrupt)) throw error;
    throw new CasqError(
      "data_loss",
      `shard document of queue ${queueHint} is corrupt at ${error.message}; refusing to load or overwrite it — restore it from a backup or move it aside`,
      {},
      { cause: error },
    );
  }
}

/**
 * Parses a segment object's bytes (its checksum already verified by the
 * caller) and checks it against the head's index entry. Throws
 * `CasqError("data_loss")` when it is not the segment the head describes.
 */
export function parseSegmentDocument(
  bytes: Uint8Array,
  expect: { readonly queue: string; readonly shard: number; readonly ref: SegmentRef },
): MessageRecord[] {
  const where = `segment ${expect.ref.name} of queue ${expect.queue} shard ${expect.shard}`;
  try {
    let root: unknown;
    try {
      root = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
    } catch {
      fail("segment", "not valid UTF-8 JSON");
    }
    const o = object(root, "segment", ["format", "queue", "shard", "messages"]);
    if (o.format !== SEGMENT_FORMAT)
      fail("segment.format", `expected ${SEGMENT_FORMAT}, got ${json(o.format)}`);
    if (o.queue !== expect.queue || o.shard !== expect.shard) fail("segment", "belongs to another shard");
    const records = array(o.messages, "segment.messages").map(
      (v, i) => message(v, `segment.messages[${i}]`, false).msg,
    );
    const ref = expect.ref;
    if (records.length !== ref.count)
      fail("segment.messages", `holds ${records.length} messages, the head says ${ref.count}`);
    let previous = -1;
    for (const r of records) {
      if (r.offset <= previous) fail("segment.messages", "offsets are not strictly ascending");
      previous = r.offset;
    }
    if (records[0]?.offset !== ref.first || previous !== ref.last)
      fail("segment.messages", "offsets do not match the head's first/last");
    return records;
  } catch (error) {
    if (!(error instanceof Corrupt)) throw error;
    throw new CasqError(
      "data_loss",
      `${where} is corrupt at ${error.message}; refusing to load or overwrite the shard — restore the segment from a backup`,
      { queue: expect.queue, shard: expect.shard },
      { cause: error },
    );
  }
}

/**
 * Parses a dedup segment object's bytes (its checksum already verified by
 * the caller) and checks it against the head's index entry. Throws
 * `CasqError("data_loss")` when it is not the dedup segment the head describes.
 */
export function parseDedupSegmentDocument(
  bytes: Uint8Array,
  expect: { readonly queue: string; readonly shard: number; readonly ref: DedupSegmentRef },
): DedupEntry[] {
  const where = `dedup segment ${expect.ref.name} of queue ${expect.queue} shard ${expect.shard}`;
  try {
    let root: unknown;
    try {
      root = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
    } catch {
      fail("dedup_segment", "not valid UTF-8 JSON");
    }
    const o = object(root, "dedup_segment", ["format", "queue", "shard", "entries"]);
    if (o.format !== DEDUP_SEGMENT_FORMAT)
      fail("dedup_segment.format", `expected ${DEDUP_SEGMENT_FORMAT}, got ${json(o.format)}`);
    if (o.queue !== expect.queue || o.shard !== expect.shard)
      fail("dedup_segment", "belongs to another shard");
    const entries = array(o.entries, "dedup_segment.entries").map((v, i) =>
      dedupEntry(v, `dedup_segment.entries[${i}]`),
    );
    const ref = expect.ref;
    if (entries.length !== ref.count)
      fail("dedup_segment.entries", `holds ${entries.length} entries, the head says ${ref.count}`);
    let previous = -1;
    let latest = 0;
    for (const e of entries) {
      if (e.offset <= previous) fail("dedup_segment.entries", "offsets are not strictly ascending");
      previous = e.offset;
      latest = Math.max(latest, e.expiresAt);
    }
    if (entries[0]?.offset !== ref.first || previous !== ref.last)
      fail("dedup_segment.entries", "offsets do not match the head's first/last");
    if (latest !== ref.expiresAt)
      fail("dedup_segment.entries", "latest expires_at does not match the head's");
    return entries;
  } catch (error) {
    if (!(error instanceof Corrupt)) throw error;
    throw new CasqError(
      "data_loss",
      `${where} is corrupt at ${error.message}; refusing to load or overwrite the shard — restore the segment from a backup`,
      { queue: expect.queue, shard: expect.shard },
      { cause: error },
    );
  }
}

/**
 * Parses a dead-letter segment object's bytes (its checksum already
 * verified by the caller) and checks it against the head's index entry
 * under `subscription`. Throws `CasqError("data_loss")` when it is not the
 * dead-letter segment the head describes.
 */
export function parseDeadLetterSegmentDocument(
  bytes: Uint8Array,
  expect: {
    readonly queue: string;
    readonly shard: number;
    readonly subscription: string;
    readonly ref: DeadLetterSegmentRef;
  },
): DeadLetterRecord[] {
  const where = `dead-letter segment ${expect.ref.name} of queue ${expect.queue} shard ${expect.shard}`;
  try {
    let root: unknown;
    try {
      root = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
    } catch {
      fail("dead_letter_segment", "not valid UTF-8 JSON");
    }
    const o = object(root, "dead_letter_segment", [
      "format",
      "queue",
      "shard",
      "subscription",
      "dead_letters",
    ]);
    if (o.format !== DEAD_LETTER_SEGMENT_FORMAT)
      fail("dead_letter_segment.format", `expected ${DEAD_LETTER_SEGMENT_FORMAT}, got ${json(o.format)}`);
    if (o.queue !== expect.queue || o.shard !== expect.shard)
      fail("dead_letter_segment", "belongs to another shard");
    if (o.subscription !== expect.subscription)
      fail(
        "dead_letter_segment.subscription",
        `belongs to ${json(o.subscription)}, the head indexes it under ${json(expect.subscription)}`,
      );
    const letters = array(o.dead_letters, "dead_letter_segment.dead_letters").map((v, i) =>
      deadLetter(v, `dead_letter_segment.dead_letters[${i}]`),
    );
    const ref = expect.ref;
    if (letters.length !== ref.count)
      fail(
        "dead_letter_segment.dead_letters",
        `holds ${letters.length} dead letters, the head says ${ref.count}`,
      );
    const offsets = new Set<number>();
    let first = Number.POSITIVE_INFINITY;
    let last = Number.NEGATIVE_INFINITY;
    for (const dl of letters) {
      const offset = dl.message.offset;
      if (offsets.has(offset)) fail("dead_letter_segment.dead_letters", `offset ${offset} appears twice`);
      offsets.add(offset);
      first = Math.min(first, offset);
      last = Math.max(last, offset);
    }
    if (first !== ref.first || last !== ref.last)
      fail("dead_letter_segment.dead_letters", "offsets do not match the head's first/last");
    return letters;
  } catch (error) {
    if (!(error instanceof Corrupt)) throw error;
    throw new CasqError(
      "data_loss",
      `${where} is corrupt at ${error.message}; refusing to load or overwrite the shard — restore the segment from a backup`,
      { queue: expect.queue, shard: expect.shard },
      { cause: error },
    );
  }
}
