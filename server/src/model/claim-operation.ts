/**
 * Claim: lease up to `max` runnable messages of one subscription to a worker.
 *
 * Order: highest priority first, then lowest offset, among messages that are
 * runnable (`run_at` and any nack backoff reached), not leased, and not
 * settled (acked, dead-lettered or purged) in this subscription. Each claimed
 * message gets a lease until `now + leaseTtlMs` and its attempt counter goes
 * up by one (attempt 1 = first delivery); the receipt `{offset, attempt}`
 * names exactly this delivery.
 *
 * A message is leased to at most one worker per subscription at a time; other
 * subscriptions see it independently (fan-out). An empty claim changes
 * nothing. `max` above the queue's `maxBatch` is capped to it, except in a
 * Work stream's claim (`credited`), which its credit bounds instead.
 *
 * A sealed message whose body is paged out is claimed all the same: the
 * claim names its segment (`bodyIn`) and the broker fills the body in
 * before answering, so claim order never depends on what is in memory.
 * A claim that reaches a cold segment (`cold-segments.ts`) stops there with
 * what it has: the broker warms the segment before its next batch.
 *
 * Cost: O(k log n) for k claimed messages (plus stale index entries skipped,
 * each at most once).
 */
import { checkId, checkInteger, checkLeaseTtl } from "./input-validation.ts";
import type { ClaimedMessage, ClaimOperation, ClaimResult } from "./operations.ts";
import { bodyOf } from "./segment-mechanics.ts";
import { leaseMessage, maxAttemptsOf, peekRunnable, requireSubscription } from "./shard-mechanics.ts";
import type { ShardState } from "./shard-state.ts";

const NO_PAYLOAD = new Uint8Array(0);
const NO_HEADERS: Readonly<Record<string, string>> = Object.freeze(Object.create(null));

/** Applies a claim (see module header). */
export function applyClaim(state: ShardState, op: ClaimOperation, now: number): ClaimResult {
  const sub = requireSubscription(state, op.subscription);
  checkId("worker id", op.workerId);
  checkInteger("claim max", op.max, 1, Number.MAX_SAFE_INTEGER);
  if (op.leaseTtlMs !== undefined) checkLeaseTtl("lease_ttl_ms", op.leaseTtlMs);
  const ttl = op.leaseTtlMs ?? state.config.leaseTtlMs;
  const max = op.credited === true ? op.max : Math.min(op.max, state.config.maxBatch);

  const messages: ClaimedMessage[] = [];
  while (messages.length < max) {
    const next = peekRunnable(state, sub, now);
    if (next === undefined || next.cold !== undefined) break; // a cold segment: warmed before the next batch
    sub.ready.pop();
    const { m } = next;
    const d = leaseMessage(state, sub, m, op.workerId, ttl, now);
    const msg = m.msg;
    const whole = bodyOf(state, m);
    messages.push({
      id: msg.id,
      offset: msg.offset,
      payload: whole?.payload ?? NO_PAYLOAD,
      headers: whole?.headers ?? NO_HEADERS,
      key: msg.key,
      priority: msg.priority,
      runAt: msg.runAt,
      dedupId: msg.dedupId,
      enqueuedAt: msg.enqueuedAt,
      traceContext: whole?.traceContext,
      subscription: sub.name,
      receipt: { offset: msg.offset, attempt: d.attempt },
      attempt: d.attempt,
      maxAttempts: d.base + maxAttemptsOf(state, msg),
      leaseDeadline: now + ttl,
      bodyIn: whole === undefined ? m.segment?.name : undefined,
    });
  }
  return { kind: "claim", messages, changed: messages.length > 0 };
}
