/**
 * Creating and deleting subscriptions (consumer groups).
 *
 * Create: `from: "latest"` (default) sees only messages enqueued after it
 * was created; `from: "earliest"` also gets every message still retained in
 * the shard (not ones already dropped, and not redriven messages addressed
 * to other subscriptions). `already_exists` if the name is taken;
 * `resource_exhausted` beyond `maxSubscriptions`.
 *
 * Delete: removes the subscription with its ack state, leases and dead
 * letters; messages only it was still holding leave the shard (subject to
 * retention). Deleting `default` is allowed (a pure pub/sub topic may not
 * want it; while a queue has no subscription at all, new messages are
 * dropped as soon as retention allows) and it can be created again.
 * `not_found` if missing.
 *
 * Both are O(messages): they are rare administrative operations.
 */
import { CasqError } from "../errors.ts";
import { DELIVERY_BYTES, subscriptionBytes } from "./approx-size.ts";
import { liveCount, pushPlaceholder, requireWarm } from "./cold-segments.ts";
import { dropAllDeadLetters } from "./dead-letter-segments.ts";
import type {
  CreateSubscriptionOperation,
  CreateSubscriptionResult,
  DeleteSubscriptionOperation,
  DeleteSubscriptionResult,
} from "./operations.ts";
import {
  addSubscription,
  isSettled,
  newSubscription,
  onFullySettled,
  requireSubscription,
  schedule,
} from "./shard-mechanics.ts";
import type { RetainedMessage } from "./shard-records.ts";
import { type ShardState, validateName } from "./shard-state.ts";

/** Applies a createSubscription (see module header). */
export function applyCreateSubscription(
  state: ShardState,
  op: CreateSubscriptionOperation,
  now: number,
): CreateSubscriptionResult {
  validateName("subscription", op.name);
  const from = op.from ?? "latest";
  if (from !== "latest" && from !== "earliest") {
    throw new CasqError(
      "invalid_argument",
      `subscription start must be "latest" or "earliest", got ${String(from)}`,
    );
  }
  if (state.subs.has(op.name)) {
    throw new CasqError(
      "already_exists",
      `subscription "${op.name}" already exists on queue ${state.queue}; use it, or delete it first`,
      { queue: state.queue, shard: state.shard },
    );
  }
  if (state.subs.size >= state.config.maxSubscriptions) {
    throw new CasqError(
      "resource_exhausted",
      `queue ${state.queue} already has ${state.subs.size} subscriptions (max_subscriptions ${state.config.maxSubscriptions}); delete one or raise max_subscriptions`,
      { queue: state.queue, shard: state.shard },
    );
  }
  const sub = newSubscription(op.name, now, from === "earliest" ? 0 : state.next);
  addSubscription(state, sub);
  let backlog = 0;
  if (from === "earliest") {
    for (const m of state.messages.values()) {
      if (m.targets !== undefined) continue;
      m.pending += 1;
      schedule(sub, m, undefined, now);
      backlog += 1;
    }
    state.settledSlots += state.messages.size - backlog; // everything else is settled for it
    for (const seg of state.coldSegments) {
      pushPlaceholder(sub, seg, now); // it owes every cold message too (start 0)
      backlog += liveCount(seg);
    }
    sub.counters.enqueued += backlog;
  } else {
    state.settledSlots += state.messages.size; // a cold message counts no slot while cold
  }
  return { kind: "createSubscription", name: op.name, from, backlog, changed: true };
}

/** Applies a deleteSubscription (see module header). */
export function applyDeleteSubscription(
  state: ShardState,
  op: DeleteSubscriptionOperation,
  now: number,
): DeleteSubscriptionResult {
  const sub = requireSubscription(state, op.name);
  requireWarm(state, "deleting a subscription");
  const released: RetainedMessage[] = [];
  for (const m of state.messages.values()) {
    if (isSettled(m, sub)) {
      state.settledSlots -= 1;
      continue;
    }
    if (m.targets !== undefined) m.targets = m.targets.filter((name) => name !== sub.name);
    m.pending -= 1;
    if (m.pending === 0) released.push(m);
  }
  let leasesDropped = 0;
  for (const d of sub.deliveries.values()) if (d.lease !== undefined) leasesDropped += 1;
  state.bytes -= sub.deliveries.size * DELIVERY_BYTES + subscriptionBytes(sub.name);
  const deadLettersDropped = dropAllDeadLetters(state, sub); // its dead-letter segments retire
  state.subs.delete(sub.name);

  let messagesDropped = 0;
  for (const m of released) if (onFullySettled(state, m, now)) messagesDropped += 1;
  return {
    kind: "deleteSubscription",
    name: sub.name,
    messagesDropped,
    leasesDropped,
    deadLettersDropped,
    changed: true,
  };
}
