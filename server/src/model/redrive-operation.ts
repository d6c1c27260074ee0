/**
 * Redrive: give dead letters of one subscription another chance.
 *
 * Selects the subscription's dead letters — all, those whose message id is
 * in `ids`, and/or at most `limit` of them, oldest first — removes them from
 * the dead-letter list and makes each message runnable again at once in that
 * subscription only, with a fresh attempt budget (`attempts_at_redrive` is
 * set to the deliveries made so far; receipt attempt numbers keep growing,
 * so a receipt from before the redrive can never settle the new delivery).
 *
 * If the message is still in the shard (another subscription still holds it,
 * or retention keeps it), it becomes a *targeted* message: its `targets`
 * list names exactly the subscriptions that still owe work on it. If it had
 * left the shard, it comes back from the dead letter's full copy as a record
 * with `targets: [subscription]`, keeping its id and original offset
 * (offsets are never reused for a different message). Other subscriptions,
 * including ones created later with "earliest", never see it again.
 *
 * Requested ids that are not dead letters of the subscription are reported
 * in `missing`. A re-inserted message whose id is meanwhile used by another
 * retained message is refused (`failed_precondition`, nothing redriven).
 *
 * Cost: O(dead letters of the subscription + redriven x subscriptions).
 */
import { CasqError } from "../errors.ts";
import { messageBytes } from "./approx-size.ts";
import { coldSegmentAt } from "./cold-segment-index.ts";
import { removeDeadLetter } from "./dead-letter-segments.ts";
import { checkId, checkInteger } from "./input-validation.ts";
import type { RedriveOperation, RedriveResult } from "./operations.ts";
import { retainInTail, unsealToTail } from "./segment-mechanics.ts";
import { addDelivery, isSettled, removeDelivery, requireSubscription, schedule } from "./shard-mechanics.ts";
import type { DeadLetter, MessageRecord, RetainedMessage } from "./shard-records.ts";
import type { ShardState } from "./shard-state.ts";

/** Applies a redrive (see module header). */
export function applyRedrive(state: ShardState, op: RedriveOperation, now: number): RedriveResult {
  const sub = requireSubscription(state, op.subscription);
  let wanted: Set<string> | undefined;
  if (op.ids !== undefined) {
    if (!Array.isArray(op.ids))
      throw new CasqError("invalid_argument", "redrive ids must be an array of message ids");
    op.ids.forEach((id, i) => {
      checkId(`redrive id ${i}`, id);
    });
    wanted = new Set(op.ids);
  }
  if (op.limit !== undefined) checkInteger("redrive limit", op.limit, 1, Number.MAX_SAFE_INTEGER);
  const limit = op.limit ?? Number.POSITIVE_INFINITY;

  const chosen: DeadLetter[] = [];
  const found = new Set<string>();
  for (const dl of sub.dead.values()) {
    if (wanted !== undefined) {
      if (!wanted.has(dl.message.id)) continue;
      found.add(dl.message.id);
    } else if (chosen.length >= limit) {
      break;
    }
    if (chosen.length < limit) chosen.push(dl);
  }
  for (const dl of chosen) {
    if (coldSegmentAt(state, dl.message.offset) !== undefined)
      throw new CasqError(
        "unavailable",
        `shard ${state.queue}/${state.shard}: message ${dl.message.offset} is in a segment not in memory yet (being read back); retry the redrive`,
        { queue: state.queue, shard: state.shard },
      );
    const owner = state.ids.get(dl.message.id);
    if (!state.messages.has(dl.message.offset) && owner !== undefined) {
      throw new CasqError(
        "failed_precondition",
        `cannot redrive message ${JSON.stringify(dl.message.id)} (offset ${dl.message.offset}): its id is now used by the message at offset ${owner}; ack or purge that one first, or redrive by other ids`,
        { queue: state.queue, shard: state.shard },
      );
    }
  }

  for (const dl of chosen) {
    const offset = dl.message.offset;
    removeDeadLetter(state, sub, offset); // from the head, or marked gone in its dead-letter segment
    let m = state.messages.get(offset);
    if (m === undefined) {
      m = {
        msg: dl.message,
        targets: [sub.name],
        pending: 1,
        bytes: messageBytes(dl.message),
        segment: undefined,
      };
      retainInTail(state, m);
      state.settledSlots += state.subs.size - 1;
      state.messagesSorted = false;
    } else {
      retarget(state, m, sub.name, dl.message);
    }
    removeDelivery(state, sub, offset); // none expected: a dead letter is settled
    const d = { attempt: dl.attempts, base: dl.attempts, availableAt: undefined, lease: undefined };
    addDelivery(state, sub, offset, d);
    schedule(sub, m, d, now);
    sub.counters.redriven += 1;
    state.counters.redriven += 1;
  }
  const missing = wanted === undefined ? [] : [...wanted].filter((id) => !found.has(id));
  return {
    kind: "redrive",
    subscription: sub.name,
    redriven: chosen.length,
    ids: chosen.map((dl) => dl.message.id),
    missing,
    changed: chosen.length > 0,
  };
}

/** Makes a retained message, settled for `name`, pending again for `name` only (plus whoever still owes it). */
function retarget(state: ShardState, m: RetainedMessage, name: string, whole: MessageRecord): void {
  unsealToTail(state, m, whole); // `targets` changes, so the message must live in the head
  if (m.targets === undefined) {
    const targets: string[] = [];
    for (const sub of state.subs.values()) if (!isSettled(m, sub)) targets.push(sub.name);
    targets.push(name);
    m.targets = targets.sort();
    for (const sub of state.subs.values()) sub.settled.delete(m.msg.offset);
  } else {
    m.targets = [...m.targets, name].sort();
  }
  m.pending += 1;
  state.settledSlots -= 1;
}
