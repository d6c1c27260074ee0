/**
 * Enqueue: add a batch of messages, all or nothing.
 *
 * Each new message gets the next offset (offsets only grow and are never
 * reused) and becomes pending in every subscription that exists now
 * (fan-out): runnable at once, or at its `run_at` / after its delay.
 *
 * Deduplication: a message whose dedup id was enqueued within the last
 * `dedupWindowMs` (or earlier in the same batch) is a duplicate: the result
 * names the ORIGINAL message's id and offset and nothing is added. Dedup ids
 * are per shard, so producers that rely on dedup must route a dedup id to a
 * stable shard (the broker does that by key, or by dedup id when a message
 * has no key).
 *
 * Limits (rejecting the whole batch, state unchanged): more than `maxBatch`
 * messages in the caller's request (`requestSize`: every shard's part of a
 * request over the limit is refused, not only the parts over it), a payload
 * above `maxPayloadBytes`, too many or too large headers -> `resource_exhausted`; a document that would grow beyond
 * `maxDocumentBytes` -> `resource_exhausted` ("queue shard is full"), while
 * claims, acks and nacks keep working so consumers can drain it.
 *
 * Nobody to keep it: a shard with no subscription and `retentionMs` 0 would
 * drop every message the moment it is stored, so an enqueue there is refused
 * (`failed_precondition`, nothing stored) instead of answered with ids of
 * messages that are already gone. Creating a subscription or setting a
 * retention makes enqueues work again.
 *
 * Cost: O(batch x subscriptions x log n).
 */
import { CasqError } from "../errors.ts";
import { dedupBytes, messageBytes } from "./approx-size.ts";
import { DedupIdsPagedOut } from "./dedup-chunk.ts";
import { putDedup } from "./dedup-segments.ts";
import { checkRequestSize, normalizeNewMessage } from "./input-validation.ts";
import type { EnqueueItemResult, EnqueueOperation, EnqueueResult } from "./operations.ts";
import { retainInTail } from "./segment-mechanics.ts";
import { onFullySettled, schedule } from "./shard-mechanics.ts";
import type { DedupEntry, MessageRecord, RetainedMessage } from "./shard-records.ts";
import type { ShardState } from "./shard-state.ts";

/** Applies an enqueue (see module header). */
export function applyEnqueue(state: ShardState, op: EnqueueOperation, now: number): EnqueueResult {
  const config = state.config;
  const inputs = op.messages;
  if (!Array.isArray(inputs) || inputs.length === 0) {
    throw new CasqError("invalid_argument", "enqueue needs at least one message");
  }
  if (state.subs.size === 0 && config.retentionMs === 0) {
    throw new CasqError(
      "failed_precondition",
      `queue ${state.queue} has no subscription and no retention, so an enqueued message would be dropped at once; nothing was stored — create a subscription (e.g. \`casq subscription create ${state.queue} default\`) or set retention_ms above 0`,
      { queue: state.queue, shard: state.shard },
    );
  }
  checkRequestSize(op.requestSize ?? inputs.length, config);

  // Phase 1: validate and plan, touching nothing.
  const results: EnqueueItemResult[] = [];
  const fresh: MessageRecord[] = [];
  const batchDedup = new Map<string, EnqueueItemResult>();
  const batchIds = new Set<string>();
  let addedBytes = 0;
  let offset = state.next;
  inputs.forEach((input, at) => {
    const i = op.requestIndexes?.[at] ?? at;
    const msg = normalizeNewMessage(input, offset, config, now, i);
    if (msg.dedupId !== undefined && config.dedupWindowMs > 0) {
      const known = rememberedDedup(state, msg.dedupId, now);
      const original =
        known !== undefined && known.expiresAt > now
          ? { id: known.id, offset: known.offset, duplicate: true }
          : batchDedup.get(msg.dedupId);
      if (original !== undefined) {
        results.push({ id: original.id, offset: original.offset, duplicate: true });
        return;
      }
    }
    const owner = state.ids.get(msg.id);
    if (owner !== undefined || batchIds.has(msg.id)) {
      throw new CasqError(
        "already_exists",
        `message ${i}: id ${JSON.stringify(msg.id)} is already used by ${owner === undefined ? "another message of this batch" : `the message at offset ${owner}`} in queue ${state.queue} shard ${state.shard}; message ids must be unique`,
        { queue: state.queue, shard: state.shard },
      );
    }
    batchIds.add(msg.id);
    const result = { id: msg.id, offset, duplicate: false };
    results.push(result);
    if (msg.dedupId !== undefined && config.dedupWindowMs > 0) {
      batchDedup.set(msg.dedupId, result);
      addedBytes += dedupBytes({ dedupId: msg.dedupId, id: msg.id, offset, expiresAt: 0 });
    }
    fresh.push(msg);
    addedBytes += messageBytes(msg);
    offset += 1;
  });
  if (fresh.length > 0 && state.approxBytes() + addedBytes > config.maxDocumentBytes) {
    throw new CasqError(
      "resource_exhausted",
      `queue shard is full: queue ${state.queue} shard ${state.shard} would grow to about ${state.approxBytes() + addedBytes} bytes, above max_document_bytes ${config.maxDocumentBytes}; ack or purge messages, or raise max_document_bytes`,
      { queue: state.queue, shard: state.shard },
    );
  }

  // Phase 2: apply.
  for (const msg of fresh) {
    const m: RetainedMessage = {
      msg,
      targets: undefined,
      pending: state.subs.size,
      bytes: messageBytes(msg),
      segment: undefined,
    };
    retainInTail(state, m);
    state.next = msg.offset + 1;
    state.counters.enqueued += 1;
    if (msg.dedupId !== undefined && config.dedupWindowMs > 0) {
      putDedup(state, {
        dedupId: msg.dedupId,
        id: msg.id,
        offset: msg.offset,
        expiresAt: now + config.dedupWindowMs,
      });
    }
    for (const sub of state.subs.values()) {
      sub.counters.enqueued += 1;
      schedule(sub, m, undefined, now);
    }
    if (m.pending === 0) onFullySettled(state, m, now); // no subscription: nobody will ever claim it
  }
  return { kind: "enqueue", results, changed: fresh.length > 0 };
}

/**
 * The remembered entry of `dedupId`; `unavailable` (retry: nothing was
 * stored) when the ids of a dedup segment it may be in are not in memory,
 * which means the broker could not read them back before this batch.
 */
function rememberedDedup(state: ShardState, dedupId: string, now: number): DedupEntry | undefined {
  try {
    return state.dedup.get(dedupId, now);
  } catch (error) {
    if (!(error instanceof DedupIdsPagedOut)) throw error;
    throw new CasqError(
      "unavailable",
      `cannot tell whether dedup id ${JSON.stringify(dedupId)} was seen: ${error.message} (reading it back failed); nothing was stored, retry`,
      { queue: state.queue, shard: state.shard },
    );
  }
}
