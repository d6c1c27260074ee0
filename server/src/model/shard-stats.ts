/**
 * Read-only questions the broker and operators ask about a shard.
 *
 * - `computeStats`: counts per subscription (ready / delayed / in flight /
 *   dead), oldest unacked age, counters, size. O(messages x subscriptions):
 *   for metrics scrapes and the CLI, not for the commit path. The messages
 *   of a cold segment (`cold-segments.ts`) count by its run_at range: all
 *   ready once its earliest `run_at` passed, else all delayed, the oldest
 *   taken as that earliest `run_at` (exact for messages enqueued without a delay).
 * - `nextWakeAt`: the one time the broker should arm a timer for (a delayed
 *   or backed-off message becomes claimable, or a lease runs out and needs
 *   an `expire`). O(subscriptions) plus stale index entries.
 * - `hasRunnable`: may a claim on this subscription return something now?
 *   O(log n) amortised; lets the broker decide to wake long-poll waiters.
 * - `nextHousekeepingAt`: when dedup ids or retained messages fall due
 *   (work for `expire` that nobody is waiting on).
 *
 * These functions never change the document. They may tidy the in-memory
 * indexes (drop stale entries, move due wake-ups into the runnable index),
 * which is invisible in `encode()`.
 */

import { coldRunAt } from "./cold-segment-index.ts";
import { liveCount } from "./cold-segments.ts";
import { isSettled, nextDelayedAt, peekRunnable, promoteDue, runnableAt } from "./shard-mechanics.ts";
import type { BrokerRecord, ShardCounters, SubscriptionCounters } from "./shard-records.ts";
import type { ShardState } from "./shard-state.ts";

/** Counts for one subscription at a point in time. */
export interface SubscriptionStats {
  readonly name: string;
  readonly createdAt: number;
  /** Claimable now. */
  readonly ready: number;
  /** Waiting for `run_at` or nack backoff. */
  readonly delayed: number;
  /** Leased to a worker (including leases past their deadline that `expire` has not swept yet). */
  readonly inFlight: number;
  /** Of `inFlight`, leases whose deadline has passed. */
  readonly expiredLeases: number;
  /** Dead letters kept. */
  readonly dead: number;
  /** Age of the oldest message it has not settled (ms), undefined when none. */
  readonly oldestUnackedAgeMs: number | undefined;
  /** Offset lag: `nextOffset` minus the lowest offset it has not settled; 0 when caught up. */
  readonly lag: number;
  readonly counters: Readonly<SubscriptionCounters>;
}

/** Counts for one shard at a point in time. */
export interface ShardStats {
  readonly queue: string;
  readonly shard: number;
  readonly nextOffset: number;
  /** Messages still in the document. */
  readonly messages: number;
  /** Of them, sealed messages the leader holds in memory (as meta; see `cold-segments.ts`). */
  readonly sealedInMemory: number;
  /** Of them, messages of cold segments (not in memory until claims reach them). */
  readonly coldMessages: number;
  /** Sums over subscriptions. */
  readonly ready: number;
  readonly delayed: number;
  readonly inFlight: number;
  readonly dead: number;
  /** Dedup ids remembered (an id enqueued again after its entry expired counts twice until the old entry is dropped). */
  readonly dedupIds: number;
  readonly approxBytes: number;
  readonly maxDocumentBytes: number;
  readonly broker: BrokerRecord | undefined;
  readonly counters: Readonly<ShardCounters>;
  readonly subscriptions: readonly SubscriptionStats[];
}

/** Counts and counters of a shard (see module header). */
export function computeStats(state: ShardState, now: number): ShardStats {
  const subscriptions: SubscriptionStats[] = [];
  let ready = 0;
  let delayed = 0;
  let inFlight = 0;
  let dead = 0;
  for (const name of state.subscriptionNames()) {
    const sub = state.subs.get(name);
    if (sub === undefined) continue;
    const s = {
      ready: 0,
      delayed: 0,
      inFlight: 0,
      expiredLeases: 0,
      oldest: undefined as number | undefined,
      lowestUnsettled: undefined as number | undefined,
    };
    for (const m of state.messages.values()) {
      if (isSettled(m, sub)) continue;
      if (s.oldest === undefined || m.msg.enqueuedAt < s.oldest) s.oldest = m.msg.enqueuedAt;
      if (s.lowestUnsettled === undefined || m.msg.offset < s.lowestUnsettled)
        s.lowestUnsettled = m.msg.offset;
      const d = sub.deliveries.get(m.msg.offset);
      if (d?.lease !== undefined) {
        s.inFlight += 1;
        if (d.lease.deadline <= now) s.expiredLeases += 1;
      } else if (runnableAt(m, d) <= now) s.ready += 1;
      else s.delayed += 1;
    }
    // Cold segments (not in memory): counted by their run_at range.
    for (const seg of state.coldSegments) {
      if (sub.start > seg.last) continue; // it owes none of them
      const live = liveCount(seg);
      const [earliest] = coldRunAt(seg);
      if (earliest <= now) s.ready += live;
      else s.delayed += live;
      if (s.oldest === undefined || earliest < s.oldest) s.oldest = earliest;
      if (s.lowestUnsettled === undefined || seg.first < s.lowestUnsettled) s.lowestUnsettled = seg.first;
    }
    subscriptions.push({
      name,
      createdAt: sub.createdAt,
      ready: s.ready,
      delayed: s.delayed,
      inFlight: s.inFlight,
      expiredLeases: s.expiredLeases,
      dead: sub.dead.size,
      oldestUnackedAgeMs: s.oldest === undefined ? undefined : Math.max(0, now - s.oldest),
      lag: s.lowestUnsettled === undefined ? 0 : state.nextOffset - s.lowestUnsettled,
      counters: { ...sub.counters },
    });
    ready += s.ready;
    delayed += s.delayed;
    inFlight += s.inFlight;
    dead += sub.dead.size;
  }
  return {
    queue: state.queue,
    shard: state.shard,
    nextOffset: state.nextOffset,
    messages: state.messages.size + state.coldMessages,
    sealedInMemory: state.messages.size - state.tail.size,
    coldMessages: state.coldMessages,
    ready,
    delayed,
    inFlight,
    dead,
    dedupIds: state.dedup.size,
    approxBytes: state.approxBytes(),
    maxDocumentBytes: state.config.maxDocumentBytes,
    broker: state.broker,
    counters: { ...state.counters },
    subscriptions,
  };
}

/**
 * The earliest time a delayed or backed-off message becomes claimable, or a
 * lease runs out (and needs an `expire`); undefined when nothing is waiting.
 *
 * Pass `now` (recommended): wake-ups already due are moved into the
 * runnable index first, so the answer is a future time, or a past lease
 * deadline that only an `expire` commit clears. Without `now` a due but
 * unclaimed delayed message keeps being reported, and a timer armed on it
 * would fire in a loop.
 */
export function nextWakeAt(state: ShardState, now?: number): number | undefined {
  let earliest: number | undefined;
  for (const sub of state.subs.values()) {
    if (now !== undefined) promoteDue(state, sub, now);
    const at = nextDelayedAt(state, sub);
    if (at !== undefined && (earliest === undefined || at < earliest)) earliest = at;
  }
  for (;;) {
    const e = state.leaseIndex.peek();
    if (e === undefined) break;
    const d = state.subs.get(e.sub.name) === e.sub ? e.sub.deliveries.get(e.offset) : undefined;
    if (d?.lease !== undefined && d.attempt === e.attempt && d.lease.deadline === e.deadline) {
      if (earliest === undefined || e.deadline < earliest) earliest = e.deadline;
      break;
    }
    state.leaseIndex.pop(); // stale
  }
  return earliest;
}

/** True when a claim on `subscription` at `now` would return at least one message (false if it does not exist). */
export function hasRunnable(state: ShardState, subscription: string, now: number): boolean {
  const sub = state.subs.get(subscription);
  return sub !== undefined && peekRunnable(state, sub, now) !== undefined;
}

/**
 * The earliest time an `expire` would forget a dedup id or drop a retained
 * message; undefined when none is pending. (Lease expiries are covered by
 * {@link nextWakeAt}.) May report a time that turns out to need no work.
 */
export function nextHousekeepingAt(state: ShardState): number | undefined {
  const head = state.dedupIndex.peek()?.expiresAt;
  const sealed = state.sealedDedup.nextExpiry();
  const entry = head === undefined ? sealed : sealed === undefined ? head : Math.min(head, sealed);
  const segment = state.dedupSegmentIndex.peek()?.expiresAt;
  const dedup = entry === undefined ? segment : segment === undefined ? entry : Math.min(entry, segment);
  const retention = state.retentionIndex.peek()?.at;
  if (dedup === undefined) return retention;
  if (retention === undefined) return dedup;
  return Math.min(dedup, retention);
}
