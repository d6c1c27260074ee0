/**
 * UpdateConfig: change the queue config stored in the shard.
 *
 * The patch is validated field by field and as a whole (see
 * `queue-config.ts`); a rejected patch changes nothing. Effects of a change:
 * - `leaseTtlMs`, `maxAttempts`, `backoff`: apply to claims, nacks and
 *   expiries from now on (existing leases keep their deadline and TTL);
 * - `dedupWindowMs`: applies to dedup ids enqueued from now on;
 * - `retentionMs`: applies at once to every settled message (the next
 *   `expire` drops what is now past retention);
 * - `deadLetterLimit`: lowering it evicts the oldest dead letters now;
 * - size limits: apply to the next enqueue (a shard already above a lowered
 *   `maxDocumentBytes` refuses enqueues until it is drained).
 *
 * O(messages) when the retention changes, else O(1) plus evictions.
 */
import type { UpdateConfigOperation, UpdateConfigResult } from "./operations.ts";
import { mergeConfig, sameConfig } from "./queue-config.ts";
import { evictDeadLetters } from "./shard-mechanics.ts";
import type { ShardState } from "./shard-state.ts";

/** Applies an updateConfig (see module header). */
export function applyUpdateConfig(
  state: ShardState,
  op: UpdateConfigOperation,
  _now: number,
): UpdateConfigResult {
  const next = mergeConfig(state.config, op.patch);
  const before = state.config;
  if (sameConfig(before, next)) {
    return { kind: "updateConfig", config: before, deadEvicted: 0, changed: false };
  }
  state.cfg = next;
  if (next.retentionMs !== before.retentionMs) {
    state.retentionIndex.clear();
    for (const m of state.messages.values()) {
      if (m.pending === 0)
        state.retentionIndex.push({ at: m.msg.enqueuedAt + next.retentionMs, offset: m.msg.offset });
    }
  }
  let deadEvicted = 0;
  if (next.deadLetterLimit < before.deadLetterLimit) {
    for (const sub of state.subs.values()) deadEvicted += evictDeadLetters(state, sub);
  }
  return { kind: "updateConfig", config: next, deadEvicted, changed: true };
}
