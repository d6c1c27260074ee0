/**
 * Read-only views for operators (CLI `inspect`, admin RPCs): dead letters of
 * a subscription and where one message stands in every subscription.
 * Nothing here changes the state.
 */

import type { MessageView } from "./operations.ts";
import { isSettled, messageView, requireSubscription, runnableAt } from "./shard-mechanics.ts";
import type { MessageMeta } from "./shard-records.ts";
import type { ShardState } from "./shard-state.ts";

/** One dead letter as shown to operators. */
export interface DeadLetterView {
  readonly message: MessageView;
  readonly reason: string;
  /** Deliveries made before it died. */
  readonly attempts: number;
  readonly deadAt: number;
}

/**
 * Dead letters of a subscription, oldest first, starting after `afterOffset`
 * in that order (for paging: pass the last offset you got). `not_found` if
 * the subscription does not exist. O(dead letters).
 */
export function listDeadLetters(
  state: ShardState,
  subscription: string,
  options: { limit?: number; afterOffset?: number } = {},
): DeadLetterView[] {
  const sub = requireSubscription(state, subscription);
  const limit = options.limit ?? 100;
  const out: DeadLetterView[] = [];
  let started = options.afterOffset === undefined;
  for (const dl of sub.dead.values()) {
    if (!started) {
      if (dl.message.offset === options.afterOffset) started = true;
      continue;
    }
    if (out.length >= limit) break;
    out.push({
      message: messageView(dl.message),
      reason: dl.reason,
      attempts: dl.attempts,
      deadAt: dl.deadAt,
    });
  }
  return out;
}

/** Where a message stands in one subscription. */
export type MessageStatus =
  | { readonly state: "pending"; readonly runnableAt: number; readonly attempts: number }
  | {
      readonly state: "in_flight";
      readonly attempts: number;
      readonly worker: string;
      readonly leaseDeadline: number;
    }
  | { readonly state: "dead_lettered"; readonly attempts: number; readonly reason: string }
  | { readonly state: "settled" };

/** A retained message (its meta: the body may be paged out) with its status per subscription. */
export interface MessageInspection {
  readonly message: MessageMeta;
  readonly subscriptions: Readonly<Record<string, MessageStatus>>;
}

/** Finds a retained message by id (or offset); undefined when it is not in the shard. O(subscriptions). */
export function inspectMessage(
  state: ShardState,
  idOrOffset: string | number,
): MessageInspection | undefined {
  const offset = typeof idOrOffset === "number" ? idOrOffset : state.ids.get(idOrOffset);
  const m = offset === undefined ? undefined : state.messages.get(offset);
  if (m === undefined) return undefined;
  const subscriptions: Record<string, MessageStatus> = {};
  for (const name of state.subscriptionNames()) {
    const sub = state.subs.get(name);
    if (sub === undefined) continue;
    const dead = sub.dead.get(m.msg.offset);
    const d = sub.deliveries.get(m.msg.offset);
    if (dead !== undefined) {
      subscriptions[name] = { state: "dead_lettered", attempts: dead.attempts, reason: dead.reason };
    } else if (isSettled(m, sub)) {
      subscriptions[name] = { state: "settled" };
    } else if (d?.lease !== undefined) {
      subscriptions[name] = {
        state: "in_flight",
        attempts: d.attempt,
        worker: d.lease.worker,
        leaseDeadline: d.lease.deadline,
      };
    } else {
      subscriptions[name] = { state: "pending", runnableAt: runnableAt(m, d), attempts: d?.attempt ?? 0 };
    }
  }
  return { message: m.msg, subscriptions };
}
