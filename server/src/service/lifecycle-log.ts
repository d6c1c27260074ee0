/**
 * Lifecycle log lines of the broker's shards: one structured line when this
 * broker acquires a shard's leadership, loses it to another broker, or
 * refuses a shard document (unreadable, misplaced, or missing while its
 * queue's manifest says it exists), with the reason, once per reason. Commits and CAS attempts are left to
 * metrics (they are far too frequent for logs). Never logs payloads.
 */
import type { Logger } from "pino";
import type { ShardObserver } from "../broker/shard-observer.ts";

/** A ShardObserver that logs leadership changes, then forwards everything to `next` (if any). */
export function loggingShardObserver(logger: Logger, next?: ShardObserver): ShardObserver {
  return {
    onCommit: next?.onCommit?.bind(next),
    onCasAttempt: next?.onCasAttempt?.bind(next),
    onLeadership(event) {
      const fields = {
        queue: event.queue,
        shard: event.shard,
        ...(event.record
          ? { epoch: event.record.epoch, leader: event.record.id, address: event.record.address }
          : {}),
      };
      if (event.event === "acquired") logger.info(fields, "shard leadership acquired");
      else if (event.event === "lost") logger.warn(fields, "shard leadership lost to another broker");
      else
        logger.error(
          { ...fields, reason: event.reason },
          "shard document refused: it cannot be used and will not be overwritten",
        );
      next?.onLeadership?.(event);
    },
  };
}
