/**
 * Ack: settle deliveries as done. Final: an acked message is never delivered
 * to that subscription again.
 *
 * Per receipt:
 * - `acked` when the receipt is the message's current delivery in this
 *   subscription: no later delivery was made and it is not settled. This
 *   includes a lease that ran out (swept by `expire` or not) as long as no
 *   other worker claimed the message since, and a delivery that was nacked
 *   but not yet re-claimed: the work is done and nobody else holds it.
 * - `already_acked` when the message is already settled for this
 *   subscription (acked before, purged, or gone from the shard) — an ack
 *   retried after a lost response lands here, so acks are idempotent.
 * - `lease_lost` when the message was delivered again as a later attempt,
 *   or dead-lettered (and that dead letter is still kept), or the receipt
 *   names no delivery at all. Nothing changes.
 *
 * A message every subscription has settled leaves the shard (at once, or
 * when its retention passes). Cost: O(receipts x subscriptions).
 */
import { checkReceipts } from "./input-validation.ts";
import type { AckItemResult, AckOperation, AckResult } from "./operations.ts";
import { currentDelivery, isSettled, requireSubscription, settle } from "./shard-mechanics.ts";
import type { ShardState } from "./shard-state.ts";

/** Applies an ack (see module header). */
export function applyAck(state: ShardState, op: AckOperation, now: number): AckResult {
  const sub = requireSubscription(state, op.subscription);
  checkReceipts(op.receipts, state.config);

  const results: AckItemResult[] = [];
  let changed = false;
  for (const r of op.receipts) {
    const receipt = { offset: r.offset, attempt: r.attempt };
    const current = currentDelivery(state, sub, r.offset, r.attempt);
    if (current !== undefined) {
      const claimedAt = current.d.lease?.claimedAt;
      settle(state, current.m, sub, now);
      sub.counters.acked += 1;
      state.counters.acked += 1;
      changed = true;
      results.push({ receipt, outcome: "acked", ...(claimedAt === undefined ? {} : { claimedAt }) });
      continue;
    }
    const m = state.messages.get(r.offset);
    const settledHere = r.offset < state.next && (m === undefined || isSettled(m, sub));
    const outcome = settledHere && !sub.dead.has(r.offset) ? "already_acked" : "lease_lost";
    results.push({ receipt, outcome });
  }
  return { kind: "ack", results, changed };
}
