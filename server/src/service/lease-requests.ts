/**
 * Heartbeat, ack and nack by receipt, shared by the unary RPCs and the Work
 * stream.
 *
 * The receipts of one request are parsed strictly first (a malformed one
 * fails the whole request before anything is applied), grouped by the shard
 * they encode, and each shard's group is one operation of that shard's
 * group commit. Results come back per receipt, in request order, whatever
 * order the shards answered in. A shard led by another broker fails the
 * request with a redirect; the parts for other shards may have been applied
 * (resending is safe: these operations are idempotent per receipt).
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  type AckResultSchema,
  HeartbeatOutcome,
  type HeartbeatResultSchema,
  type NackResultSchema,
} from "@casq/api/casq/v1/message_pb.ts";
import { type Broker, expectKind, type ShardReceipt } from "../broker/broker.ts";
import { CasqError } from "../errors.ts";
import { ackResultToProto, heartbeatResultsByKey, nackResultToProto, receiptKey } from "./conversions.ts";
import { parseReceipts } from "./receipts.ts";

/** Which subscription of which queue the receipts belong to. */
export interface LeaseTarget {
  readonly broker: Broker;
  readonly queue: string;
  readonly subscription: string;
  readonly shardCount: number;
}

/** A heartbeat's per-receipt results (request order) and the receipts found lost. */
export interface HeartbeatReply {
  readonly results: MessageInitShape<typeof HeartbeatResultSchema>[];
  readonly lost: ShardReceipt[];
}

/** Heartbeats `receipts` for `workerId`. */
export async function heartbeatReceipts(
  target: LeaseTarget,
  workerId: string,
  receipts: readonly string[],
): Promise<HeartbeatReply> {
  const parsed = parseReceipts(receipts, target.shardCount);
  const parts = await target.broker.heartbeat(target.queue, target.subscription, workerId, parsed);
  const byKey = new Map<string, MessageInitShape<typeof HeartbeatResultSchema>>();
  for (const part of parts)
    for (const [key, value] of heartbeatResultsByKey(part.shard, expectKind(part.result, "heartbeat")))
      byKey.set(key, value);
  const lost: ShardReceipt[] = [];
  const results = parsed.map((r, i) => {
    const found = byKey.get(receiptKey(r.shard, r));
    if (found === undefined) throw missingResult("heartbeat");
    if (found.outcome === HeartbeatOutcome.LOST) lost.push(r);
    return { ...found, receipt: receipts[i] as string };
  });
  return { results, lost };
}

/** Acks `receipts`; per receipt ACKED, ALREADY_ACKED or LEASE_LOST. */
export async function ackReceipts(
  target: LeaseTarget,
  receipts: readonly string[],
): Promise<MessageInitShape<typeof AckResultSchema>[]> {
  const parsed = parseReceipts(receipts, target.shardCount);
  const parts = await target.broker.ack(target.queue, target.subscription, parsed);
  const out = inRequestOrder(
    parsed,
    parts.map((part) => ({
      shard: part.shard,
      results: expectKind(part.result, "ack").results.map(ackResultToProto),
    })),
    "ack",
  );
  return out.map((result, i) => ({ ...result, receipt: receipts[i] as string }));
}

/** Options of a nack. */
export interface NackOptions {
  readonly delayMs?: number;
  readonly deadLetter?: boolean;
  readonly reason?: string;
  /** Hand back unprocessed (the delivery does not count as an attempt). */
  readonly release?: boolean;
}

/** Nacks `receipts`; per receipt RETRY_SCHEDULED (with retry_at), DEAD_LETTERED or LEASE_LOST. */
export async function nackReceipts(
  target: LeaseTarget,
  receipts: readonly string[],
  options: NackOptions,
): Promise<MessageInitShape<typeof NackResultSchema>[]> {
  const parsed = parseReceipts(receipts, target.shardCount);
  const parts = await target.broker.nack(target.queue, target.subscription, parsed, {
    ...(options.delayMs === undefined ? {} : { delayMs: options.delayMs }),
    ...(options.deadLetter ? { deadLetter: true } : {}),
    ...(options.reason === undefined ? {} : { reason: options.reason }),
    ...(options.release ? { release: true } : {}),
  });
  const out = inRequestOrder(
    parsed,
    parts.map((part) => ({
      shard: part.shard,
      results: expectKind(part.result, "nack").results.map(nackResultToProto),
    })),
    "nack",
  );
  return out.map((result, i) => ({ ...result, receipt: receipts[i] as string }));
}

/**
 * Puts per-shard results back in request order: each shard's results are in
 * the order its receipts appeared in the request (the broker groups them so).
 */
function inRequestOrder<T>(
  parsed: readonly ShardReceipt[],
  parts: readonly { shard: number; results: readonly T[] }[],
  kind: string,
): T[] {
  const positions = new Map<number, number[]>();
  parsed.forEach((r, i) => {
    const list = positions.get(r.shard) ?? [];
    positions.set(r.shard, list);
    list.push(i);
  });
  const out: (T | undefined)[] = new Array(parsed.length);
  for (const part of parts) {
    const list = positions.get(part.shard) ?? [];
    if (list.length !== part.results.length) throw missingResult(kind);
    part.results.forEach((result, j) => {
      out[list[j] as number] = result;
    });
  }
  return out.map((result) => {
    if (result === undefined) throw missingResult(kind);
    return result;
  });
}

function missingResult(kind: string): CasqError {
  return new CasqError("internal", `a ${kind} returned no result for one of its receipts`);
}
