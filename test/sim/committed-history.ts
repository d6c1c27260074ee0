/**
 * Every committed version of every shard document, in commit order, and the
 * invariants that must hold from one version to the next.
 *
 * The simulation's "truth" store is wrapped by an observer that hands each
 * successful write here (`record`). Because every write is a CAS on the
 * previous etag, the versions of one shard form a single chain, and each
 * transition `previous -> current` is checked:
 *
 * - the document decodes (`ShardState.decode`): a broker can always load it;
 * - the CAS chain is unbroken (the write was conditioned on the previous etag);
 * - `next_offset` never goes down, new messages get offsets at or above the
 *   previous `next_offset`, a retained offset never changes its message id,
 *   and message ids are unique across the whole run (every shard);
 * - the leadership epoch never goes down, and one epoch names one broker;
 * - settled stays settled: an acked message is never pending or leased again,
 *   a dead letter stays dead (no redrive in the simulation);
 * - a message leaves the pending state only with an explanation: `acked`
 *   needs an ack that a worker sent for that very delivery; `dead` needs a
 *   nack sent for it or a lease that had run out; its dead letter carries the
 *   attempt count of the last delivery; nothing simply vanishes;
 * - a new lease is a new delivery: its attempt is higher than any before it
 *   (receipts are never reused), and it never replaces a lease that was still
 *   running (at most one worker holds a message per subscription);
 * - a lease disappears before its deadline only when its holder sent an ack
 *   or a nack for it;
 * - claim order: a new lease never passes over a message that was runnable
 *   at its claim time and not leased, with a higher priority (or the same
 *   priority and a lower offset).
 *
 * The history also keeps, per (shard, subscription, offset), how many
 * deliveries were committed, which the final audit compares with the
 * attempts recorded in dead letters.
 */
import {
  parseDeadLetterSegmentDocument,
  parseDedupSegmentDocument,
  parseIndexSegmentDocument,
  parseSegmentDocument,
} from "../../server/src/model/segment-parser.ts";
import { ShardState } from "../../server/src/model/shard-state.ts";
import type { PutCondition } from "../../server/src/store/object-store.ts";
import {
  type DeliveryView,
  isSettledStatus,
  type MessageStatus,
  parseShardView,
  type ShardView,
  statusOf,
} from "./shard-view.ts";

/** What workers sent (not necessarily acknowledged), so the history can explain settlements. */
export interface SentRequests {
  /** An ack for this delivery was sent by some worker. */
  ackSent(shard: number, subscription: string, offset: number, attempt: number): boolean;
  /** A nack (retry or dead-letter) for this delivery was sent by some worker. */
  nackSent(shard: number, subscription: string, offset: number, attempt: number): boolean;
  /** When a nack for this delivery was first sent, if one was. */
  nackSentAt(shard: number, subscription: string, offset: number, attempt: number): number | undefined;
}

/** Where a message id lives. */
export interface MessageLocation {
  readonly shard: number;
  readonly offset: number;
  readonly dedupId: string | undefined;
  /** Version in which it first appeared. */
  readonly version: number;
}

/** Counters over the whole history. */
export interface HistoryStats {
  readonly versions: number;
  /** Epoch increases (leadership changed hands, or was re-taken after a release or expiry). */
  readonly takeovers: number;
  /** Index segment objects written (referenced by a head or not). */
  readonly indexSegments: number;
  /** Committed deliveries beyond the first, per (subscription, message). */
  readonly redeliveries: number;
}

/** A broken invariant, reported through the callback given to {@link CommittedHistory}. */
export type ViolationSink = (invariant: string, detail: string) => void;

/** Records committed versions and checks the transition invariants (see module header). */
export class CommittedHistory {
  private readonly latestByShard = new Map<number, ShardView>();
  private readonly latestByKey = new Map<string, ShardView>();
  private readonly epochOwners = new Map<string, string>();
  private readonly ids = new Map<string, MessageLocation>();
  private readonly deliveries = new Map<string, number>();
  /** Per shard and dedup id, the newest message stored with it and when its window ends. */
  private readonly dedupOriginals = new Map<string, { readonly id: string; readonly expiresAt: number }>();
  /** Every segment object ever written, by name (names are unique; deletes are not replayed here). */
  private readonly segments = new Map<string, Uint8Array>();
  private versions = 0;
  private takeovers = 0;
  private indexSegments = 0;
  /** The names of the segments the latest committed head of each key references. */
  private readonly referencedByKey = new Map<string, ReadonlySet<string>>();
  private redeliveries = 0;

  constructor(
    private readonly sent: SentRequests,
    private readonly violation: ViolationSink,
    private readonly onVersion: (view: ShardView) => void = () => {},
  ) {}

  /** Called by the truth-store observer for every successful write of a shard document (or segment). */
  record(key: string, bytes: Uint8Array, etag: string, condition: PutCondition, committedAt: number): void {
    const segment = /\/seg\/([^/]+)$/.exec(key);
    if (segment !== null) {
      if (!("ifAbsent" in condition)) this.violation("segments", `${key}: a segment was written over`);
      this.segments.set(segment[1] as string, bytes);
      if ((segment[1] as string).endsWith(".index.json")) this.indexSegments += 1;
      return;
    }
    let state: ShardState;
    try {
      state = ShardState.decode(bytes, {
        expected: { queue: queueOf(key), shard: shardOf(key) },
        segments: (ref) => {
          const stored = this.segments.get(ref.name);
          return stored && parseSegmentDocument(stored, { queue: queueOf(key), shard: shardOf(key), ref });
        },
        indexSegments: (ref) => {
          const stored = this.segments.get(ref.name);
          return (
            stored && parseIndexSegmentDocument(stored, { queue: queueOf(key), shard: shardOf(key), ref })
          );
        },
        dedupSegments: (ref) => {
          const stored = this.segments.get(ref.name);
          return (
            stored && parseDedupSegmentDocument(stored, { queue: queueOf(key), shard: shardOf(key), ref })
          );
        },
        deadLetterSegments: (ref, subscription) => {
          const stored = this.segments.get(ref.name);
          return (
            stored &&
            parseDeadLetterSegmentDocument(stored, {
              queue: queueOf(key),
              shard: shardOf(key),
              subscription,
              ref,
            })
          );
        },
        now: committedAt, // a live dedup segment the head references must be there
      });
    } catch (error) {
      this.violation("decodable", `${key}: committed document does not load: ${String(error)}`);
      return;
    }
    this.referencedByKey.set(key, new Set(state.segmentNames()));
    const previous = this.latestByKey.get(key);
    const view = parseShardView(
      key,
      bytes,
      { version: previous ? previous.version + 1 : 0, etag, committedAt },
      this.segments,
    );
    this.versions += 1;
    this.checkTransition(previous, view, condition);
    this.latestByShard.set(view.shard, view);
    this.latestByKey.set(key, view);
    this.onVersion(view);
  }

  /**
   * Called by the truth-store observer after every delete: deleting a
   * segment (message, index, dedup or dead-letter segment) that the latest
   * committed head of its shard references is a violation (the shard could
   * no longer be loaded), whoever deletes it (a deposed leader included).
   */
  recordDelete(key: string): void {
    const segment = /^(.*)\/seg\/([^/]+)$/.exec(key);
    if (segment === null) {
      this.referencedByKey.delete(key); // a head: nothing references anything any more
      return;
    }
    if (this.referencedByKey.get(`${segment[1]}.json`)?.has(segment[2] as string))
      this.violation("segments", `${key}: deleted while the latest committed head references it`);
  }

  /** The latest committed version of a shard. */
  latest(shard: number): ShardView | undefined {
    return this.latestByShard.get(shard);
  }

  /** Every shard that has a committed version. */
  shards(): number[] {
    return [...this.latestByShard.keys()].sort((a, b) => a - b);
  }

  /** Where a message id was committed, if it ever was. */
  locate(id: string): MessageLocation | undefined {
    return this.ids.get(id);
  }

  /** Number of committed deliveries (distinct leases) of a message to a subscription. */
  deliveriesOf(shard: number, subscription: string, offset: number): number {
    return this.deliveries.get(deliveryKey(shard, subscription, offset)) ?? 0;
  }

  /** Counters so far. */
  stats(): HistoryStats {
    return {
      versions: this.versions,
      takeovers: this.takeovers,
      indexSegments: this.indexSegments,
      redeliveries: this.redeliveries,
    };
  }

  private checkTransition(previous: ShardView | undefined, view: ShardView, condition: PutCondition): void {
    const where = `${view.key}@v${view.version}`;
    const fail = (invariant: string, detail: string) => this.violation(invariant, `${where}: ${detail}`);

    // The CAS chain.
    if (previous === undefined) {
      if (!("ifAbsent" in condition)) fail("cas-chain", "first version was not written with if-absent");
    } else if (!("ifMatch" in condition) || condition.ifMatch !== previous.etag) {
      fail("cas-chain", `written under ${JSON.stringify(condition)}, previous etag ${previous.etag}`);
    }

    // Leadership epochs.
    const broker = view.broker;
    if (broker === undefined) fail("epoch", "document names no broker");
    else {
      const before = previous?.broker?.epoch ?? 0;
      if (broker.epoch < before) fail("epoch", `epoch went back from ${before} to ${broker.epoch}`);
      if (broker.epoch > before) this.takeovers += 1;
      const ownerKey = `${view.shard}/${broker.epoch}`;
      const owner = this.epochOwners.get(ownerKey);
      if (owner === undefined) this.epochOwners.set(ownerKey, broker.id);
      else if (owner !== broker.id)
        fail("epoch", `epoch ${broker.epoch} held by ${owner} and then by ${broker.id}`);
    }

    // Offsets and ids.
    const prevNext = previous?.nextOffset ?? 0;
    if (view.nextOffset < prevNext)
      fail("offsets", `next_offset went back from ${prevNext} to ${view.nextOffset}`);
    for (const message of view.messages.values()) {
      if (message.offset >= view.nextOffset)
        fail("offsets", `message at offset ${message.offset} is not below next_offset ${view.nextOffset}`);
      if (message.offset < prevNext) {
        const before = previous?.messages.get(message.offset);
        if (before === undefined)
          fail("offsets", `offset ${message.offset} reappeared after it left the shard`);
        else if (before.id !== message.id)
          fail("offsets", `offset ${message.offset} changed id from ${before.id} to ${message.id}`);
        continue;
      }
      const known = this.ids.get(message.id);
      if (known !== undefined)
        fail(
          "unique-ids",
          `message id ${message.id} at offset ${message.offset} was already used at shard ${known.shard} offset ${known.offset}`,
        );
      else
        this.ids.set(message.id, {
          shard: view.shard,
          offset: message.offset,
          dedupId: message.dedupId,
          version: view.version,
        });
      // Dedup: within the window of a stored message, its dedup id stores nothing new on
      // that shard — however the id is remembered (head, dedup segment, a new leader's load).
      if (message.dedupId !== undefined && view.dedupWindowMs > 0) {
        const dedupKey = `${view.shard}/${message.dedupId}`;
        const original = this.dedupOriginals.get(dedupKey);
        if (original !== undefined && message.enqueuedAt < original.expiresAt)
          fail(
            "dedup",
            `message ${message.id} stored with dedup id ${message.dedupId} at ${message.enqueuedAt}, within the window of ${original.id} (until ${original.expiresAt})`,
          );
        this.dedupOriginals.set(dedupKey, {
          id: message.id,
          expiresAt: message.enqueuedAt + view.dedupWindowMs,
        });
      }
    }

    // Subscriptions never disappear in the simulation.
    for (const name of previous?.subscriptions.keys() ?? []) {
      if (!view.subscriptions.has(name)) fail("subscriptions", `subscription ${name} disappeared`);
    }

    // Per subscription and message: settlement, leases, attempts.
    for (const name of view.subscriptions.keys()) {
      const offsets = new Set<number>();
      for (const offset of previous?.messages.keys() ?? []) offsets.add(offset);
      for (const offset of view.messages.keys()) offsets.add(offset);
      const claimed: number[] = [];
      for (const offset of offsets) {
        const before: MessageStatus =
          previous === undefined || offset >= prevNext ? "pending" : statusOf(previous, name, offset);
        const after = statusOf(view, name, offset);
        const prevDelivery = previous?.subscriptions.get(name)?.deliveries.get(offset);
        const delivery = view.subscriptions.get(name)?.deliveries.get(offset);
        if (this.checkMessage(fail, view, name, offset, before, after, prevDelivery, delivery))
          claimed.push(offset);
      }
      for (const offset of claimed) this.checkClaimOrder(fail, previous, view, name, offset);
    }
  }

  private checkMessage(
    fail: (invariant: string, detail: string) => void,
    view: ShardView,
    name: string,
    offset: number,
    before: MessageStatus,
    after: MessageStatus,
    prevDelivery: DeliveryView | undefined,
    delivery: DeliveryView | undefined,
  ): boolean {
    const what = `${name} offset ${offset}`;
    if (isSettledStatus(before)) {
      if (after !== before) fail("settled-is-final", `${what} was ${before} and is now ${after}`);
      return false;
    }
    if (before === "unknown") return false;
    const attemptBefore = prevDelivery?.attempt ?? 0;
    const lease = prevDelivery?.lease;
    const leaseRanOut = lease !== undefined && lease.deadline <= view.committedAt;

    if (after === "acked") {
      if (prevDelivery === undefined)
        fail("no-vanishing", `${what} became settled without ever being delivered`);
      else if (!this.sent.ackSent(view.shard, name, offset, attemptBefore))
        fail(
          "no-vanishing",
          `${what} became settled (not dead) but nobody sent an ack for attempt ${attemptBefore}`,
        );
      return false;
    }
    if (after === "dead") {
      const dead = view.subscriptions.get(name)?.dead.get(offset);
      if (prevDelivery === undefined)
        fail("no-vanishing", `${what} was dead-lettered without ever being delivered`);
      else if (!leaseRanOut && !this.sent.nackSent(view.shard, name, offset, attemptBefore))
        fail(
          "no-vanishing",
          `${what} was dead-lettered on attempt ${attemptBefore} without a nack or an expired lease`,
        );
      if (dead !== undefined && dead.attempts !== attemptBefore)
        fail(
          "attempts",
          `${what}: dead letter records ${dead.attempts} attempts, the last delivery was ${attemptBefore}`,
        );
      return false;
    }

    // Still unsettled: leases and attempts.
    if (delivery !== undefined && delivery.attempt < attemptBefore)
      fail("attempts", `${what}: attempt went back from ${attemptBefore} to ${delivery.attempt}`);
    const next = delivery?.lease;
    const sameLease =
      lease !== undefined &&
      next !== undefined &&
      next.worker === lease.worker &&
      next.claimedAt === lease.claimedAt &&
      delivery?.attempt === attemptBefore;
    if (sameLease) {
      if (next.deadline < lease.deadline)
        fail("leases", `${what}: lease deadline moved back from ${lease.deadline} to ${next.deadline}`);
      return false;
    }
    if (next !== undefined) {
      // A new delivery.
      const key = deliveryKey(view.shard, name, offset);
      const count = (this.deliveries.get(key) ?? 0) + 1;
      this.deliveries.set(key, count);
      if (count > 1) this.redeliveries += 1;
      if ((delivery?.attempt ?? 0) <= attemptBefore)
        fail(
          "receipts-unique",
          `${what}: delivered again with attempt ${delivery?.attempt} (previous delivery had attempt ${attemptBefore}; a receipt must never be reused)`,
        );
      // A nack ends the lease when it is applied: a release (claimable at once) and the
      // next claim may land in one commit. The new lease may not start before the nack was sent
      // (lease times are whole ms).
      const nackAt = this.sent.nackSentAt(view.shard, name, offset, attemptBefore);
      const endedAt =
        nackAt === undefined ? lease?.deadline : Math.min(lease?.deadline ?? 0, Math.floor(nackAt));
      if (lease !== undefined && endedAt !== undefined && next.claimedAt < endedAt)
        fail(
          "one-holder",
          `${what}: leased to ${next.worker} at ${next.claimedAt} while ${lease.worker}'s lease ran until ${lease.deadline}`,
        );
    }
    if (lease !== undefined && !leaseRanOut && !this.sent.nackSent(view.shard, name, offset, attemptBefore)) {
      if (next === undefined)
        fail(
          "leases",
          `${what}: lease of attempt ${attemptBefore} was released before its deadline without a nack`,
        );
    }
    return next !== undefined;
  }

  /** No message runnable at the claim of `offset`, and still waiting after it, may rank ahead of it. */
  private checkClaimOrder(
    fail: (invariant: string, detail: string) => void,
    previous: ShardView | undefined,
    view: ShardView,
    name: string,
    offset: number,
  ): void {
    const sub = view.subscriptions.get(name);
    const claimedAt = sub?.deliveries.get(offset)?.lease?.claimedAt;
    const message = view.messages.get(offset);
    if (sub === undefined || claimedAt === undefined || message === undefined || previous === undefined)
      return;
    for (const other of view.messages.values()) {
      if (other.offset === offset || statusOf(view, name, other.offset) !== "pending") continue;
      // It was waiting before this write: not new, and not leased (unless that lease had run out).
      const before = previous.messages.has(other.offset) ? statusOf(previous, name, other.offset) : "unknown";
      const prevLease = previous.subscriptions.get(name)?.deliveries.get(other.offset)?.lease;
      const expired = before === "leased" && prevLease !== undefined && prevLease.deadline <= claimedAt;
      if (before !== "pending" && !expired) continue;
      const availableAt = sub.deliveries.get(other.offset)?.availableAt ?? 0;
      if (Math.max(other.runAt, availableAt) > claimedAt) continue;
      if (
        other.priority > message.priority ||
        (other.priority === message.priority && other.offset < message.offset)
      )
        fail(
          "claim-order",
          `${name}: offset ${offset} (priority ${message.priority}) was claimed at ${claimedAt} while offset ${other.offset} (priority ${other.priority}) was runnable and stayed pending`,
        );
    }
  }
}

function queueOf(key: string): string {
  return key.split("/")[1] ?? "";
}

function shardOf(key: string): number {
  return Number(/\/([0-9]+)\.json$/.exec(key)?.[1] ?? -1);
}

function deliveryKey(shard: number, subscription: string, offset: number): string {
  return `${shard}/${subscription}/${offset}`;
}
