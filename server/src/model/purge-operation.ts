/**
 * Purge: throw work away, for operators.
 *
 * - `{ subscription }`: every message the subscription has not settled —
 *   ready, delayed or in flight — counts as done for it (its leases are
 *   dropped). Other subscriptions are not affected. A worker that later acks
 *   one of those receipts gets `already_acked` (the message is settled; the
 *   ack is harmless), and its heartbeats report the lease lost.
 * - `{}`: every message leaves the shard for every subscription, leases
 *   included. Dead letters and dedup ids stay (a producer retrying with the
 *   same dedup id within the window still gets the original back).
 * - `{ subscription, deadLetters: true }`: clears that subscription's dead
 *   letters instead; `{ deadLetters: true }`: those of every subscription
 *   (their dead-letter segments retire at once, without being read).
 *
 * O(messages) or O(dead letters): an administrative operation.
 */
import { requireWarm } from "./cold-segments.ts";
import { dropAllDeadLetters } from "./dead-letter-segments.ts";
import type { PurgeOperation, PurgeResult } from "./operations.ts";
import { dropMessage, isSettled, requireSubscription, settle } from "./shard-mechanics.ts";
import type { ShardState } from "./shard-state.ts";

/** Applies a purge (see module header). */
export function applyPurge(state: ShardState, op: PurgeOperation, now: number): PurgeResult {
  const only = op.subscription === undefined ? undefined : requireSubscription(state, op.subscription);
  const subs = only === undefined ? [...state.subs.values()] : [only];
  const result = { kind: "purge" as const, subscription: only?.name };

  if (op.deadLetters === true) {
    let deadLettersPurged = 0;
    for (const sub of subs) deadLettersPurged += dropAllDeadLetters(state, sub);
    return {
      ...result,
      messagesPurged: 0,
      leasesDropped: 0,
      deadLettersPurged,
      changed: deadLettersPurged > 0,
    };
  }
  requireWarm(state, "purge");

  let leasesDropped = 0;
  for (const sub of subs)
    for (const d of sub.deliveries.values()) if (d.lease !== undefined) leasesDropped += 1;

  let messagesPurged = 0;
  if (only !== undefined) {
    const unsettled = [...state.messages.values()].filter((m) => !isSettled(m, only));
    for (const m of unsettled) settle(state, m, only, now);
    only.ready.clear(); // nothing is pending for it any more; its lease-index entries go stale
    only.delayed.clear();
    messagesPurged = unsettled.length;
    only.counters.purged += messagesPurged;
    state.counters.purged += messagesPurged;
  } else {
    for (const m of [...state.messages.values()]) {
      for (const sub of subs) {
        if (isSettled(m, sub)) continue;
        sub.counters.purged += 1;
        state.counters.purged += 1;
      }
      dropMessage(state, m); // also forgets its delivery records
      messagesPurged += 1;
    }
    state.retentionIndex.clear();
    state.leaseIndex.clear();
    for (const sub of subs) {
      sub.ready.clear();
      sub.delayed.clear();
    }
  }
  return { ...result, messagesPurged, leasesDropped, deadLettersPurged: 0, changed: messagesPurged > 0 };
}
