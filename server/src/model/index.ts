/**
 * The queue-shard document model: the pure, deterministic core of casq.
 *
 * A queue shard is one JSON document (`docs/document-format.md`). This module
 * knows its format and every queue semantic; it does no I/O and reads no
 * clock: time is the `now` argument. The broker keeps a {@link ShardState} in
 * memory, applies operations with {@link applyOperation}, writes
 * `state.encode()` with a CAS, and rebuilds with `ShardState.decode()`.
 */
export { applyOperation } from "./apply-operation.ts";
export { backoffDelayMs } from "./backoff.ts";
export { SHARD_FORMAT } from "./document-codec.ts";
export {
  MAX_DELAY_MS,
  MAX_ID_BYTES,
  MAX_KEY_BYTES,
  PRIORITY_MAX,
  PRIORITY_MIN,
} from "./input-validation.ts";
export type * from "./operations.ts";
export {
  type BackoffPolicy,
  DEFAULT_QUEUE_CONFIG,
  mergeConfig,
  type QueueConfig,
  type QueueConfigPatch,
  validateConfigPatch,
} from "./queue-config.ts";
export {
  type DeadLetterView,
  inspectMessage,
  listDeadLetters,
  type MessageInspection,
  type MessageStatus,
} from "./shard-inspect.ts";
export type { BrokerRecord, ShardCounters, SubscriptionCounters } from "./shard-records.ts";
export { DEFAULT_SUBSCRIPTION, NAME_PATTERN, ShardState, validateName } from "./shard-state.ts";
export {
  computeStats,
  hasRunnable,
  nextHousekeepingAt,
  nextWakeAt,
  type ShardStats,
  type SubscriptionStats,
} from "./shard-stats.ts";
