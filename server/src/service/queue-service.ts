/**
 * casq.v1.QueueService: thin handlers over the broker.
 *
 * Each handler validates the request (INVALID_ARGUMENT before anything is
 * applied), makes sure the queue exists (the catalog; Enqueue may create it),
 * calls the broker, and converts the answer to its wire form. Errors are
 * thrown as they come and turned into gRPC statuses by the error interceptor
 * (`grpc-errors.ts`). An Enqueue is handled in `enqueue-request.ts`, for the
 * unary call and for each request of an EnqueueStream (`enqueue-stream.ts`);
 * the Work stream lives in `work-stream.ts`.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { ClaimedMessageSchema } from "@casq/api/casq/v1/message_pb.ts";
import type { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { callTraceContext, recordDeliveries } from "../telemetry/tracing.ts";
import { claimedToProto, leaderToProto } from "./conversions.ts";
import { handleEnqueue } from "./enqueue-request.ts";
import { createEnqueueStreamHandler } from "./enqueue-stream.ts";
import { ackReceipts, heartbeatReceipts, nackReceipts } from "./lease-requests.ts";
import { parseReceipts } from "./receipts.ts";
import type { ServiceContext } from "./service-context.ts";
import {
  checkClaimWait,
  checkLeaseTtl,
  checkMaxMessages,
  checkNackDelay,
  checkQueueName,
  checkSubscriptionName,
  checkWorkerId,
  nackReason,
  traceContextFromHeaders,
} from "./validation.ts";
import { createWorkHandler } from "./work-stream.ts";

/** A long-poll Claim answers this long before the call's own deadline, so the empty answer arrives in time. */
const DEADLINE_MARGIN_MS = 100;

/** The QueueService implementation. */
export function createQueueService(ctx: ServiceContext): ServiceImpl<typeof QueueService> {
  return {
    enqueue: (req, call) =>
      handleEnqueue(
        ctx,
        req,
        call.signal,
        // Telemetry: tracing — a message without its own trace context gets the RPC span's
        // (a child of the caller's traceparent), else the caller's traceparent header.
        callTraceContext(call.values) ?? traceContextFromHeaders(call.requestHeader),
      ),

    enqueueStream: createEnqueueStreamHandler(ctx),

    async claim(req, call) {
      const queue = checkQueueName(req.queue);
      const subscription = checkSubscriptionName(req.subscription);
      const workerId = checkWorkerId(req.workerId);
      const max = checkMaxMessages(req.maxMessages);
      let waitMs = checkClaimWait(req.wait);
      const leaseTtlMs = checkLeaseTtl(req.leaseTtl);
      const remaining = call.timeoutMs();
      if (remaining !== undefined) waitMs = Math.max(0, Math.min(waitMs, remaining - DEADLINE_MARGIN_MS));
      const manifest = await ctx.catalog.require(queue);
      const deliveries = await ctx.claimer.claim(
        { queue, subscription, workerId, max, leaseTtlMs, signal: call.signal },
        manifest.shardCount,
        waitMs,
      );
      recordDeliveries(call.values, queue, deliveries); // Telemetry: tracing
      const messages: MessageInitShape<typeof ClaimedMessageSchema>[] = deliveries.map((d) =>
        claimedToProto(queue, d.shard, d.message),
      );
      return { messages };
    },

    async heartbeat(req, _call) {
      const workerId = checkWorkerId(req.workerId);
      const target = await leaseTarget(ctx, req.queue, req.subscription, req.receipts);
      const { results } = await heartbeatReceipts(target, workerId, req.receipts);
      return { results };
    },

    async ack(req, _call) {
      const target = await leaseTarget(ctx, req.queue, req.subscription, req.receipts);
      return { results: await ackReceipts(target, req.receipts) };
    },

    async nack(req, _call) {
      const delayMs = checkNackDelay(req.delay);
      const target = await leaseTarget(ctx, req.queue, req.subscription, req.receipts);
      const reason = nackReason(req.reason);
      const results = await nackReceipts(target, req.receipts, {
        ...(delayMs === undefined ? {} : { delayMs }),
        deadLetter: req.deadLetter,
        release: req.release,
        ...(reason === undefined ? {} : { reason }),
      });
      return { results };
    },

    work: createWorkHandler(ctx),

    async lookupShards(req, call: HandlerContext) {
      const queue = checkQueueName(req.queue);
      const manifest = await ctx.catalog.require(queue);
      const routes = await ctx.directory.routes(queue, manifest.shardCount, call.signal);
      return {
        shards: routes.map((r) => ({
          shard: r.shard,
          ...(r.live && r.record ? { leader: leaderToProto(r.record) } : {}),
        })),
      };
    },
  };
}

/**
 * Validates the queue, subscription and receipts of a receipt request (the
 * receipts' form first, their shard once the queue's shard count is known)
 * and loads the queue's shard count.
 */
async function leaseTarget(
  ctx: ServiceContext,
  queueField: string,
  subscriptionField: string,
  receipts: string[],
) {
  const queue = checkQueueName(queueField);
  const subscription = checkSubscriptionName(subscriptionField);
  parseReceipts(receipts, Number.MAX_SAFE_INTEGER);
  const manifest = await ctx.catalog.require(queue);
  return { broker: ctx.broker, queue, subscription, shardCount: manifest.shardCount };
}
