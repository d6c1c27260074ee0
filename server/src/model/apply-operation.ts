/**
 * The one entry point that changes a shard: `applyOperation(state, op, now)`.
 *
 * Contract (what the broker's group commit relies on):
 * - deterministic: the outcome depends only on (state, op, now) — no clock,
 *   no randomness, no I/O;
 * - in place: the state is mutated (copying a large document per operation
 *   would make a commit O(queue) per op);
 * - atomic: an operation either applies completely or throws a `CasqError`
 *   and leaves the state exactly as it was (every operation validates
 *   everything before its first mutation), so one bad operation in a batch
 *   does not disturb the others;
 * - `changed: false` in the result means the document is untouched.
 *
 * Each kind lives in its own module (`<kind>-operation.ts`), whose header
 * explains its semantics.
 */
import { CasqError } from "../errors.ts";
import { applyAck } from "./ack-operation.ts";
import { applyClaim } from "./claim-operation.ts";
import { applyEnqueue } from "./enqueue-operation.ts";
import { applyExpire } from "./expire-operation.ts";
import { applyHeartbeat } from "./heartbeat-operation.ts";
import { applyNack } from "./nack-operation.ts";
import type { Operation, OperationResult, ResultFor } from "./operations.ts";
import { applyPurge } from "./purge-operation.ts";
import { applyRedrive } from "./redrive-operation.ts";
import { checkNow, type ShardState } from "./shard-state.ts";
import { applyCreateSubscription, applyDeleteSubscription } from "./subscription-operations.ts";
import { applyUpdateConfig } from "./update-config-operation.ts";

/**
 * Applies one operation to the shard at time `now` (ms since the epoch).
 * Mutates `state` and returns the result of the operation's kind, or throws a
 * `CasqError` and leaves `state` unchanged.
 */
export function applyOperation<O extends Operation>(state: ShardState, op: O, now: number): ResultFor<O> {
  checkNow(now);
  return dispatch(state, op, now) as ResultFor<O>;
}

function dispatch(state: ShardState, op: Operation, now: number): OperationResult {
  if (typeof op !== "object" || op === null)
    throw new CasqError("invalid_argument", "operation must be an object");
  switch (op.kind) {
    case "enqueue":
      return applyEnqueue(state, op, now);
    case "claim":
      return applyClaim(state, op, now);
    case "heartbeat":
      return applyHeartbeat(state, op, now);
    case "ack":
      return applyAck(state, op, now);
    case "nack":
      return applyNack(state, op, now);
    case "expire":
      return applyExpire(state, op, now);
    case "createSubscription":
      return applyCreateSubscription(state, op, now);
    case "deleteSubscription":
      return applyDeleteSubscription(state, op, now);
    case "purge":
      return applyPurge(state, op, now);
    case "redrive":
      return applyRedrive(state, op, now);
    case "updateConfig":
      return applyUpdateConfig(state, op, now);
    default:
      throw new CasqError(
        "invalid_argument",
        `unknown operation kind ${JSON.stringify((op as { kind?: unknown }).kind)}`,
      );
  }
}
