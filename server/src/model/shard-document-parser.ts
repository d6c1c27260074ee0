/**
 * The strict parser of shard documents: v1 (`"casq.shard.v1"`, the whole
 * shard in one document) and the v2 head (`"casq.shard.v2"`, see
 * `head-encoder.ts`), into a {@link ShardDocument} whose cross-references
 * `ShardState.decode` then checks. See `docs/document-format.md` for every
 * field; `segment-parser.ts` reads the segment objects the head indexes.
 *
 * Strict: a document that is not UTF-8 JSON, has an unknown format version,
 * a missing or unknown field, or a value of the wrong type or range is
 * refused with `CasqError("data_loss")`. Compatibility rule: casq never
 * writes over a document it cannot fully read; a newer format gets a new
 * version string, and an older casq refuses it instead of downgrading it.
 */
import { CasqError } from "../errors.ts";
import { SHARD_FORMAT, SHARD_FORMAT_V1 } from "./document-formats.ts";
import { PRIORITY_MAX, PRIORITY_MIN } from "./input-validation.ts";
import { type BackoffPolicy, configProblem, type QueueConfig } from "./queue-config.ts";
import { deadLetter, dedupEntry, message } from "./record-parser.ts";
import type {
  BrokerRecord,
  DeadLetterRecord,
  DedupEntry,
  Lease,
  MessageRecord,
  ShardCounters,
  SubscriptionCounters,
} from "./shard-records.ts";
import {
  array,
  Corrupt,
  decodeJson,
  fail,
  finite,
  integer,
  type Obj,
  object,
  optional,
  text,
} from "./strict-json.ts";

const json = JSON.stringify;

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
  /** v2: the sealed segments the head lists itself, ascending offsets (empty for v1); the others are in index segments. */
  readonly segments: readonly SegmentRef[];
  /** v2: the index segments, ascending offsets (empty for v1, and when absent). */
  readonly indexSegments: readonly IndexSegmentRef[];
  /** v2: the sealed dedup segments, ascending offsets (empty for v1, and when absent). */
  readonly dedupSegments: readonly DedupSegmentRef[];
}

/**
 * What a v2 head's entry says of any immutable object it references: its
 * name under the shard's `seg/` prefix, its offset range (`first`, `last`),
 * how many entries it holds, and its size and SHA-256 (checked on every read).
 */
export interface ObjectRef {
  readonly name: string;
  readonly first: number;
  readonly last: number;
  readonly count: number;
  readonly bytes: number;
  readonly sha256: string;
  readonly createdAt: number;
}

/**
 * A sealed dead-letter segment as its subscription in the v2 head indexes
 * it (`first` / `last`: the lowest and highest message offset among its
 * dead letters).
 */
export interface DeadLetterSegmentRef extends ObjectRef {
  /** Positions (0-based, in the object's order) of its dead letters that left, ascending. */
  readonly gone: readonly number[];
}

/** A sealed dedup segment as the v2 head indexes it. */
export interface DedupSegmentRef extends ObjectRef {
  /** Latest `expires_at` of its entries. */
  readonly expiresAt: number;
}

/**
 * An index segment as the v2 head references it: an object listing the
 * index entries of `count` sealed segments (`first`: its first segment's,
 * `last`: its last segment's).
 */
export type IndexSegmentRef = ObjectRef;

/** A sealed segment as the v2 head indexes it. */
export interface SegmentRef extends ObjectRef {
  readonly priorities: readonly [number, number];
  readonly runAt: readonly [number, number];
  /** Offsets no longer in it, ascending. */
  readonly gone: readonly number[];
}

/** Segment object names: `<first offset, 20 digits>-<epoch>-<sequence>.json`. */
export const SEGMENT_NAME = /^[0-9]{20}-[0-9]{1,15}-[0-9a-z]{1,32}\.json$/;

/** Dedup segment object names: `<first offset, 20 digits>-<epoch>-<sequence>.dedup.json`. */
export const DEDUP_SEGMENT_NAME = /^[0-9]{20}-[0-9]{1,15}-[0-9a-z]{1,32}\.dedup\.json$/;

/** Index segment object names: `<first offset, 20 digits>-<epoch>-<sequence>.index.json`. */
export const INDEX_SEGMENT_NAME = /^[0-9]{20}-[0-9]{1,15}-[0-9a-z]{1,32}\.index\.json$/;

/** Dead-letter segment object names: `<lowest offset, 20 digits>-<epoch>-<sequence>.dead.json`. */
export const DEAD_LETTER_SEGMENT_NAME = /^[0-9]{20}-[0-9]{1,15}-[0-9a-z]{1,32}\.dead\.json$/;

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

/** The fields of {@link ObjectRef} in a head's entry. */
const OBJECT_REF_FIELDS = ["name", "first", "last", "count", "bytes", "sha256", "created_at"];

/** Parses one index entry of a sealed segment (in a head's `segments` or an index segment's). */
export function segmentRef(value: unknown, path: string): SegmentRef {
  const o = object(value, path, [...OBJECT_REF_FIELDS, "priorities", "run_at", "gone"]);
  const ref = objectRefFields(o, path, SEGMENT_NAME, "a segment");
  const gone = ranges(o.gone, `${path}.gone`);
  if (gone.length >= ref.count) fail(`${path}.gone`, "a segment with nothing left must leave the index");
  for (const offset of gone)
    if (offset < ref.first || offset > ref.last) fail(`${path}.gone`, "offset outside the segment");
  return {
    ...ref,
    priorities: pairOf(o.priorities, `${path}.priorities`, PRIORITY_MIN, PRIORITY_MAX),
    runAt: pairOf(o.run_at, `${path}.run_at`, 0, Number.MAX_SAFE_INTEGER),
    gone,
  };
}

/**
 * The fields every index entry of an immutable object has (name, offsets,
 * count, size, checksum, creation time), from `o`, whose name must match
 * `pattern` (an object of kind `kind`).
 */
function objectRefFields(o: Obj, path: string, pattern: RegExp, kind: string): ObjectRef {
  const name = text(o.name, `${path}.name`);
  if (!pattern.test(name)) fail(`${path}.name`, `not ${kind} object name`);
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
  };
}

function indexSegmentRef(value: unknown, path: string): IndexSegmentRef {
  const o = object(value, path, OBJECT_REF_FIELDS);
  return objectRefFields(o, path, INDEX_SEGMENT_NAME, "an index segment");
}

/** A head's `index_segments`: omitted when empty (canonical), so an empty list is refused. */
function indexSegmentRefs(value: unknown): IndexSegmentRef[] {
  const refs = array(value, "document.index_segments").map((v, i) =>
    indexSegmentRef(v, `document.index_segments[${i}]`),
  );
  if (refs.length === 0) fail("document.index_segments", "an empty list must be omitted");
  return refs;
}

function dedupSegmentRef(value: unknown, path: string): DedupSegmentRef {
  const o = object(value, path, [...OBJECT_REF_FIELDS, "expires_at"]);
  return {
    ...objectRefFields(o, path, DEDUP_SEGMENT_NAME, "a dedup segment"),
    expiresAt: integer(o.expires_at, `${path}.expires_at`),
  };
}

function deadLetterSegmentRef(value: unknown, path: string): DeadLetterSegmentRef {
  const o = object(value, path, [...OBJECT_REF_FIELDS, "gone"]);
  const ref = objectRefFields(o, path, DEAD_LETTER_SEGMENT_NAME, "a dead-letter segment");
  const gone = ranges(o.gone, `${path}.gone`);
  if (gone.length >= ref.count) fail(`${path}.gone`, "a segment with nothing left must leave the index");
  for (const position of gone)
    if (position >= ref.count) fail(`${path}.gone`, "position outside the segment");
  return { ...ref, gone };
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
 * for anything that is not a well-formed v1 document or v2 head.
 */
export function parseShardDocument(bytes: Uint8Array): ShardDocument {
  let root: unknown;
  try {
    root = decodeJson(bytes);
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
      ["recent_write_ids", ...(version === 2 ? ["dedup_segments", "index_segments"] : [])],
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
      indexSegments: o.index_segments === undefined ? [] : indexSegmentRefs(o.index_segments),
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
