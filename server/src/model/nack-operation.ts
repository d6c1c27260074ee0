/**
 * Nack: a worker gives deliveries back because it failed (or chose not) to
 * process them.
 *
 * Per receipt that is the current delivery (same rule as ack):
 * - `dead_lettered` when the nack asks for it (`deadLetter: true`) or the
 *   message has used up its attempts (`attempt - attemptsAtRedrive >=
 *   maxAttempts`); the dead letter keeps a full copy, the reason, the
 *   attempts and the time.
 * - otherwise `retry_scheduled`: the lease is released and the message
 *   becomes claimable again at `availableAt = now + (delayMs ?? backoff)`,
 *   where backoff is the queue's exponential policy for the number of
 *   failed attempts, with deterministic jitter (see `backoff.ts`).
 * - with `release: true` (a worker handing back jobs it prefetched but never
 *   started): `retry_scheduled` at once, and the delivery does not count
 *   against `maxAttempts` (like a redrive, it raises the delivery's
 *   "attempts that do not count"), so a release never dead-letters.
 * A nack repeated for a delivery that is already released (retried after a
 * lost response, or after the lease was swept) changes nothing and answers
 * `retry_scheduled` with the time already stored (with `deadLetter: true`
 * it still dead-letters the message: nobody else holds it). A dead-letter
 * nack repeated after it succeeded answers `dead_lettered` again while the
 * dead letter of that attempt is kept. Anything else (acked, redelivered,
 * dead-lettered by someone else) is `lease_lost`.
 *
 * Cost: O(receipts x log n).
 */
import { CasqError } from "../errors.ts";
import { backoffDelayMs } from "./backoff.ts";
import { checkInteger, checkReceipts, MAX_DELAY_MS } from "./input-validation.ts";
import type { NackItemResult, NackOperation, NackResult } from "./operations.ts";
import { bodyNotPagedIn, bodyOf, requireBody } from "./segment-mechanics.ts";
import {
  currentDelivery,
  deadLetter,
  maxAttemptsOf,
  requireSubscription,
  runnableAt,
  schedule,
} from "./shard-mechanics.ts";
import type { MessageRecord } from "./shard-records.ts";
import type { ShardState } from "./shard-state.ts";

/** Longest stored failure reason, in characters; longer ones are cut. */
export const MAX_REASON_LENGTH = 2048;

/** Cuts a failure reason to {@link MAX_REASON_LENGTH} characters. */
export function truncateReason(reason: string): string {
  return reason.length <= MAX_REASON_LENGTH ? reason : `${reason.slice(0, MAX_REASON_LENGTH - 1)}…`;
}

/** Applies a nack (see module header). */
export function applyNack(state: ShardState, op: NackOperation, now: number): NackResult {
  const sub = requireSubscription(state, op.subscription);
  checkReceipts(op.receipts, state.config);
  if (op.delayMs !== undefined) checkInteger("nack delay_ms", op.delayMs, 0, MAX_DELAY_MS);
  if (op.reason !== undefined && typeof op.reason !== "string") {
    throw new CasqError("invalid_argument", "nack reason must be a string");
  }
  if (op.deadLetter !== undefined && typeof op.deadLetter !== "boolean") {
    throw new CasqError("invalid_argument", "nack dead_letter must be a boolean");
  }
  if (op.release === true && (op.deadLetter === true || op.delayMs !== undefined)) {
    throw new CasqError(
      "invalid_argument",
      "a release hands jobs back at once: do not combine it with dead_letter or delay",
    );
  }
  const reason = op.reason === undefined ? undefined : truncateReason(op.reason);

  // A dead letter is a whole copy: a sealed message's body must be in memory
  // before anything changes (the broker pages it in ahead of the batch).
  const bodies = new Map<number, MessageRecord>();
  if (op.release !== true)
    for (const r of op.receipts) {
      const current = currentDelivery(state, sub, r.offset, r.attempt);
      if (current === undefined) continue;
      const { m, d } = current;
      if (d.lease === undefined && op.deadLetter !== true) continue;
      if (op.deadLetter !== true && d.attempt - d.base < maxAttemptsOf(state, m.msg)) continue;
      const whole = bodyOf(state, m);
      if (whole === undefined) throw bodyNotPagedIn(state, r.offset);
      bodies.set(r.offset, whole);
    }

  const results: NackItemResult[] = [];
  let changed = false;
  for (const r of op.receipts) {
    const receipt = { offset: r.offset, attempt: r.attempt };
    const current = currentDelivery(state, sub, r.offset, r.attempt);
    if (current === undefined) {
      // A retried dead-letter nack finds its own dead letter: report the same outcome again.
      const dead = sub.dead.get(r.offset);
      results.push({ receipt, outcome: dead?.attempts === r.attempt ? "dead_lettered" : "lease_lost" });
      continue;
    }
    const { m, d } = current;
    if (d.lease === undefined && op.deadLetter !== true) {
      results.push({ receipt, outcome: "retry_scheduled", availableAt: Math.max(now, runnableAt(m, d)) });
      continue;
    }
    changed = true;
    if (op.release === true) {
      // The worker never started it: this delivery does not count as an attempt.
      d.base += 1;
      d.lease = undefined;
      d.availableAt = now;
      schedule(sub, m, d, now);
      sub.counters.redelivered += 1;
      state.counters.redelivered += 1;
      results.push({ receipt, outcome: "retry_scheduled", availableAt: runnableAt(m, d) });
      continue;
    }
    const failures = d.attempt - d.base;
    const max = maxAttemptsOf(state, m.msg);
    if (op.deadLetter === true || failures >= max) {
      const why =
        reason ??
        (op.deadLetter === true
          ? `dead-lettered by the worker on attempt ${d.attempt}`
          : `nacked on attempt ${d.attempt}; no attempts left (max_attempts ${max})`);
      deadLetter(state, sub, m, bodies.get(r.offset) ?? requireBody(m.msg), why, now);
      results.push({ receipt, outcome: "dead_lettered" });
      continue;
    }
    const delay = op.delayMs ?? backoffDelayMs(state.config.backoff, failures, m.msg.id, d.attempt);
    d.lease = undefined;
    d.availableAt = now + delay;
    schedule(sub, m, d, now);
    sub.counters.redelivered += 1;
    state.counters.redelivered += 1;
    results.push({ receipt, outcome: "retry_scheduled", availableAt: runnableAt(m, d) });
  }
  return { kind: "nack", results, changed };
}
