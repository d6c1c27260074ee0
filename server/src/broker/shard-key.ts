/**
 * Where things live in the object store. One object per queue shard:
 * `queues/<queue>/<shard>.json`. Backends add their own prefix (an S3 key
 * prefix, a file-store root directory).
 */
import { CasqError } from "../errors.ts";
import { validateName } from "../model/shard-state.ts";

/** The store key of one queue shard's document. */
export function shardKey(queue: string, shard: number): string {
  validateName("queue", queue);
  if (!Number.isInteger(shard) || shard < 0)
    throw new CasqError("invalid_argument", `shard ${shard} is invalid`);
  return `queues/${queue}/${shard}.json`;
}
