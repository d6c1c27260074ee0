/**
 * Receipts on the wire: the opaque string a worker passes back to heartbeat,
 * ack and nack one delivery.
 *
 * A delivery is identified by (shard, offset, attempt): the shard that holds
 * the message, the message's offset in it, and the delivery number. The
 * server writes it as `<shard>.<offset>.<attempt>` in plain decimal, e.g.
 * `2.1043.1`. Clients must treat it as opaque (the format may change between
 * releases); the server parses it strictly: no signs, no leading zeros, no
 * spaces, attempt at least 1, every part a safe integer. A receipt that does
 * not parse is INVALID_ARGUMENT for the whole request, before anything is
 * applied.
 */

import type { ShardReceipt } from "../broker/broker.ts";
import { CasqError } from "../errors.ts";

const RECEIPT = /^(0|[1-9][0-9]{0,9})\.(0|[1-9][0-9]{0,15})\.([1-9][0-9]{0,15})$/;

/** The wire form of one delivery's receipt. */
export function formatReceipt(shard: number, offset: number, attempt: number): string {
  return `${shard}.${offset}.${attempt}`;
}

/**
 * Parses one receipt. `index` is its position in the request, for the error
 * message; `shardCount` is the queue's shard count (a receipt naming a shard
 * the queue does not have is malformed).
 */
export function parseReceipt(text: string, index: number, shardCount: number): ShardReceipt {
  const match = RECEIPT.exec(text);
  const shard = Number(match?.[1]);
  const offset = Number(match?.[2]);
  const attempt = Number(match?.[3]);
  if (!match || !Number.isSafeInteger(offset) || !Number.isSafeInteger(attempt))
    throw new CasqError(
      "invalid_argument",
      `receipts[${index}] ${JSON.stringify(truncate(text))} is not a receipt issued by casq; pass ClaimedMessage.receipt back unchanged`,
    );
  if (shard >= shardCount)
    throw new CasqError(
      "invalid_argument",
      `receipts[${index}] ${JSON.stringify(text)} names shard ${shard}, but the queue has ${shardCount} shard(s); was it issued for another queue?`,
    );
  return { shard, offset, attempt };
}

/**
 * Parses the receipts of a heartbeat, ack or nack: at least one, at most
 * 1000 (the API bound; the queue's max_batch is checked by the engine).
 */
export function parseReceipts(texts: readonly string[], shardCount: number): ShardReceipt[] {
  if (texts.length === 0)
    throw new CasqError("invalid_argument", "receipts is empty: pass at least one ClaimedMessage.receipt");
  if (texts.length > MAX_RECEIPTS)
    throw new CasqError(
      "invalid_argument",
      `receipts has ${texts.length} entries; at most ${MAX_RECEIPTS} per call: split the request`,
    );
  return texts.map((text, index) => parseReceipt(text, index, shardCount));
}

/** Most receipts in one request. */
export const MAX_RECEIPTS = 1000;

function truncate(text: string): string {
  return text.length > 64 ? `${text.slice(0, 61)}...` : text;
}
