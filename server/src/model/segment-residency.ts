/**
 * Which sealed segments the broker should have paged in, and when
 * (read-only questions about a shard; see `broker/segment-pager.ts`).
 *
 * - {@link segmentsNeededBy}: before a batch, the segments whose bodies its
 *   nacks and the lease expiries due by then may dead-letter (a dead letter
 *   is a whole copy, so these bodies must be in memory as the batch applies).
 * - {@link claimFront}: after a commit, the segments holding the next
 *   message in each subscription's claim order, where read-ahead starts
 *   (cold ones included: the broker warms those before the next batch).
 * - {@link coldFront}: before a batch, the cold segments at the front of
 *   some subscription's claim order, which its claims need warmed.
 * - {@link segmentAfter}: the next segment in offset order, to read ahead.
 *
 * Costs: O(receipts + leases due), O(subscriptions) and O(gap) respectively.
 */
import { coldSegmentAt } from "./cold-segment-index.ts";
import type { Operation } from "./operations.ts";
import { peekRunnable } from "./shard-mechanics.ts";
import type { SegmentState } from "./shard-records.ts";
import type { ShardState } from "./shard-state.ts";

/**
 * The segments of sealed messages that `ops`, applied at `now` or up to
 * `slackMs` later, could dead-letter (nacks' receipts, leases due by
 * `now + slackMs`).
 */
export function segmentsNeededBy(
  state: ShardState,
  ops: readonly Operation[],
  now: number,
  slackMs: number,
): SegmentState[] {
  const out = new Set<SegmentState>();
  const want = (offset: number) => {
    const seg = state.messages.get(offset)?.segment;
    if (seg !== undefined) out.add(seg);
  };
  for (const op of ops) {
    if (op.kind !== "nack" || op.release === true || !Array.isArray(op.receipts)) continue;
    for (const r of op.receipts) if (typeof r?.offset === "number") want(r.offset);
  }
  for (const e of state.leaseIndex.leading((entry) => entry.deadline <= now + slackMs)) want(e.offset);
  return [...out];
}

/**
 * The segments holding the message each subscription would claim next
 * (those whose next message is sealed), without duplicates. May tidy the
 * runnable indexes, like `hasRunnable`.
 */
export function claimFront(state: ShardState, now: number): SegmentState[] {
  return claimPositions(state, now).front;
}

/**
 * {@link claimFront}, and whether some subscription is caught up: its next
 * claim is not in a sealed segment (it is in the head's tail, or nothing is
 * runnable), so a segment sealed now is what it reads next.
 */
export function claimPositions(state: ShardState, now: number): { front: SegmentState[]; caughtUp: boolean } {
  const out = new Set<SegmentState>();
  let caughtUp = false;
  for (const sub of state.subs.values()) {
    const next = peekRunnable(state, sub, now);
    const seg = next?.cold ?? next?.m.segment;
    if (seg !== undefined) out.add(seg);
    else caughtUp = true;
  }
  return { front: [...out], caughtUp };
}

/** How far past a segment's last offset {@link segmentAfter} looks for the next one. */
const SEGMENT_GAP_LIMIT = 4096;

/**
 * The sealed segment of the first retained message after `seg` (within a
 * bounded gap of dropped offsets), or undefined.
 */
export function segmentAfter(state: ShardState, seg: SegmentState): SegmentState | undefined {
  const end = Math.min(state.next, seg.last + 1 + SEGMENT_GAP_LIMIT);
  for (let offset = seg.last + 1; offset < end; offset++) {
    const m = state.messages.get(offset);
    if (m !== undefined) return m.segment;
    const cold = coldSegmentAt(state, offset);
    if (cold !== undefined) return cold;
  }
  return undefined;
}

/** The cold segments at the front of the claim order of the `subscriptions` named (see `cold-segments.ts`). */
export function coldFront(state: ShardState, now: number, subscriptions: Iterable<string>): SegmentState[] {
  if (state.coldSegments.length === 0) return [];
  const out = new Set<SegmentState>();
  for (const name of subscriptions) {
    const sub = state.subs.get(name);
    if (sub === undefined) continue;
    const cold = peekRunnable(state, sub, now)?.cold;
    if (cold !== undefined) out.add(cold);
  }
  return [...out];
}

/** The cold segment at the front of `subscription`'s claim order, if its front is one. */
export function coldFrontOf(state: ShardState, subscription: string, now: number): SegmentState | undefined {
  const sub = state.subs.get(subscription);
  return sub === undefined || state.coldSegments.length === 0
    ? undefined
    : peekRunnable(state, sub, now)?.cold;
}

/**
 * The cold segments holding messages that the redrives among `ops` may give
 * back to a subscription (each redriven dead letter's original must be in
 * memory). O(dead letters of those subscriptions).
 */
export function coldSegmentsOfDeadLetters(state: ShardState, ops: readonly Operation[]): SegmentState[] {
  const out = new Set<SegmentState>();
  if (state.coldSegments.length === 0) return [];
  for (const op of ops) {
    if (op.kind !== "redrive") continue;
    const sub = state.subs.get(op.subscription);
    if (sub === undefined) continue;
    for (const offset of sub.dead.keys()) {
      const seg = coldSegmentAt(state, offset);
      if (seg !== undefined) out.add(seg);
    }
  }
  return [...out];
}
