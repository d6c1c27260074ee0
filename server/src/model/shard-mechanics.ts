/**
 * The primitive state transitions every operation is built from
 * (model-internal).
 *
 * Vocabulary:
 * - A message is *settled* for a subscription when that subscription is done
 *   with it: acked, dead-lettered, purged, or it was never meant for it
 *   (enqueued before the subscription was created with "latest", or a
 *   redriven message addressed to other subscriptions). Settled is final
 *   until an operator redrives a dead letter.
 * - An unsettled message is *in flight* when it has a lease, otherwise
 *   *pending*; a pending message is *runnable* once its `run_at` and its
 *   nack backoff (`available_at`) have passed.
 * - A message leaves the shard (*dropped*) once every subscription settled
 *   it and its retention passed.
 *
 * Indexes use lazy deletion (see `binary-heap.ts`): pushing is cheap, and
 * whoever pops an entry re-checks it against the state. Each function here
 * costs O(log n) or O(subscriptions), never O(messages).
 */
import { CasqError } from "../errors.ts";
import { DELIVERY_BYTES, subscriptionBytes } from "./approx-size.ts";
import { BinaryHeap } from "./binary-heap.ts";
import { coldSegmentAt, placeholderLive, placeholderPriority } from "./cold-segment-index.ts";
import { addHeadDeadLetter, removeDeadLetter } from "./dead-letter-segments.ts";
import type { MessageView } from "./operations.ts";
import { removeContents } from "./segment-mechanics.ts";
import type { ShardData } from "./shard-data.ts";
import {
  type DelayedEntry,
  type Delivery,
  type MessageMeta,
  type MessageRecord,
  type ReadyEntry,
  type RetainedMessage,
  type SegmentState,
  type SubscriptionCounters,
  type SubscriptionState,
  zeroSubscriptionCounters,
} from "./shard-records.ts";

/** Ready order: higher priority first, then lower offset. */
export function readyBefore(a: ReadyEntry, b: ReadyEntry): boolean {
  return a.priority !== b.priority ? a.priority > b.priority : a.offset < b.offset;
}

/** Wake order: earlier time first, then lower offset. */
export function delayedBefore(a: DelayedEntry, b: DelayedEntry): boolean {
  return a.at !== b.at ? a.at < b.at : a.offset < b.offset;
}

/** A new, empty subscription. */
export function newSubscription(
  name: string,
  createdAt: number,
  start: number,
  counters: SubscriptionCounters = zeroSubscriptionCounters(),
): SubscriptionState {
  return {
    name,
    createdAt,
    start,
    settled: new Set(),
    deliveries: new Map(),
    dead: new Map(),
    headDead: new Map(),
    headDeadBytes: 0,
    deadSegments: new Map(),
    counters,
    ready: new BinaryHeap(readyBefore),
    delayed: new BinaryHeap(delayedBefore),
  };
}

/** Registers a subscription in the state. */
export function addSubscription(state: ShardData, sub: SubscriptionState): void {
  state.subs.set(sub.name, sub);
  state.bytes += subscriptionBytes(sub.name);
}

/** The subscription, or `not_found` telling the user how to create it. */
export function requireSubscription(state: ShardData, name: unknown): SubscriptionState {
  if (typeof name !== "string" || name === "") {
    throw new CasqError("invalid_argument", "subscription name is required");
  }
  const sub = state.subs.get(name);
  if (sub === undefined) {
    throw new CasqError(
      "not_found",
      `subscription "${name}" does not exist on queue ${state.queue} (shard ${state.shard}); create it first (existing: ${[...state.subs.keys()].sort().join(", ") || "none"})`,
      { queue: state.queue, shard: state.shard },
    );
  }
  return sub;
}

/** True when the subscription is done with the message (see module header). */
export function isSettled(m: RetainedMessage, sub: SubscriptionState): boolean {
  if (m.targets !== undefined) return !m.targets.includes(sub.name);
  return m.msg.offset < sub.start || sub.settled.has(m.msg.offset);
}

/** Earliest time the message may be claimed in this subscription. */
export function runnableAt(m: RetainedMessage, d: Delivery | undefined): number {
  const available = d?.availableAt;
  return available !== undefined && available > m.msg.runAt ? available : m.msg.runAt;
}

/** The max-attempts budget of a message (its override or the queue's). */
export function maxAttemptsOf(state: ShardData, m: MessageMeta): number {
  return m.maxAttempts ?? state.config.maxAttempts;
}

/**
 * Puts a pending (unsettled, unleased) message into the subscription's
 * runnable index, or its wake-up index when it is not runnable at `now`
 * (always the wake-up index when `now` is undefined, e.g. while decoding).
 */
export function schedule(
  sub: SubscriptionState,
  m: RetainedMessage,
  d: Delivery | undefined,
  now: number | undefined,
): void {
  const at = runnableAt(m, d);
  if (now !== undefined && at <= now) sub.ready.push({ priority: m.msg.priority, offset: m.msg.offset });
  else sub.delayed.push({ at, offset: m.msg.offset });
}

/** The retained, unsettled, unleased message at `offset`, or undefined. */
export function pendingAt(
  state: ShardData,
  sub: SubscriptionState,
  offset: number,
): { m: RetainedMessage; d: Delivery | undefined } | undefined {
  const m = state.messages.get(offset);
  if (m === undefined || isSettled(m, sub)) return undefined;
  const d = sub.deliveries.get(offset);
  if (d?.lease !== undefined) return undefined;
  return { m, d };
}

/** Moves wake-up entries due at `now` into the runnable index (index-only; the document does not change). */
export function promoteDue(state: ShardData, sub: SubscriptionState, now: number): void {
  for (;;) {
    const top = sub.delayed.peek();
    if (top === undefined || top.at > now) return;
    sub.delayed.pop();
    const cold = top.cold;
    if (cold !== undefined) {
      if (placeholderLive(sub, cold))
        sub.ready.push({ priority: placeholderPriority(cold), offset: cold.first, cold });
      continue;
    }
    const p = pendingAt(state, sub, top.offset);
    if (p === undefined || runnableAt(p.m, p.d) !== top.at) continue; // stale
    sub.ready.push({ priority: p.m.msg.priority, offset: top.offset });
  }
}

/** Drops stale entries from the top of the wake-up index; returns the next valid wake time. */
export function nextDelayedAt(state: ShardData, sub: SubscriptionState): number | undefined {
  for (;;) {
    const top = sub.delayed.peek();
    if (top === undefined) return undefined;
    if (top.cold !== undefined) {
      if (placeholderLive(sub, top.cold)) return top.at;
    } else {
      const p = pendingAt(state, sub, top.offset);
      if (p !== undefined && runnableAt(p.m, p.d) === top.at) return top.at;
    }
    sub.delayed.pop();
  }
}

/**
 * The front of a subscription's claim order: its first runnable message, or
 * (`cold`) a cold segment whose messages come first and must be warmed
 * before they can be claimed (see `cold-segments.ts`).
 */
export type RunnableFront =
  | { readonly m: RetainedMessage; readonly d: Delivery | undefined; readonly cold?: undefined }
  | { readonly m?: undefined; readonly d?: undefined; readonly cold: SegmentState };

/** Drops stale entries from the top of the runnable index; returns the front of the claim order. */
export function peekRunnable(
  state: ShardData,
  sub: SubscriptionState,
  now: number,
): RunnableFront | undefined {
  promoteDue(state, sub, now);
  for (;;) {
    const top = sub.ready.peek();
    if (top === undefined) return undefined;
    if (top.cold !== undefined) {
      if (placeholderLive(sub, top.cold)) return { cold: top.cold };
    } else {
      const p = pendingAt(state, sub, top.offset);
      if (p !== undefined) {
        const at = runnableAt(p.m, p.d);
        if (at <= now) return p;
        // Not runnable at this `now`: backed off again, or asked about with an earlier time
        // than the one that made it runnable (a leader's look before warming a segment, after
        // it). It waits in the wake-up index, so it is never lost (simulation seed 72143455).
        sub.ready.pop();
        sub.delayed.push({ at, offset: top.offset });
        continue;
      }
    }
    sub.ready.pop(); // stale: settled, leased or gone
  }
}

/** Stores a new delivery record. */
export function addDelivery(state: ShardData, sub: SubscriptionState, offset: number, d: Delivery): void {
  sub.deliveries.set(offset, d);
  state.bytes += DELIVERY_BYTES;
}

/** Removes a delivery record, if any. */
export function removeDelivery(state: ShardData, sub: SubscriptionState, offset: number): void {
  if (sub.deliveries.delete(offset)) state.bytes -= DELIVERY_BYTES;
}

/** Indexes the current lease of a delivery for the expiry sweep. */
export function indexLease(state: ShardData, sub: SubscriptionState, offset: number, d: Delivery): void {
  if (d.lease === undefined) return;
  state.leaseIndex.push({ deadline: d.lease.deadline, sub, offset, attempt: d.attempt });
}

/** Leases a pending message to a worker: bumps the attempt, clears backoff, indexes the deadline. */
export function leaseMessage(
  state: ShardData,
  sub: SubscriptionState,
  m: RetainedMessage,
  worker: string,
  ttlMs: number,
  now: number,
): Delivery {
  const offset = m.msg.offset;
  let d = sub.deliveries.get(offset);
  if (d === undefined) {
    d = { attempt: 0, base: 0, availableAt: undefined, lease: undefined };
    addDelivery(state, sub, offset, d);
  }
  d.attempt += 1;
  d.availableAt = undefined;
  d.lease = { worker, claimedAt: now, deadline: now + ttlMs, ttlMs };
  indexLease(state, sub, offset, d);
  sub.counters.delivered += 1;
  state.counters.delivered += 1;
  return d;
}

/**
 * The delivery `attempt` is the current one for the message at `offset`
 * (no later delivery, not settled, not a pre-redrive receipt).
 */
export function currentDelivery(
  state: ShardData,
  sub: SubscriptionState,
  offset: number,
  attempt: number,
): { m: RetainedMessage; d: Delivery } | undefined {
  const m = state.messages.get(offset);
  if (m === undefined || isSettled(m, sub)) return undefined;
  const d = sub.deliveries.get(offset);
  if (d === undefined || d.attempt !== attempt || d.attempt <= d.base) return undefined;
  return { m, d };
}

/** Removes a message from the shard and every index that names it. */
export function dropMessage(state: ShardData, m: RetainedMessage): void {
  const offset = m.msg.offset;
  state.messages.delete(offset);
  if (state.ids.get(m.msg.id) === offset) state.ids.delete(m.msg.id);
  for (const sub of state.subs.values()) {
    sub.settled.delete(offset);
    removeDelivery(state, sub, offset);
  }
  removeContents(state, m);
  state.settledSlots -= state.subs.size - m.pending;
  state.counters.dropped += 1;
}

/**
 * Called when no subscription owes work on `m` any more: drops it now when
 * its retention has passed, else schedules the drop. Returns true if dropped.
 */
export function onFullySettled(state: ShardData, m: RetainedMessage, now: number): boolean {
  const dropAt = m.msg.enqueuedAt + state.config.retentionMs;
  if (now >= dropAt) {
    dropMessage(state, m);
    return true;
  }
  state.retentionIndex.push({ at: dropAt, offset: m.msg.offset });
  return false;
}

/**
 * Marks an unsettled message settled for `sub` (precondition: it is not).
 * Forgets the delivery state; drops the message if that was the last
 * subscription and retention allows. Returns true if the message was dropped.
 */
export function settle(state: ShardData, m: RetainedMessage, sub: SubscriptionState, now: number): boolean {
  const offset = m.msg.offset;
  if (m.targets !== undefined) m.targets = m.targets.filter((name) => name !== sub.name);
  else sub.settled.add(offset);
  removeDelivery(state, sub, offset);
  m.pending -= 1;
  state.settledSlots += 1;
  return m.pending === 0 ? onFullySettled(state, m, now) : false;
}

/**
 * Moves the subscription's `start` up past offsets it has settled (or that
 * left the shard), forgetting them from `settled`: the ack state stays
 * compact. Index-only (the meaning does not change). Amortised O(1) per
 * offset over the shard's life; stops at the first untargeted retained
 * message it still owes.
 */
export function compactAckState(state: ShardData, sub: SubscriptionState): void {
  let start = sub.start;
  while (start < state.next) {
    const cold = coldSegmentAt(state, start);
    if (cold !== undefined) {
      if (!cold.gone.has(start)) break; // it owes the cold segment's messages from here on
    } else {
      const m = state.messages.get(start);
      if (m !== undefined && m.targets === undefined && !sub.settled.has(start)) break;
    }
    sub.settled.delete(start);
    start += 1;
  }
  sub.start = start;
}

/** Evicts the oldest dead letters of `sub` beyond the queue's limit; returns how many. */
export function evictDeadLetters(state: ShardData, sub: SubscriptionState): number {
  let evicted = 0;
  const limit = state.config.deadLetterLimit;
  while (sub.dead.size > limit) {
    const first = sub.dead.keys().next();
    if (first.done === true) break;
    removeDeadLetter(state, sub, first.value);
    evicted += 1;
  }
  sub.counters.deadEvicted += evicted;
  state.counters.deadEvicted += evicted;
  return evicted;
}

/**
 * Moves an unsettled message to the subscription's dead letters (a full
 * copy: `whole` is its whole record, see `bodyOf`), settling it there.
 */
export function deadLetter(
  state: ShardData,
  sub: SubscriptionState,
  m: RetainedMessage,
  whole: MessageRecord,
  reason: string,
  now: number,
): void {
  const offset = m.msg.offset;
  const attempts = sub.deliveries.get(offset)?.attempt ?? 0;
  addHeadDeadLetter(state, sub, { message: whole, reason, attempts, deadAt: now });
  sub.counters.deadLettered += 1;
  state.counters.deadLettered += 1;
  settle(state, m, sub, now);
  evictDeadLetters(state, sub);
}

/** The public view of a stored message. */
export function messageView(m: MessageRecord): MessageView {
  return {
    id: m.id,
    offset: m.offset,
    payload: m.payload,
    headers: m.headers,
    key: m.key,
    priority: m.priority,
    runAt: m.runAt,
    maxAttempts: m.maxAttempts,
    dedupId: m.dedupId,
    enqueuedAt: m.enqueuedAt,
    traceContext: m.traceContext,
  };
}

/**
 * A null-prototype copy of a string map with sorted keys (so `__proto__` is
 * an ordinary key). Every empty map is one shared frozen object: most
 * messages have no headers, and an empty null-prototype object per retained
 * message was two objects (it and its dictionary) for the collector to trace.
 */
export function sortedStringMap(map: Readonly<Record<string, string>>): Record<string, string> {
  const keys = Object.keys(map);
  if (keys.length === 0) return EMPTY_STRING_MAP;
  const out = Object.create(null) as Record<string, string>;
  for (const key of keys.sort()) out[key] = map[key] as string;
  return out;
}

const EMPTY_STRING_MAP: Record<string, string> = Object.freeze(Object.create(null));
