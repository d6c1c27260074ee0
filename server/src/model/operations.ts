/**
 * The operations a shard accepts and what each returns.
 *
 * An {@link Operation} is plain data (discriminated on `kind`) so the broker
 * can buffer many of them and apply them in one group commit;
 * `applyOperation(state, op, now)` turns one into an {@link OperationResult}
 * of the same `kind`. Results are per item (per message, per receipt) so a
 * batch tells the caller exactly what happened to each part.
 *
 * Every result has `changed`: false means the operation left the document
 * exactly as it was, so it needs no write of its own. It may still depend on
 * an earlier operation of the same unflushed batch (a duplicate of a message
 * enqueued a moment ago, an ack that finds the message already acked), so
 * the broker answers it only after the batch's write has landed.
 */
import type { QueueConfig, QueueConfigPatch } from "./queue-config.ts";

/**
 * Identifies ONE delivery (lease) of a message to a subscription: the
 * message's offset and the delivery number. `attempt` starts at 1 and grows
 * with every delivery of the message to that subscription; it is never
 * reused, not even after a redrive, so a receipt held by a worker that lost
 * its lease can never settle a later delivery.
 */
export interface Receipt {
  readonly offset: number;
  readonly attempt: number;
}

/** A message as a producer hands it in. The broker assigns `id`. */
export interface NewMessage {
  /** Unique id (the broker generates one, e.g. a ULID). Must not collide with a message still in the shard. */
  readonly id: string;
  /** Opaque bytes, at most `maxPayloadBytes`. Copied on enqueue. */
  readonly payload: Uint8Array;
  /** String headers, at most `maxHeaders` entries and `maxHeaderBytes` UTF-8 bytes in total. */
  readonly headers?: Readonly<Record<string, string>>;
  /** Routing / ordering key (the broker picks the shard by it); stored and returned as is. */
  readonly key?: string;
  /** Integer in [-1000, 1000], higher is claimed first; default 0. */
  readonly priority?: number;
  /** Earliest run time, ms since the epoch. Not together with `delayMs`. */
  readonly runAt?: number;
  /** Delay from now, in ms. Not together with `runAt`. */
  readonly delayMs?: number;
  /** Overrides the queue's `maxAttempts` for this message (1..1000). */
  readonly maxAttempts?: number;
  /** Deduplication id: a second enqueue with the same id within `dedupWindowMs` returns the first message. */
  readonly dedupId?: string;
  /** W3C trace context (e.g. `traceparent`, `tracestate`) of the producer. */
  readonly traceContext?: Readonly<Record<string, string>>;
}

/** Where a new subscription starts reading. */
export type SubscriptionStart = "latest" | "earliest";

/** Enqueue one or more messages, all or nothing. */
export interface EnqueueOperation {
  readonly kind: "enqueue";
  readonly messages: readonly NewMessage[];
  /**
   * Where each message is in the caller's request, when this shard got only
   * some of them: errors name the message by its place there. Default: 0, 1, …
   */
  readonly requestIndexes?: readonly number[];
  /**
   * How many messages the caller's request had, when this shard got only
   * some of them: `max_batch` bounds the request, not its part for one shard.
   * Default: `messages.length`.
   */
  readonly requestSize?: number;
}

/** Lease up to `max` runnable messages of a subscription to a worker. */
export interface ClaimOperation {
  readonly kind: "claim";
  readonly subscription: string;
  readonly workerId: string;
  /** At least 1; more than the queue's `maxBatch` is capped to it, unless `credited`. */
  readonly max: number;
  /** Lease length for these messages; default: the queue's `leaseTtlMs`. */
  readonly leaseTtlMs?: number;
  /**
   * A Work stream's claim, `max` being the stream's credit: not capped at
   * `maxBatch`, which bounds what one Claim call returns. The stream sends
   * the jobs in messages of its own size, and its credit is bounded by the
   * broker's `max_credits`.
   */
  readonly credited?: boolean;
}

/** Keep leases alive (see the heartbeat persistence rule in `heartbeat-operation.ts`). */
export interface HeartbeatOperation {
  readonly kind: "heartbeat";
  readonly subscription: string;
  readonly workerId: string;
  readonly receipts: readonly Receipt[];
}

/** Settle deliveries as done. */
export interface AckOperation {
  readonly kind: "ack";
  readonly subscription: string;
  readonly receipts: readonly Receipt[];
}

/** Give deliveries back: retry later (backoff or `delayMs`) or dead-letter. */
export interface NackOperation {
  readonly kind: "nack";
  readonly subscription: string;
  readonly receipts: readonly Receipt[];
  /** Retry after this many ms instead of the backoff policy. */
  readonly delayMs?: number;
  /** Dead-letter now instead of retrying. */
  readonly deadLetter?: boolean;
  /** Why it failed; kept in the dead letter (truncated to 2048 characters). */
  readonly reason?: string;
  /** Hand back unprocessed: claimable at once, the delivery does not count as an attempt. */
  readonly release?: boolean;
}

/** Housekeeping due at `now`: expired leases, dedup ids, retention. The broker includes it in every commit. */
export interface ExpireOperation {
  readonly kind: "expire";
}

/** Add a subscription. */
export interface CreateSubscriptionOperation {
  readonly kind: "createSubscription";
  readonly name: string;
  /** "latest" (default): only messages enqueued from now on. "earliest": also every message still in the shard. */
  readonly from?: SubscriptionStart;
}

/** Remove a subscription with its leases and dead letters. */
export interface DeleteSubscriptionOperation {
  readonly kind: "deleteSubscription";
  readonly name: string;
}

/**
 * Drop messages or dead letters.
 * - `{ subscription }`: everything the subscription has not settled counts as done for it.
 * - `{}`: every message leaves the shard, for every subscription.
 * - `{ subscription, deadLetters: true }` / `{ deadLetters: true }`: clear dead letters instead.
 */
export interface PurgeOperation {
  readonly kind: "purge";
  readonly subscription?: string;
  readonly deadLetters?: boolean;
}

/** Move dead letters of a subscription back to runnable (all, the given ids, or the oldest `limit`). */
export interface RedriveOperation {
  readonly kind: "redrive";
  readonly subscription: string;
  readonly ids?: readonly string[];
  readonly limit?: number;
}

/** Change the queue config (validated; see `queue-config.ts`). */
export interface UpdateConfigOperation {
  readonly kind: "updateConfig";
  readonly patch: QueueConfigPatch;
}

/** Everything a shard can be asked to do. */
export type Operation =
  | EnqueueOperation
  | ClaimOperation
  | HeartbeatOperation
  | AckOperation
  | NackOperation
  | ExpireOperation
  | CreateSubscriptionOperation
  | DeleteSubscriptionOperation
  | PurgeOperation
  | RedriveOperation
  | UpdateConfigOperation;

/** A message as stored, without delivery state. Treat the payload as read-only. */
export interface MessageView {
  readonly id: string;
  readonly offset: number;
  readonly payload: Uint8Array;
  /** Always an object (empty when the message has no headers). */
  readonly headers: Readonly<Record<string, string>>;
  readonly key: string | undefined;
  readonly priority: number;
  /** When it became (or becomes) runnable; equals `enqueuedAt` when it had no delay. */
  readonly runAt: number;
  /** The message's own `maxAttempts` override, if it has one. */
  readonly maxAttempts: number | undefined;
  readonly dedupId: string | undefined;
  readonly enqueuedAt: number;
  readonly traceContext: Readonly<Record<string, string>> | undefined;
}

/**
 * A message leased to a worker by a claim: every message field (flat), plus
 * the subscription, the receipt and the lease deadline. `maxAttempts` here is
 * the effective limit of this delivery, not the message's own override.
 */
export interface ClaimedMessage extends Omit<MessageView, "maxAttempts"> {
  readonly subscription: string;
  /** What the worker sends back in heartbeat / ack / nack. */
  readonly receipt: Receipt;
  /** This delivery's number (= `receipt.attempt`). */
  readonly attempt: number;
  /**
   * The last delivery number before the message is dead-lettered: the
   * message's or queue's max attempts, plus the deliveries made before its
   * last redrive. `attempt === maxAttempts` means "last try".
   */
  readonly maxAttempts: number;
  /** The lease runs out at this time unless heartbeated. */
  readonly leaseDeadline: number;
  /**
   * Set when the message is sealed and its body was paged out as the claim
   * was applied: the segment to page it in from. `payload` is then empty,
   * `headers` and `traceContext` too, until the broker fills them
   * (`fillClaimedBodies`); no claim leaves the broker with this set.
   */
  readonly bodyIn: string | undefined;
}

/** Per-message outcome of an enqueue. */
export interface EnqueueItemResult {
  readonly id: string;
  readonly offset: number;
  /** True when a message with the same dedup id was enqueued within the window: `id`/`offset` are the original's and nothing was added. */
  readonly duplicate: boolean;
}

/** Result of {@link EnqueueOperation}, one entry per message in order. */
export interface EnqueueResult {
  readonly kind: "enqueue";
  readonly results: readonly EnqueueItemResult[];
  readonly changed: boolean;
}

/** Result of {@link ClaimOperation}: possibly empty, in claim order. */
export interface ClaimResult {
  readonly kind: "claim";
  readonly messages: readonly ClaimedMessage[];
  readonly changed: boolean;
}

/** A lease the heartbeat found held, with its deadline as stored after the heartbeat. */
export interface HeartbeatExtension {
  readonly receipt: Receipt;
  readonly deadline: number;
}

/** Result of {@link HeartbeatOperation}. */
export interface HeartbeatResult {
  readonly kind: "heartbeat";
  /** Leases still held (every one of them, extended or not). */
  readonly extended: readonly HeartbeatExtension[];
  /** Receipts the worker no longer holds: stop working on them (an ack may still be accepted, see ack). */
  readonly lost: readonly Receipt[];
  /** True when at least one stored deadline moved (the broker must write); false: answer without a write. */
  readonly changed: boolean;
}

/**
 * Ack outcome of one receipt.
 * - `acked`: settled now.
 * - `already_acked`: the message was already settled for this subscription (acked before, purged, or
 *   gone from the shard); safe to treat as success (e.g. a retry after a lost response).
 * - `lease_lost`: the message was delivered again as a later attempt, or dead-lettered; the ack changed nothing.
 */
export type AckOutcome = "acked" | "already_acked" | "lease_lost";

/** Per-receipt outcome of an ack. */
export interface AckItemResult {
  readonly receipt: Receipt;
  readonly outcome: AckOutcome;
  /** For `acked` while the delivery was still leased: when it was claimed (for claim-to-ack metrics). */
  readonly claimedAt?: number;
}

/** Result of {@link AckOperation}, one entry per receipt in order. */
export interface AckResult {
  readonly kind: "ack";
  readonly results: readonly AckItemResult[];
  readonly changed: boolean;
}

/**
 * Nack outcome of one receipt.
 * - `retry_scheduled`: runnable again at `availableAt`.
 * - `dead_lettered`: moved to the subscription's dead letters (asked for, or out of attempts).
 * - `lease_lost`: the delivery is no longer the current one (redelivered, acked, or dead-lettered).
 */
export type NackOutcome = "retry_scheduled" | "dead_lettered" | "lease_lost";

/** Per-receipt outcome of a nack. */
export interface NackItemResult {
  readonly receipt: Receipt;
  readonly outcome: NackOutcome;
  /** For `retry_scheduled`: when the message becomes claimable again. */
  readonly availableAt?: number;
}

/** Result of {@link NackOperation}, one entry per receipt in order. */
export interface NackResult {
  readonly kind: "nack";
  readonly results: readonly NackItemResult[];
  readonly changed: boolean;
}

/** Result of {@link ExpireOperation}: what the sweep did. */
export interface ExpireResult {
  readonly kind: "expire";
  /** Leases whose deadline had passed. */
  readonly leasesExpired: number;
  /** Of those, messages made claimable again (the next claim bumps the attempt). */
  readonly redelivered: number;
  /** Of those, messages out of attempts, moved to dead letters. */
  readonly deadLettered: number;
  /** Dedup ids forgotten because their window passed. */
  readonly dedupPruned: number;
  /** Settled messages removed from the shard because their retention passed. */
  readonly messagesDropped: number;
  readonly changed: boolean;
}

/** Result of {@link CreateSubscriptionOperation}. */
export interface CreateSubscriptionResult {
  readonly kind: "createSubscription";
  readonly name: string;
  readonly from: SubscriptionStart;
  /** Messages pending for the new subscription right away (0 for "latest"). */
  readonly backlog: number;
  readonly changed: boolean;
}

/** Result of {@link DeleteSubscriptionOperation}. */
export interface DeleteSubscriptionResult {
  readonly kind: "deleteSubscription";
  readonly name: string;
  /** Messages only this subscription was still holding, now gone. */
  readonly messagesDropped: number;
  /** Leases the subscription had outstanding (their receipts now ack as `already_acked`/`lease_lost`). */
  readonly leasesDropped: number;
  /** Dead letters that went with it. */
  readonly deadLettersDropped: number;
  readonly changed: boolean;
}

/** Result of {@link PurgeOperation}. */
export interface PurgeResult {
  readonly kind: "purge";
  readonly subscription: string | undefined;
  /** Messages settled for the subscription (with `subscription`) or removed from the shard (without). */
  readonly messagesPurged: number;
  /** Leases dropped by the purge. */
  readonly leasesDropped: number;
  /** Dead letters removed (with `deadLetters: true`). */
  readonly deadLettersPurged: number;
  readonly changed: boolean;
}

/** Result of {@link RedriveOperation}. */
export interface RedriveResult {
  readonly kind: "redrive";
  readonly subscription: string;
  /** Number of dead letters made runnable again. */
  readonly redriven: number;
  /** Their message ids, oldest dead letter first. */
  readonly ids: readonly string[];
  /** Requested ids that are not among the subscription's dead letters. */
  readonly missing: readonly string[];
  readonly changed: boolean;
}

/** Result of {@link UpdateConfigOperation}. */
export interface UpdateConfigResult {
  readonly kind: "updateConfig";
  /** The config now in force. */
  readonly config: QueueConfig;
  /** Dead letters evicted because `deadLetterLimit` went down. */
  readonly deadEvicted: number;
  readonly changed: boolean;
}

/** The result of any operation; `kind` matches the operation's. */
export type OperationResult =
  | EnqueueResult
  | ClaimResult
  | HeartbeatResult
  | AckResult
  | NackResult
  | ExpireResult
  | CreateSubscriptionResult
  | DeleteSubscriptionResult
  | PurgeResult
  | RedriveResult
  | UpdateConfigResult;

/** The result type of an operation type, e.g. `ResultFor<ClaimOperation>` is {@link ClaimResult}. */
export type ResultFor<O extends Operation> = Extract<OperationResult, { kind: O["kind"] }>;
