/**
 * The in-memory state of one queue shard: the whole JSON document, plus
 * indexes that make every operation cheap.
 *
 * In plain words: a shard is one object in the store. The leading broker
 * keeps it in memory as a `ShardState`, applies each batch of operations to
 * it (`applyOperation`, which mutates in place), then writes `encode()` back
 * with a CAS. A broker that takes the shard over, or re-reads it after an
 * ambiguous write, rebuilds it with `ShardState.decode()`.
 *
 * Costs: operations touch only what they name (maps by offset and id, a
 * priority heap of runnable messages and a heap of wake-up times per
 * subscription, a heap of lease deadlines, of dedup expiries and of
 * retention drops), so a claim or an ack is O(log n), not O(queue).
 * `encode()` is O(document) (message JSON fragments are cached, since
 * message contents never change). `decode()` is O(n log n).
 *
 * Members marked `@internal` belong to the model's operation modules; code
 * outside `server/src/model` reads a shard only through this class's public
 * members, `shard-stats.ts` and operation results.
 */
import { CasqError, quoteValue } from "../errors.ts";
import { DOCUMENT_BASE_BYTES, messageBytes, SETTLED_SLOT_BYTES } from "./approx-size.ts";
import { BinaryHeap } from "./binary-heap.ts";
import { insertColdSegment } from "./cold-segment-index.ts";
import {
  coldSegmentFromRef,
  coolableRefs,
  liveCount,
  owingSubscriptions,
  pushPlaceholder,
} from "./cold-segments.ts";
import {
  addDeadLetterSegment,
  addHeadDeadLetter,
  addSealedDeadLetter,
  newDeadLetterSegmentState,
} from "./dead-letter-segments.ts";
import { DedupChunk, type DedupEntries } from "./dedup-chunk.ts";
import { addDedupSegment, newDedupSegmentState, putDedup, putSealedDedup } from "./dedup-segments.ts";
import { encodeHead } from "./head-encoder.ts";
import { sealedSegmentRefs, segmentRefOf } from "./index-segment-refs.ts";
import { addIndexSegment, newIndexSegmentState } from "./index-segments.ts";
import {
  DEFAULT_QUEUE_CONFIG,
  mergeConfig,
  type QueueConfig,
  type QueueConfigPatch,
} from "./queue-config.ts";
import { RememberedDedup, SealedDedup } from "./sealed-dedup.ts";
import { addSegment, newSegmentState } from "./segment-mechanics.ts";
import type { BodyLookup, ShardData } from "./shard-data.ts";
import {
  type DeadLetterSegmentRef,
  type DedupSegmentRef,
  type IndexSegmentRef,
  parseShardDocument,
  type SegmentRef,
  type ShardDocument,
} from "./shard-document-parser.ts";
import {
  addDelivery,
  addSubscription,
  delayedBefore,
  indexLease,
  isSettled,
  newSubscription,
  schedule,
} from "./shard-mechanics.ts";
import {
  type BrokerRecord,
  type DeadLetterRecord,
  type DedupEntry,
  type DedupExpiryEntry,
  type DedupSegmentExpiry,
  type DedupSegmentState,
  type DelayedEntry,
  type IndexSegmentState,
  type LeaseEntry,
  type MessageMeta,
  type MessageRecord,
  type RetainedMessage,
  type SegmentState,
  type ShardCounters,
  type SubscriptionState,
  zeroShardCounters,
} from "./shard-records.ts";
import { encodeShardV1 } from "./v1-document-encoder.ts";

export type { BrokerRecord } from "./shard-records.ts";

/**
 * Gives a v2 decode the messages of a segment the head references
 * (undefined: not available): whole records, or just their meta when the
 * caller pages bodies in on demand.
 */
export type SegmentLookup = (ref: SegmentRef) => readonly MessageMeta[] | undefined;

const NO_SEGMENTS: SegmentLookup = () => undefined;

const NO_BODIES: BodyLookup = () => undefined;

/** Gives a v2 decode the entries of a dedup segment the head references (undefined: not loaded). */
export type DedupSegmentLookup = (ref: DedupSegmentRef) => DedupEntries | undefined;

/** Gives a v2 decode the dead letters of a dead-letter segment that `subscription` indexes (undefined: not available). */
export type DeadLetterSegmentLookup = (
  ref: DeadLetterSegmentRef,
  subscription: string,
) => readonly DeadLetterRecord[] | undefined;

/** Gives a v2 decode the index entries an index segment the head references lists (undefined: not loaded). */
export type IndexSegmentLookup = (ref: IndexSegmentRef) => readonly SegmentRef[] | undefined;

/** What {@link ShardState.decode} checks and where it finds a v2 head's segments. */
export interface DecodeOptions {
  /** The key the document was read from: a document naming another queue or shard is refused. */
  readonly expected?: { readonly queue: string; readonly shard: number } | undefined;
  /** The contents of the segments a v2 head references (default: none). */
  readonly segments?: SegmentLookup | undefined;
  /** The entries of the index segments a v2 head references (default: none; a referenced one must be given). */
  readonly indexSegments?: IndexSegmentLookup | undefined;
  /**
   * Lets a segment that `segments` does not give be cold (`cold-segments.ts`)
   * when the head allows it, instead of refusing the document (default: false).
   */
  readonly cold?: boolean | undefined;
  /**
   * The entries of the dedup segments a v2 head references (default: none).
   * A dedup segment it does not give is taken as expired: nothing in it is remembered.
   */
  readonly dedupSegments?: DedupSegmentLookup | undefined;
  /** The dead letters of the dead-letter segments a v2 head references (default: none; a referenced one must be given). */
  readonly deadLetterSegments?: DeadLetterSegmentLookup | undefined;
  /**
   * The reader's time: with it, a dedup segment that is not given although
   * its `expires_at` is later refuses the document (its ids would be forgotten early).
   */
  readonly now?: number | undefined;
}

/**
 * Throws `CasqError("data_loss")` when `doc`, read from the key of
 * `expected`, names another queue or shard (a copy put in the wrong place).
 * Loaders call it before reading a head's segments, so that a misplaced head
 * is refused for what it is, not for segments under another shard's prefix.
 */
export function checkDocumentPlace(
  doc: Pick<ShardDocument, "queue" | "shard">,
  expected: { readonly queue: string; readonly shard: number },
): void {
  if (doc.queue === expected.queue && doc.shard === expected.shard) return;
  throw new CasqError(
    "data_loss",
    `shard document stored as queue ${expected.queue} shard ${expected.shard} says it is queue ${doc.queue} shard ${doc.shard} (copied or moved to the wrong key?); refusing to load or overwrite it — put the right document back, or replace it with \`casq repair ${expected.queue} --shard ${expected.shard}\``,
    { queue: expected.queue, shard: expected.shard },
  );
}

/** Queue (and subscription) names: `[a-z0-9][a-z0-9._-]{0,127}`. */
export const NAME_PATTERN = /^[a-z0-9][a-z0-9._-]{0,127}$/;

/** The subscription every new queue shard has. */
export const DEFAULT_SUBSCRIPTION = "default";

/** How many earlier write ids a document keeps besides the latest (see {@link ShardState.recentWriteIds}). */
export const WRITE_HISTORY = 16;

/** Throws `invalid_argument` unless `name` is a valid queue/subscription name. */
export function validateName(what: "queue" | "subscription", name: unknown): asserts name is string {
  if (typeof name !== "string" || !NAME_PATTERN.test(name)) {
    throw new CasqError(
      "invalid_argument",
      `${what} name ${quoteValue(name)} is invalid: use 1-128 characters of a-z 0-9 . _ - starting with a letter or digit`,
    );
  }
}

function leaseBefore(a: LeaseEntry, b: LeaseEntry): boolean {
  if (a.deadline !== b.deadline) return a.deadline < b.deadline;
  if (a.sub.name !== b.sub.name) return a.sub.name < b.sub.name;
  if (a.offset !== b.offset) return a.offset < b.offset;
  return a.attempt < b.attempt;
}

function dedupBefore(a: DedupExpiryEntry, b: DedupExpiryEntry): boolean {
  return a.expiresAt !== b.expiresAt ? a.expiresAt < b.expiresAt : a.dedupId < b.dedupId;
}

function dedupSegmentBefore(a: DedupSegmentExpiry, b: DedupSegmentExpiry): boolean {
  return a.expiresAt !== b.expiresAt ? a.expiresAt < b.expiresAt : a.name < b.name;
}

/** One queue shard's complete state (see module header). */
export class ShardState implements ShardData {
  /** Queue name. */
  readonly queue: string;
  /** Shard number within the queue. */
  readonly shard: number;
  /** Set by the broker to a fresh unique id before each write ({@link recordWrite}); on re-read it tells whether an ambiguous write landed. */
  writeId: string | undefined = undefined;
  /**
   * The write ids before {@link writeId}, oldest first, at most
   * {@link WRITE_HISTORY}: a broker whose write timed out can still find it
   * after other brokers wrote on top of it.
   */
  recentWriteIds: string[] = [];
  /** The leading broker, as recorded in the document. */
  broker: BrokerRecord | undefined = undefined;

  /** @internal When the shard was created (ms). */
  readonly createdAt: number;
  /** @internal The config in force; read it through {@link ShardState.config}. */
  cfg: QueueConfig;
  /** @internal Next offset to assign. */
  next = 0;
  /** @internal Retained messages by offset. */
  readonly messages = new Map<number, RetainedMessage>();
  /** @internal False when `messages` is not in ascending offset order (after a redrive re-inserted one). */
  messagesSorted = true;
  /** @internal Offset of each retained message by id. */
  readonly ids = new Map<string, number>();
  /** @internal Subscriptions by name. */
  readonly subs = new Map<string, SubscriptionState>();
  /** @internal The dedup ids the head itself carries, in ascending offset order (the rest are in dedup segments). */
  readonly recentDedup = new Map<string, DedupEntry>();
  /** @internal The live entries of the dedup segments, by dedup id (compact: `sealed-dedup.ts`). */
  readonly sealedDedup = new SealedDedup();
  /** @internal Remembered dedup ids, wherever they are stored (head or dedup segment). */
  readonly dedup = new RememberedDedup(this.recentDedup, this.sealedDedup);
  /** @internal Estimated encoded bytes of `recentDedup` (the broker seals it when it outgrows its budget). */
  recentDedupBytes = 0;
  /** @internal Sealed dedup segments the head indexes, by name, in ascending offset order. */
  readonly dedupSegments = new Map<string, DedupSegmentState>();
  /** @internal When each dedup segment stops remembering anything, for retirement. */
  readonly dedupSegmentIndex = new BinaryHeap<DedupSegmentExpiry>(dedupSegmentBefore);
  /** @internal Monotonic shard counters. */
  readonly counters: ShardCounters = zeroShardCounters();
  /** @internal Lease deadlines, for the expiry sweep. */
  readonly leaseIndex = new BinaryHeap<LeaseEntry>(leaseBefore);
  /** @internal Expiries of the head's own dedup ids (the sealed ones expire in `sealedDedup`). */
  readonly dedupIndex = new BinaryHeap<DedupExpiryEntry>(dedupBefore);
  /** @internal Retention drop times of fully settled messages. */
  readonly retentionIndex = new BinaryHeap<DelayedEntry>(delayedBefore);
  /** @internal Messages whose contents live in the head (format v2), by offset. */
  readonly tail = new Map<number, RetainedMessage>();
  /** @internal False when `tail` is not in ascending offset order (after a redrive put one back). */
  tailSorted = true;
  /** @internal Highest offset ever added to `tail` (to notice out-of-order additions). */
  tailLastOffset: number | undefined = undefined;
  /** @internal Estimated encoded bytes of the tail's messages. */
  tailBytes = 0;
  /** @internal Sealed segments the head indexes, by name, in ascending offset order. */
  readonly segments = new Map<string, SegmentState>();
  /** @internal Index segments the head references, by name (see `index-segments.ts`). */
  readonly indexSegments = new Map<string, IndexSegmentState>();
  /** @internal The cold segments (see `cold-segments.ts`), ascending offsets. */
  readonly coldSegments: SegmentState[] = [];
  /** @internal Messages of the cold segments. */
  coldMessages = 0;
  /** @internal Segments retired (all their messages gone) since the state was loaded; the broker deletes their objects once a head without them has landed. */
  readonly retiredSegments: string[] = [];
  /** @internal Estimated encoded bytes of the dead letters the head itself carries, all subscriptions (the broker seals them past a budget). */
  headDeadBytes = 0;
  /** @internal Running size estimate of the head (without write id, broker and settled slots). */
  bytes = DOCUMENT_BASE_BYTES;
  /** @internal Sum over retained messages of (subscriptions - pending): see `SETTLED_SLOT_BYTES`. */
  settledSlots = 0;
  /**
   * Where operations find the body of a sealed message whose retained copy
   * is meta only: the broker's page cache of segment bodies (set by the
   * broker; by default nothing is paged in).
   */
  bodies: BodyLookup = NO_BODIES;

  /** @internal Use {@link ShardState.create} or {@link ShardState.decode}. */
  constructor(init: { queue: string; shard: number; createdAt: number; config: QueueConfig }) {
    this.queue = init.queue;
    this.shard = init.shard;
    this.createdAt = init.createdAt;
    this.cfg = init.config;
  }

  /**
   * A new, empty shard with the `default` subscription. Throws
   * `invalid_argument` for a bad queue name, shard number or config.
   */
  static create(params: {
    queue: string;
    shard: number;
    config?: QueueConfigPatch;
    now: number;
  }): ShardState {
    validateName("queue", params.queue);
    if (!Number.isSafeInteger(params.shard) || params.shard < 0) {
      throw new CasqError("invalid_argument", `shard must be a non-negative integer, got ${params.shard}`);
    }
    checkNow(params.now);
    const config = mergeConfig(DEFAULT_QUEUE_CONFIG, params.config ?? {});
    const state = new ShardState({ queue: params.queue, shard: params.shard, createdAt: params.now, config });
    addSubscription(state, newSubscription(DEFAULT_SUBSCRIPTION, params.now, 0));
    return state;
  }

  /**
   * Rebuilds a shard from its document bytes (v1, or a v2 head whose
   * segments `options.segments` provides). Throws `CasqError("data_loss")`
   * when the bytes are not a valid casq shard document of a known format
   * version, a segment the head references is not provided, or (with
   * `options.expected`) the document names another queue or shard than the
   * key it was read from; such a document must never be overwritten.
   */
  static decode(bytes: Uint8Array, options: DecodeOptions = {}): ShardState {
    return ShardState.fromDocument(parseShardDocument(bytes), options);
  }

  /** Rebuilds a shard from a parsed document (see {@link decode}); the broker parses first to learn which segments to fetch. */
  static fromDocument(doc: ShardDocument, options: DecodeOptions = {}): ShardState {
    if (options.expected !== undefined) checkDocumentPlace(doc, options.expected);
    const segments = options.segments ?? NO_SEGMENTS;
    const lookupDead = options.deadLetterSegments ?? (() => undefined);
    const fail = (what: string): never => {
      throw new CasqError(
        "data_loss",
        `shard document of queue ${doc.queue} shard ${doc.shard} is inconsistent (${what}); refusing to load or overwrite it — restore it from a backup or move it aside`,
        { queue: doc.queue, shard: doc.shard },
      );
    };
    const state = new ShardState({
      queue: doc.queue,
      shard: doc.shard,
      createdAt: doc.createdAt,
      config: doc.config,
    });
    state.writeId = doc.writeId;
    state.recentWriteIds = [...doc.recentWriteIds];
    state.broker = doc.broker;
    state.next = doc.nextOffset;
    Object.assign(state.counters, doc.counters);

    const retain = (msg: MessageMeta, targets: string[] | undefined, segment: SegmentState | undefined) => {
      const offset = msg.offset;
      if (offset >= state.next) fail(`message offset ${offset} is not below next_offset ${state.next}`);
      if (state.messages.has(offset)) fail(`offset ${offset} is held twice`);
      if (state.ids.has(msg.id)) fail(`message id ${JSON.stringify(msg.id)} appears twice`);
      // A sealed message's size counts only if it moves back to the tail (which recomputes it).
      const bytes = segment === undefined ? messageBytes(msg as MessageRecord) : 0;
      const m: RetainedMessage = { msg, targets, pending: 0, bytes, segment };
      state.messages.set(offset, m);
      state.ids.set(msg.id, offset);
      if (segment === undefined) {
        state.tail.set(offset, m);
        state.tailBytes += m.bytes;
        state.bytes += m.bytes;
      }
    };
    let segmentEnd = -1;
    const mayBeCold = options.cold === true ? coolableRefs(doc) : undefined;
    const indexes = options.indexSegments ?? (() => undefined);
    for (const ref of sealedSegmentRefs(doc, indexes, fail)) {
      if (ref.first <= segmentEnd) fail(`segment ${ref.name} overlaps the segment before it`);
      segmentEnd = ref.last;
      const records = segments(ref);
      if (records === undefined && mayBeCold?.(ref) === true) {
        if (ref.gone.some((offset) => offset < ref.first || offset > ref.last))
          fail(`segment ${ref.name}: a gone offset is not in it`);
        const seg = coldSegmentFromRef(ref);
        addSegment(state, seg);
        insertColdSegment(state, seg);
        state.coldMessages += liveCount(seg);
        continue;
      }
      if (records === undefined) fail(`segment ${ref.name} is referenced by the head but was not loaded`);
      const gone = new Set(ref.gone);
      const seg = newSegmentState(ref, records as readonly MessageMeta[], gone);
      if (seg.first !== ref.first || seg.last !== ref.last || seg.count !== ref.count)
        fail(`segment ${ref.name} does not hold what the head says`);
      let found = 0;
      for (const r of seg.records) {
        if (gone.has(r.offset)) found += 1;
        else retain(r, undefined, seg);
      }
      if (found !== gone.size) fail(`segment ${ref.name}: a gone offset is not in it`);
      addSegment(state, seg);
    }
    for (const ref of doc.indexSegments) {
      const listed = (indexes(ref) ?? []).map((entry) => state.segments.get(entry.name) as SegmentState);
      addIndexSegment(state, newIndexSegmentState(ref, listed));
    }
    let previous = -1;
    for (const dm of doc.messages) {
      const offset = dm.msg.offset;
      if (offset <= previous) fail(`messages are not in strictly ascending offset order at offset ${offset}`);
      previous = offset;
      if (offset < segmentEnd) state.messagesSorted = false;
      retain(dm.msg, dm.targets, undefined);
    }
    state.tailLastOffset = previous < 0 ? undefined : previous;

    for (const ds of doc.subscriptions) {
      if (state.subs.has(ds.name)) fail(`subscription ${ds.name} appears twice`);
      if (ds.ackedBelow > state.next) fail(`subscription ${ds.name}: acked_below is above next_offset`);
      const sub = newSubscription(ds.name, ds.createdAt, ds.ackedBelow, ds.counters);
      let last = -1;
      for (const offset of ds.acked) {
        if (offset <= last || offset < ds.ackedBelow || offset >= state.next) {
          fail(`subscription ${ds.name}: acked offsets must ascend within [acked_below, next_offset)`);
        }
        const m = state.messages.get(offset);
        if (m === undefined || m.targets !== undefined) {
          fail(`subscription ${ds.name}: acked offset ${offset} is not a retained untargeted message`);
        }
        last = offset;
        sub.settled.add(offset);
      }
      addSubscription(state, sub);
    }

    for (const m of state.messages.values()) {
      if (m.targets === undefined) continue;
      let before = "";
      for (const name of m.targets) {
        if (!state.subs.has(name) || name <= before) {
          fail(`message ${m.msg.offset}: targets must be existing subscriptions, sorted and unique`);
        }
        before = name;
      }
    }

    const deadSegmentNames = new Set<string>(); // an object belongs to one subscription, indexed once
    for (const ds of doc.subscriptions) {
      const sub = state.subs.get(ds.name) as SubscriptionState;
      let last = -1;
      for (const dd of ds.deliveries) {
        const m = state.messages.get(dd.offset);
        if (dd.offset <= last) fail(`subscription ${ds.name}: deliveries are not in ascending offset order`);
        last = dd.offset;
        if (m === undefined || isSettled(m, sub)) {
          fail(
            `subscription ${ds.name}: delivery at offset ${dd.offset} is not an unsettled retained message`,
          );
        }
        if (dd.base > dd.attempt || (dd.lease !== undefined && dd.attempt === dd.base)) {
          fail(`subscription ${ds.name}: delivery at offset ${dd.offset} has impossible attempt counts`);
        }
        addDelivery(state, sub, dd.offset, {
          attempt: dd.attempt,
          base: dd.base,
          availableAt: dd.availableAt,
          lease: dd.lease,
        });
      }
      const checkDead = (dl: DeadLetterRecord) => {
        const offset = dl.message.offset;
        if (offset >= state.next || sub.dead.has(offset)) {
          fail(
            `subscription ${ds.name}: dead letter offset ${offset} is duplicated or not below next_offset`,
          );
        }
        const m = state.messages.get(offset);
        if (m !== undefined && (!isSettled(m, sub) || m.msg.id !== dl.message.id)) {
          fail(`subscription ${ds.name}: dead letter ${offset} contradicts the retained message`);
        }
      };
      // Sealed dead letters first (they died before the head's own), segment by segment.
      for (const ref of ds.deadLetterSegments) {
        if (deadSegmentNames.has(ref.name)) fail(`dead-letter segment ${ref.name} is indexed twice`);
        deadSegmentNames.add(ref.name);
        const letters = lookupDead(ref, ds.name);
        if (letters === undefined)
          fail(`dead-letter segment ${ref.name} is referenced by the head but was not loaded`);
        const gone = new Set(ref.gone);
        const seg = newDeadLetterSegmentState(ref, letters as readonly DeadLetterRecord[], gone);
        if (seg.first !== ref.first || seg.last !== ref.last || seg.count !== ref.count)
          fail(`dead-letter segment ${ref.name} does not hold what the head says`);
        addDeadLetterSegment(state, sub, seg);
        (letters as readonly DeadLetterRecord[]).forEach((dl, position) => {
          if (gone.has(position)) return;
          checkDead(dl);
          addSealedDeadLetter(sub, dl, seg, position);
        });
      }
      for (const dl of ds.deadLetters) {
        checkDead(dl);
        addHeadDeadLetter(state, sub, dl);
      }
    }

    // Dedup: sealed entries first (oldest first: a later entry of the same id, its
    // original having expired, replaces it), then the head's own, above them all.
    const lookupDedup = options.dedupSegments ?? (() => undefined);
    let dedupEnd = -1;
    for (const ref of doc.dedupSegments) {
      if (ref.first <= dedupEnd) fail(`dedup segment ${ref.name} overlaps the one before it`);
      if (ref.last >= state.next) fail(`dedup segment ${ref.name} names a future offset`);
      dedupEnd = ref.last;
      const entries = lookupDedup(ref);
      if (entries === undefined && options.now !== undefined && ref.expiresAt > options.now)
        fail(`dedup segment ${ref.name} is referenced by the head, not expired, but was not loaded`);
      const seg = newDedupSegmentState(ref, entries === undefined ? undefined : DedupChunk.from(entries));
      if (
        seg.first !== ref.first ||
        seg.last !== ref.last ||
        seg.count !== ref.count ||
        seg.expiresAt !== ref.expiresAt
      )
        fail(`dedup segment ${ref.name} does not hold what the head says`);
      addDedupSegment(state, seg);
      putSealedDedup(state, seg);
    }
    // v1 listed dedup ids by expiry; the v2 head lists them by offset.
    const headDedup = doc.version === 1 ? [...doc.dedup].sort((a, b) => a.offset - b.offset) : doc.dedup;
    for (const e of headDedup) {
      if (state.recentDedup.has(e.dedupId)) fail(`dedup id ${JSON.stringify(e.dedupId)} appears twice`);
      if (e.offset >= state.next) fail(`dedup id ${JSON.stringify(e.dedupId)} names a future offset`);
      if (e.offset <= dedupEnd)
        fail(`dedup ids must ascend by offset, above those of the dedup segments (offset ${e.offset})`);
      dedupEnd = e.offset;
      putDedup(state, e);
    }

    // Indexes: pending counts, runnable/wake-up heaps, lease deadlines, retention drops.
    for (const m of state.messages.values()) {
      for (const sub of state.subs.values()) {
        if (isSettled(m, sub)) continue;
        m.pending += 1;
        const d = sub.deliveries.get(m.msg.offset);
        if (d?.lease !== undefined) indexLease(state, sub, m.msg.offset, d);
        else schedule(sub, m, d, undefined);
      }
      state.settledSlots += state.subs.size - m.pending;
      if (m.pending === 0) {
        state.retentionIndex.push({ at: m.msg.enqueuedAt + state.cfg.retentionMs, offset: m.msg.offset });
      }
    }
    for (const seg of state.coldSegments)
      for (const sub of owingSubscriptions(state, seg)) pushPlaceholder(sub, seg, undefined);
    return state;
  }

  /**
   * The canonical v2 head: same state, same bytes. O(head): sealed messages
   * are in segment objects, not in the head (see {@link segmentRecords}).
   */
  encode(): Uint8Array {
    return encodeHead(this);
  }

  /** The whole shard as one v1 document (to test upgrades and mixed versions). O(shard). */
  encodeV1(): Uint8Array {
    if (this.coldSegments.length > 0)
      throw new CasqError(
        "internal",
        "a v1 document needs every message in memory: warm the cold segments first",
      );
    return encodeShardV1(this);
  }

  /** A deep, independent copy (decode of the encoding); for tests and simulation. */
  clone(): ShardState {
    const copy = ShardState.decode(this.encode(), {
      segments: (ref) => {
        const seg = this.segments.get(ref.name);
        return seg === undefined || seg.cold ? undefined : seg.records;
      },
      cold: true,
      indexSegments: (ref) => this.indexSegments.get(ref.name)?.segments.map(segmentRefOf),
      dedupSegments: (ref) => this.dedupSegments.get(ref.name)?.chunk,
      deadLetterSegments: (ref, subscription) => this.deadLetterSegmentRecords(subscription, ref.name),
    });
    copy.bodies = this.bodies;
    return copy;
  }

  /** The dead letters a dead-letter segment of `subscription` holds, gone ones included (undefined: no such segment). */
  deadLetterSegmentRecords(subscription: string, name: string): readonly DeadLetterRecord[] | undefined {
    return this.subs.get(subscription)?.deadSegments.get(name)?.records;
  }

  /** The messages (meta, or whole records where held) of every warm segment the head indexes, by name (shared, immutable). */
  segmentRecords(): Map<string, readonly MessageMeta[]> {
    const out = new Map<string, readonly MessageMeta[]>();
    for (const seg of this.segments.values()) if (!seg.cold) out.set(seg.name, seg.records);
    return out;
  }

  /** The entries of every loaded dedup segment the head indexes, by name (shared; immutable but for their ids, which are paged). */
  dedupSegmentEntries(): Map<string, DedupChunk> {
    const out = new Map<string, DedupChunk>();
    for (const seg of this.dedupSegments.values()) if (seg.chunk !== undefined) out.set(seg.name, seg.chunk);
    return out;
  }

  /** Names of the segments (message segments, index segments, dedup segments, then dead-letter segments) the head references. */
  segmentNames(): string[] {
    const names = [...this.segments.keys(), ...this.indexSegments.keys(), ...this.dedupSegments.keys()];
    for (const sub of this.subs.values()) names.push(...sub.deadSegments.keys());
    return names;
  }

  /** Estimated bytes of the dead letters the head itself carries, O(1) (the broker seals them when they outgrow the budget). */
  get headDeadLetterSize(): number {
    return this.headDeadBytes;
  }

  /** Estimated bytes of the dedup ids the head itself carries, O(1) (the broker seals them when they outgrow the budget). */
  get recentDedupSize(): number {
    return this.recentDedupBytes;
  }

  /** Takes the names of segments retired since the last call: their objects may go once a head without them landed. */
  takeRetiredSegments(): string[] {
    return this.retiredSegments.splice(0);
  }

  /** Estimated bytes of the messages in the head's tail, O(1) (the broker seals when it outgrows its budget). */
  get tailSize(): number {
    return this.tailBytes;
  }

  /** The queue config in force. */
  get config(): QueueConfig {
    return this.cfg;
  }

  /** The offset the next enqueued message gets; offsets are never reused. */
  get nextOffset(): number {
    return this.next;
  }

  /** Names the write about to be made: `writeId` becomes `id`, the previous one moves into {@link recentWriteIds}. */
  recordWrite(id: string): void {
    if (this.writeId !== undefined) {
      this.recentWriteIds.push(this.writeId);
      if (this.recentWriteIds.length > WRITE_HISTORY) this.recentWriteIds.shift();
    }
    this.writeId = id;
  }

  /** The write ids the document remembers, oldest first, ending with {@link writeId}. */
  writeChain(): string[] {
    return this.writeId === undefined ? [...this.recentWriteIds] : [...this.recentWriteIds, this.writeId];
  }

  /** True while the history was never cut, i.e. {@link writeChain} reaches back to the first write. */
  writeChainComplete(): boolean {
    return this.recentWriteIds.length < WRITE_HISTORY;
  }

  /**
   * Running estimate of the encoded size in bytes, O(1); used for the
   * `maxDocumentBytes` limit. Within a small factor of `encode().length`.
   */
  approxBytes(): number {
    let extra = 0;
    if (this.writeId !== undefined) extra += this.writeId.length;
    for (const id of this.recentWriteIds) extra += id.length + 3;
    if (this.broker !== undefined) extra += this.broker.id.length + this.broker.address.length;
    return this.bytes + this.settledSlots * SETTLED_SLOT_BYTES + extra;
  }

  /** Subscription names, sorted. */
  subscriptionNames(): string[] {
    return [...this.subs.keys()].sort();
  }

  /** True when the shard has a subscription of that name. O(1). */
  hasSubscription(name: string): boolean {
    return this.subs.has(name);
  }

  /** @internal The tail's messages in ascending offset order (re-sorts it if a redrive disturbed it). */
  sortedTail(): RetainedMessage[] {
    const list = [...this.tail.values()];
    if (!this.tailSorted) {
      list.sort((a, b) => a.msg.offset - b.msg.offset);
      this.tail.clear();
      for (const m of list) this.tail.set(m.msg.offset, m);
      this.tailSorted = true;
    }
    return list;
  }

  /** @internal Retained messages in ascending offset order (re-sorts the map if a redrive disturbed it). */
  sortedMessages(): RetainedMessage[] {
    const list = [...this.messages.values()];
    if (!this.messagesSorted) {
      list.sort((a, b) => a.msg.offset - b.msg.offset);
      this.messages.clear();
      for (const m of list) this.messages.set(m.msg.offset, m);
      this.messagesSorted = true;
    }
    return list;
  }
}

/** Throws `internal` unless `now` is a usable time (the broker passes its clock's `now()`). */
export function checkNow(now: number): void {
  if (!Number.isSafeInteger(now) || now < 0) {
    throw new CasqError("internal", `now must be a non-negative integer of ms since the epoch, got ${now}`);
  }
}
