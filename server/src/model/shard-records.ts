/**
 * The in-memory records a shard is made of (model-internal).
 *
 * Message contents ({@link MessageRecord}) are immutable once enqueued and
 * shared between the retained message and any dead-letter copies; only the
 * small per-subscription delivery state changes. Which subscriptions still
 * owe work on a message is derived from the subscription's ack state (start
 * offset + settled set) or, for a message that was redriven, from its explicit
 * `targets` list. See `docs/document-format.md` for how this is persisted.
 */
import type { BinaryHeap } from "./binary-heap.ts";
import type { DedupChunk } from "./dedup-chunk.ts";

export type { DedupEntry } from "./dedup-chunk.ts";

/** The broker that leads a shard, as recorded in the document. */
export interface BrokerRecord {
  /** Unique id of the broker process. */
  readonly id: string;
  /** Where clients reach it (host:port), for redirects. */
  readonly address: string;
  /** Leadership epoch; a takeover writes a higher one. */
  readonly epoch: number;
  /** Leadership is valid until this time (ms since epoch) unless renewed. */
  readonly leaseUntil: number;
}

/**
 * What the leader needs of a message to order, lease and settle it: every
 * immutable field except its body. A sealed message whose segment is paged
 * out is held as just this (see {@link MessageBody}).
 */
export interface MessageMeta {
  readonly id: string;
  readonly offset: number;
  readonly key: string | undefined;
  readonly priority: number;
  /** >= enqueuedAt. */
  readonly runAt: number;
  readonly maxAttempts: number | undefined;
  readonly dedupId: string | undefined;
  readonly enqueuedAt: number;
}

/**
 * The bulky part of a message: what workers receive and nothing in the
 * broker's decisions reads. A sealed message's body lives in its segment
 * object and is paged in (`segment-bodies.ts`) when a claim, a dead letter
 * or a read needs it.
 */
export interface MessageBody {
  readonly payload: Uint8Array;
  /** Null-prototype object, keys sorted. */
  readonly headers: Readonly<Record<string, string>>;
  readonly traceContext: Readonly<Record<string, string>> | undefined;
}

/** The immutable content of a message: its meta and its body. */
export interface MessageRecord extends MessageMeta, MessageBody {}

/** True when `m` carries its body (a whole record, not meta only). */
export function hasBody(m: MessageMeta): m is MessageRecord {
  return (m as Partial<MessageRecord>).payload !== undefined;
}

/** The meta of `m`, without its body (a new object; `m` itself when it has none). */
export function metaOf(m: MessageMeta): MessageMeta {
  if (!hasBody(m)) return m;
  return {
    id: m.id,
    offset: m.offset,
    key: m.key,
    priority: m.priority,
    runAt: m.runAt,
    maxAttempts: m.maxAttempts,
    dedupId: m.dedupId,
    enqueuedAt: m.enqueuedAt,
  };
}

/** A message still in the shard. */
export interface RetainedMessage {
  /**
   * Its contents: a whole record while it lives in the head's tail; meta
   * only once sealed (the body is in its segment, see `segment-bodies.ts`).
   */
  msg: MessageMeta;
  /**
   * Undefined for an ordinary message (every subscription decides by its ack
   * state). After a redrive: exactly the subscriptions that still owe work on
   * it, sorted; a subscription is removed when it settles the message.
   */
  targets: string[] | undefined;
  /** Index: number of subscriptions that have not settled it. 0 = may leave the shard once retention passed. */
  pending: number;
  /** Index: estimated encoded size (of the whole record; 0 while sealed and not known). */
  bytes: number;
  /** The sealed segment holding its contents (format v2), or undefined while it lives in the head's tail. */
  segment: SegmentState | undefined;
}

/** What the broker wrote for a new segment (message, index, dedup or dead-letter segment). */
export interface SealedObject {
  readonly name: string;
  readonly bytes: number;
  readonly sha256: string;
  readonly createdAt: number;
}

/**
 * A sealed segment of the shard (format v2): an immutable object in the
 * store holding `count` messages between `first` and `last`, indexed by the
 * head. The meta of its messages is in memory (`records`, shared with the
 * retained messages) while the shard is loaded; their bodies are paged in
 * and out by the broker (`segment-bodies.ts`).
 */
export interface SegmentState {
  /** Object name under the shard's `seg/` prefix, e.g. `00000000000000000000-3-17.json`. */
  readonly name: string;
  readonly first: number;
  readonly last: number;
  readonly count: number;
  /** Size of the object in bytes. */
  readonly bytes: number;
  /** SHA-256 of the object's bytes, lowercase hex. */
  readonly sha256: string;
  readonly createdAt: number;
  /** Lowest and highest priority among its messages. */
  readonly priorities: readonly [number, number];
  /** Earliest and latest `run_at` among its messages. */
  readonly runAt: readonly [number, number];
  /** Offsets of its messages no longer in it: dropped from the shard, or moved back to the head's tail by a redrive. */
  readonly gone: Set<number>;
  /**
   * The meta of the segment's messages, by offset order (immutable; shared
   * with the retained messages). Empty while the segment is {@link cold}.
   */
  records: readonly MessageMeta[];
  /**
   * True while none of its messages is in memory (`cold-segments.ts`): every
   * subscription either owes all of them, untouched, or none; claims meet a
   * placeholder of the whole segment instead.
   */
  cold: boolean;
  /**
   * While cold after being cooled: the highest priority and the `run_at`
   * range of the messages still in it (its placeholder sorts by these, not
   * by those of messages already gone). Undefined otherwise (a segment
   * decoded cold uses {@link priorities} and {@link runAt}).
   */
  liveSummary: { readonly priority: number; readonly runAt: readonly [number, number] } | undefined;
  /** Index: cached JSON of the head's index entry; undefined after `gone` changed. */
  json: string | undefined;
  /**
   * The index segment that lists this segment's entry (`index-segments.ts`),
   * or undefined while the head lists it itself. Its entry there is the one
   * {@link json} gives: a change to the entry dissolves the index segment.
   */
  index: IndexSegmentState | undefined;
}

/**
 * A sealed *index segment* (format v2): an immutable object in the store
 * holding the index entries of `segments.length` sealed segments nothing
 * has touched, so the head carries one small entry for all of them
 * (`index-segments.ts`).
 */
export interface IndexSegmentState {
  /** Object name under the shard's `seg/` prefix, e.g. `00000000000000000000-3-17.index.json`. */
  readonly name: string;
  /** `first` of its first segment. */
  readonly first: number;
  /** `last` of its last segment. */
  readonly last: number;
  /** The segments it lists, ascending offsets. */
  readonly segments: readonly SegmentState[];
  /** Size of the object in bytes. */
  readonly bytes: number;
  /** SHA-256 of the object's bytes, lowercase hex. */
  readonly sha256: string;
  readonly createdAt: number;
  /** Index: cached JSON of the head's entry (immutable). */
  json: string | undefined;
}

/**
 * A sealed dedup segment (format v2): an immutable object in the store
 * holding `count` dedup entries whose message offsets lie between `first`
 * and `last`, indexed by the head. Its entries are in memory too while the
 * shard is loaded, unless every one of them had expired when the head was
 * read (then it is not read at all and waits to be retired).
 */
export interface DedupSegmentState {
  /** Object name under the shard's `seg/` prefix, e.g. `00000000000000000000-3-17.dedup.json`. */
  readonly name: string;
  /** Lowest message offset among its entries. */
  readonly first: number;
  /** Highest message offset among its entries. */
  readonly last: number;
  readonly count: number;
  /** Size of the object in bytes. */
  readonly bytes: number;
  /** SHA-256 of the object's bytes, lowercase hex. */
  readonly sha256: string;
  readonly createdAt: number;
  /** Latest `expires_at` among its entries: from then on it remembers nothing and is retired. */
  readonly expiresAt: number;
  /** Its entries (ascending offsets, compact), or undefined when not loaded because all had expired. */
  readonly chunk: DedupChunk | undefined;
  /** Index: cached JSON of the head's index entry. */
  json: string | undefined;
}

/** Dedup-segment retirement index entry. */
export interface DedupSegmentExpiry {
  readonly expiresAt: number;
  readonly name: string;
}

/** A worker's hold on one delivery. */
export interface Lease {
  readonly worker: string;
  readonly claimedAt: number;
  readonly deadline: number;
  /** The TTL the lease was claimed with; heartbeats extend by it. */
  readonly ttlMs: number;
}

/** Delivery state of one unsettled message in one subscription (absent until first claimed or redriven). */
export interface Delivery {
  /** Deliveries made so far (the current receipt's attempt). Never decreases. */
  attempt: number;
  /** Value of `attempt` at the last redrive (0 if never): failures that count = attempt - base. */
  base: number;
  /** Not runnable before this time (set by nack backoff). */
  availableAt: number | undefined;
  lease: Lease | undefined;
}

/** A dead letter's stored contents (head and dead-letter segment alike). */
export interface DeadLetterRecord {
  readonly message: MessageRecord;
  readonly reason: string;
  /** Deliveries made when it died. */
  readonly attempts: number;
  readonly deadAt: number;
}

/** A dead-lettered message with why and when. */
export interface DeadLetter extends DeadLetterRecord {
  /** Index: estimated encoded size. */
  readonly bytes: number;
  /** The sealed dead-letter segment holding it (format v2), or undefined while the head carries it. */
  segment: DeadLetterSegmentState | undefined;
  /** Its position (0-based) among that segment's entries. */
  position: number;
}

/**
 * A sealed dead-letter segment (format v2): an immutable object holding
 * `count` dead letters of one subscription, in the order they died, indexed
 * by that subscription in the head. Its live dead letters are in memory
 * (the subscription's `dead` map) while the shard is loaded.
 */
export interface DeadLetterSegmentState {
  /** Object name under the shard's `seg/` prefix, e.g. `00000000000000000000-3-17.dead.json`. */
  readonly name: string;
  /** Lowest message offset among its dead letters. */
  readonly first: number;
  /** Highest message offset among its dead letters. */
  readonly last: number;
  readonly count: number;
  /** Size of the object in bytes. */
  readonly bytes: number;
  /** SHA-256 of the object's bytes, lowercase hex. */
  readonly sha256: string;
  readonly createdAt: number;
  /** Positions of its dead letters that left (redriven, purged, evicted). */
  readonly gone: Set<number>;
  /** What the object holds, in its order (immutable; gone ones included). */
  readonly records: readonly DeadLetterRecord[];
  /** Index: cached JSON of the head's index entry; undefined after `gone` changed. */
  json: string | undefined;
}

/** Monotonic counters of a subscription. */
export interface SubscriptionCounters {
  /** Messages that became pending for it (enqueued while it existed, or backfilled by "earliest"). */
  enqueued: number;
  /** Deliveries (claims). */
  delivered: number;
  acked: number;
  /** Failed deliveries given another try (lease expiries + nacks). */
  redelivered: number;
  deadLettered: number;
  deadEvicted: number;
  /** Messages settled by purge. */
  purged: number;
  redriven: number;
}

/** Monotonic counters of a shard (sums over subscriptions, plus shard-level events). */
export interface ShardCounters extends SubscriptionCounters {
  /** Messages removed from the document (settled everywhere and past retention, or purged). */
  dropped: number;
}

/** Zeroed subscription counters. */
export function zeroSubscriptionCounters(): SubscriptionCounters {
  return {
    enqueued: 0,
    delivered: 0,
    acked: 0,
    redelivered: 0,
    deadLettered: 0,
    deadEvicted: 0,
    purged: 0,
    redriven: 0,
  };
}

/** Zeroed shard counters. */
export function zeroShardCounters(): ShardCounters {
  return { ...zeroSubscriptionCounters(), dropped: 0 };
}

/**
 * Runnable-index entry: higher priority first, then lower offset. With
 * `cold`, a placeholder for a cold segment's messages (its highest priority,
 * its first offset: it sorts before each of them).
 */
export interface ReadyEntry {
  readonly priority: number;
  readonly offset: number;
  readonly cold?: SegmentState | undefined;
}

/** Wake-up entry: message `offset` becomes runnable at `at` (with `cold`: a cold segment's earliest `run_at`). */
export interface DelayedEntry {
  readonly at: number;
  readonly offset: number;
  readonly cold?: SegmentState | undefined;
}

/** One subscription (consumer group). */
export interface SubscriptionState {
  readonly name: string;
  readonly createdAt: number;
  /** Untargeted messages below this offset are settled for it (moves up as settled offsets are compacted). */
  start: number;
  /** Offsets >= start of retained untargeted messages it has settled (acked, dead-lettered or purged). */
  readonly settled: Set<number>;
  /** Delivery state of unsettled messages it has claimed (or had redriven). */
  readonly deliveries: Map<number, Delivery>;
  /** Dead letters by offset, in insertion order (oldest first), wherever they are stored (head or dead-letter segment). */
  readonly dead: Map<number, DeadLetter>;
  /** The dead letters the head itself carries, by offset, oldest first (all newer than the sealed ones). */
  readonly headDead: Map<number, DeadLetter>;
  /** Estimated encoded bytes of `headDead`. */
  headDeadBytes: number;
  /** Sealed dead-letter segments this subscription indexes, by name, oldest first. */
  readonly deadSegments: Map<string, DeadLetterSegmentState>;
  readonly counters: SubscriptionCounters;
  /** Index: runnable candidates (lazy deletion). */
  readonly ready: BinaryHeap<ReadyEntry>;
  /** Index: candidates becoming runnable later (lazy deletion). */
  readonly delayed: BinaryHeap<DelayedEntry>;
}

/** Lease-deadline index entry. */
export interface LeaseEntry {
  readonly deadline: number;
  readonly sub: SubscriptionState;
  readonly offset: number;
  readonly attempt: number;
}

/** Dedup-expiry index entry. */
export interface DedupExpiryEntry {
  readonly expiresAt: number;
  readonly dedupId: string;
}
