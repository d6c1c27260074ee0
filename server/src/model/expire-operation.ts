/**
 * Expire: the housekeeping sweep due at `now`. The broker includes one in
 * every commit, so the document is always swept as of its last write.
 *
 * 1. Leases whose deadline passed (`deadline <= now`) count as a failed
 *    attempt: if the message has attempts left it becomes claimable again
 *    right away (no backoff: the worker probably died, the lease wait was the
 *    delay) and its next claim gets attempt + 1; if not, it is dead-lettered
 *    with the reason "lease expired". A dead letter is a whole copy, so
 *    when the message is sealed and its body is paged out the expiry waits
 *    for a later sweep (the broker pages due bodies in ahead of a batch).
 * 2. Dedup ids whose window passed are forgotten, and a dedup segment whose
 *    entries all expired is retired (`dedup-segments.ts`).
 * 3. Messages every subscription has settled are dropped once
 *    `enqueued_at + retention_ms` passed.
 *
 * Delayed messages need no sweep: their `run_at` / `available_at` is stored
 * and they simply become claimable when it passes.
 *
 * Cost: O(due items x log n); nothing that is not due is looked at.
 */

import { forgetDedup, retireExpiredDedupSegments } from "./dedup-segments.ts";
import type { ExpireOperation, ExpireResult } from "./operations.ts";
import { bodyOf } from "./segment-mechanics.ts";
import { deadLetter, dropMessage, maxAttemptsOf, schedule } from "./shard-mechanics.ts";
import type { LeaseEntry } from "./shard-records.ts";
import type { ShardState } from "./shard-state.ts";

/** Applies an expire sweep (see module header). */
export function applyExpire(state: ShardState, _op: ExpireOperation, now: number): ExpireResult {
  let leasesExpired = 0;
  let redelivered = 0;
  let deadLettered = 0;
  // Expiries that would dead-letter a sealed message whose body is paged out
  // wait for the next sweep (the broker pages it in meanwhile).
  const deferred: LeaseEntry[] = [];
  for (;;) {
    const e = state.leaseIndex.peek();
    if (e === undefined || e.deadline > now) break;
    state.leaseIndex.pop();
    if (state.subs.get(e.sub.name) !== e.sub) continue; // subscription deleted
    const d = e.sub.deliveries.get(e.offset);
    const lease = d?.lease;
    if (d === undefined || lease === undefined || d.attempt !== e.attempt || lease.deadline !== e.deadline) {
      continue; // settled, released, extended or re-claimed since
    }
    const m = state.messages.get(e.offset);
    if (m === undefined) continue; // cannot happen: delivery records go with the message
    const max = maxAttemptsOf(state, m.msg);
    const whole = d.attempt - d.base >= max ? bodyOf(state, m) : undefined;
    if (d.attempt - d.base >= max && whole === undefined) {
      deferred.push(e);
      continue;
    }
    leasesExpired += 1;
    if (whole !== undefined) {
      deadLetter(
        state,
        e.sub,
        m,
        whole,
        `lease expired on attempt ${d.attempt} (worker ${lease.worker} neither acked nor heartbeated within ${lease.ttlMs} ms); no attempts left (max_attempts ${max})`,
        now,
      );
      deadLettered += 1;
    } else {
      d.lease = undefined;
      schedule(e.sub, m, d, now);
      e.sub.counters.redelivered += 1;
      state.counters.redelivered += 1;
      redelivered += 1;
    }
  }

  for (const e of deferred) state.leaseIndex.push(e);

  let dedupPruned = 0;
  let headDedupChanged = false;
  for (;;) {
    const e = state.dedupIndex.peek();
    if (e === undefined || e.expiresAt > now) break;
    state.dedupIndex.pop();
    if (state.recentDedup.get(e.dedupId)?.expiresAt !== e.expiresAt) continue; // replaced or sealed since
    if (forgetDedup(state, e.dedupId)) headDedupChanged = true;
    dedupPruned += 1;
  }
  dedupPruned += state.sealedDedup.expire(now);
  // A sealed entry is forgotten in memory only; its dedup segment leaves the head once all its entries expired.
  if (retireExpiredDedupSegments(state, now) > 0) headDedupChanged = true;

  let messagesDropped = 0;
  const retention = state.config.retentionMs;
  for (;;) {
    const e = state.retentionIndex.peek();
    if (e === undefined || e.at > now) break;
    state.retentionIndex.pop();
    const m = state.messages.get(e.offset);
    if (m === undefined || m.pending !== 0 || m.msg.enqueuedAt + retention > now) continue;
    dropMessage(state, m);
    messagesDropped += 1;
  }

  const changed = leasesExpired + messagesDropped > 0 || headDedupChanged;
  return { kind: "expire", leasesExpired, redelivered, deadLettered, dedupPruned, messagesDropped, changed };
}
