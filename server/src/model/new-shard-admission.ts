/**
 * Whether a shard that does not exist yet would take an enqueue: for a queue
 * about to be auto-created for that enqueue, so that a request its queue would
 * refuse is refused before anything is created (docs/protocol.md,
 * "Auto-creation").
 *
 * The enqueue is applied to an empty shard in memory, thrown away afterwards:
 * the same checks, codes and messages as the real one (batch size, each
 * message's fields and limits, the shard's size limit), with no second copy
 * of them to keep in step.
 */
import { applyOperation } from "./apply-operation.ts";
import type { NewMessage } from "./operations.ts";
import type { QueueConfig } from "./queue-config.ts";
import { ShardState } from "./shard-state.ts";

/** Length of the ids the broker gives messages (ULIDs): the size checks count them. */
const MESSAGE_ID_LENGTH = 26;

/**
 * Throws what an empty shard `0` of `queue` with `config` would refuse an
 * enqueue of `inputs` with (a `CasqError`); returns when it would take it.
 * Ids are the broker's to make: each input gets a stand-in of the same length.
 */
export function checkEnqueueOnNewShard(
  queue: string,
  config: QueueConfig,
  inputs: readonly Omit<NewMessage, "id">[],
  now: number,
): void {
  const state = ShardState.create({ queue, shard: 0, config, now });
  const messages = inputs.map((input, i) => ({ ...input, id: String(i).padStart(MESSAGE_ID_LENGTH, "0") }));
  applyOperation(state, { kind: "enqueue", messages }, now);
}
