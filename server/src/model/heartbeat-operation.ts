/**
 * Heartbeat: keep leases alive while a worker is still busy.
 *
 * HEARTBEAT PERSISTENCE RULE — heartbeats must not cost one PUT each.
 * A lease's stored deadline is extended to `now + ttl` (the TTL the lease was
 * claimed with) ONLY when less than half of the TTL remains
 * (`deadline - now < ttl / 2`). Otherwise the heartbeat is answered from
 * memory without changing the state (`changed: false`), and the broker needs
 * no write for it. Consequences:
 * - a worker that heartbeats at least every ttl/2 (the SDKs use ttl/3)
 *   never sees its lease expire in the store;
 * - each lease costs at most ~2 persisted extensions per TTL, and those ride
 *   along in the next group commit with everything else.
 *
 * A receipt is held when it is the message's current delivery in this
 * subscription (same attempt, not settled); a lease that ran out but was not
 * swept by `expire` yet is still held and gets extended. The receipt is the
 * capability: `workerId` is not compared with the lease's worker (a worker
 * that reconnects under a new id keeps its leases). Everything else is
 * reported in `lost`: stop working on it (its ack may still be accepted, see
 * `ack-operation.ts`).
 *
 * Cost: O(receipts x log n).
 */
import { checkId, checkReceipts } from "./input-validation.ts";
import type { HeartbeatExtension, HeartbeatOperation, HeartbeatResult, Receipt } from "./operations.ts";
import { currentDelivery, indexLease, requireSubscription } from "./shard-mechanics.ts";
import type { ShardState } from "./shard-state.ts";

/** Applies a heartbeat (see module header for the persistence rule). */
export function applyHeartbeat(state: ShardState, op: HeartbeatOperation, now: number): HeartbeatResult {
  const sub = requireSubscription(state, op.subscription);
  checkId("worker id", op.workerId);
  checkReceipts(op.receipts, state.config);

  const extended: HeartbeatExtension[] = [];
  const lost: Receipt[] = [];
  let changed = false;
  for (const r of op.receipts) {
    const receipt = { offset: r.offset, attempt: r.attempt };
    const current = currentDelivery(state, sub, r.offset, r.attempt);
    const lease = current?.d.lease;
    if (current === undefined || lease === undefined) {
      lost.push(receipt);
      continue;
    }
    if (lease.deadline - now < lease.ttlMs / 2) {
      current.d.lease = { ...lease, deadline: now + lease.ttlMs };
      indexLease(state, sub, r.offset, current.d);
      changed = true;
    }
    extended.push({ receipt, deadline: current.d.lease?.deadline ?? lease.deadline });
  }
  return { kind: "heartbeat", extended, lost, changed };
}
