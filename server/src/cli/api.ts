/**
 * The generated casq.v1 API (protobuf-es code in @casq/api, api/ts) as the CLI
 * uses it: one module, so that the path to the generated code lives in one
 * place.
 */
export {
  AdminService,
  type DeadLetter,
  DeadLetterSchema,
  type GetQueueResponse,
  GetQueueResponseSchema,
  RedriveDeadLettersResponseSchema,
  SubscriptionStart,
} from "@casq/api/casq/v1/admin_service_pb.ts";
export { LeaderRedirectSchema, RpcStatusSchema } from "@casq/api/casq/v1/errors_pb.ts";
export {
  AckOutcome,
  type ClaimedMessage,
  ClaimedMessageSchema,
  HeartbeatOutcome,
  NackOutcome,
  type NewMessage,
  NewMessageSchema,
} from "@casq/api/casq/v1/message_pb.ts";
export {
  type BackoffPolicy,
  type QueueConfig,
  QueueConfigSchema,
  type QueueLimits,
} from "@casq/api/casq/v1/queue_config_pb.ts";
export {
  EnqueuedMessageSchema,
  QueueService,
} from "@casq/api/casq/v1/queue_service_pb.ts";
export {
  type WorkRequest,
  WorkRequestSchema,
  type WorkResponse,
} from "@casq/api/casq/v1/work_pb.ts";
