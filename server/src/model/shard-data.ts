/**
 * The fields of a shard's in-memory state, as the model's mechanics see them
 * (model-internal).
 *
 * `ShardState` (`shard-state.ts`) implements this and adds creating,
 * decoding and encoding. The mechanics and the encoders (`record-encoder.ts`,
 * `v1-document-encoder.ts`, `head-encoder.ts`) take a `ShardData` rather than
 * a `ShardState`, so that `shard-state.ts` can use them without an import
 * cycle. Each member is documented on `ShardState`.
 */
import type { BinaryHeap } from "./binary-heap.ts";
import type { QueueConfig } from "./queue-config.ts";
import type { RememberedDedup, SealedDedup } from "./sealed-dedup.ts";
import type {
  BrokerRecord,
  DedupEntry,
  DedupExpiryEntry,
  DedupSegmentExpiry,
  DedupSegmentState,
  DelayedEntry,
  IndexSegmentState,
  LeaseEntry,
  MessageRecord,
  RetainedMessage,
  SegmentState,
  ShardCounters,
  SubscriptionState,
} from "./shard-records.ts";

/**
 * The whole record of a sealed message, when the broker holds its segment's
 * bodies in memory (undefined: paged out). See `segment-bodies.ts`.
 */
export type BodyLookup = (segment: string, offset: number) => MessageRecord | undefined;

/** One queue shard's state and indexes (see `ShardState` for each member). */
export interface ShardData {
  readonly queue: string;
  readonly shard: number;
  writeId: string | undefined;
  recentWriteIds: string[];
  broker: BrokerRecord | undefined;
  readonly createdAt: number;
  readonly config: QueueConfig;
  readonly nextOffset: number;
  next: number;
  readonly messages: Map<number, RetainedMessage>;
  messagesSorted: boolean;
  readonly ids: Map<string, number>;
  readonly subs: Map<string, SubscriptionState>;
  readonly dedup: RememberedDedup;
  readonly sealedDedup: SealedDedup;
  readonly recentDedup: Map<string, DedupEntry>;
  recentDedupBytes: number;
  readonly dedupSegments: Map<string, DedupSegmentState>;
  readonly dedupSegmentIndex: BinaryHeap<DedupSegmentExpiry>;
  readonly counters: ShardCounters;
  readonly leaseIndex: BinaryHeap<LeaseEntry>;
  readonly dedupIndex: BinaryHeap<DedupExpiryEntry>;
  readonly retentionIndex: BinaryHeap<DelayedEntry>;
  readonly tail: Map<number, RetainedMessage>;
  tailSorted: boolean;
  tailLastOffset: number | undefined;
  tailBytes: number;
  readonly segments: Map<string, SegmentState>;
  /** Index segments the head references, by name (`index-segments.ts`). */
  readonly indexSegments: Map<string, IndexSegmentState>;
  /** The cold segments (none of their messages in memory), ascending offsets. */
  readonly coldSegments: SegmentState[];
  /** Messages of the cold segments (their count less their gone offsets). */
  coldMessages: number;
  readonly retiredSegments: string[];
  bytes: number;
  /** Bytes of the dead letters kept in the head, all subscriptions together. */
  headDeadBytes: number;
  settledSlots: number;
  bodies: BodyLookup;
  /** Subscription names, sorted. */
  subscriptionNames(): string[];
  /** The tail's messages in ascending offset order. */
  sortedTail(): RetainedMessage[];
  /** Retained messages in ascending offset order. */
  sortedMessages(): RetainedMessage[];
}
