/**
 * `@casq/sdk`: the TypeScript SDK of casq. A {@link Producer} enqueues, a
 * {@link Worker} runs handlers over the Work stream, {@link Admin} manages
 * queues; all of them fail over between brokers and follow redirects.
 */
export { Admin, type QueueConfigInit, SubscriptionStart } from "./admin.ts";
export type { ClientOptions, TlsOptions } from "./client-options.ts";
export type { BatchingOptions } from "./enqueue-batcher.ts";
export {
  AlreadyExistsError,
  BatchRedirectError,
  type BatchRoute,
  CasqError,
  Code,
  DeadLetterError,
  InvalidArgumentError,
  LEADER_ADDRESS_TRAILER,
  LeaseLostError,
  NotFoundError,
  OutcomeUnknownError,
  RedirectError,
  type SettleOperation,
  toCasqError,
  UnavailableError,
} from "./errors.ts";
export type { Job, JobTraceContext } from "./job.ts";
export {
  type CallOptions,
  type EnqueueOptions,
  type EnqueueResult,
  type OutgoingMessage,
  type Payload,
  Producer,
  type ProducerOptions,
} from "./producer.ts";
export { spanContextFromTraceContext } from "./tracing.ts";
export { activeTraceHeaders } from "./transport.ts";
export {
  consoleLogger,
  type JobHandler,
  type RunOptions,
  type StopOptions,
  Worker,
  type WorkerLogger,
  type WorkerOptions,
} from "./worker.ts";
