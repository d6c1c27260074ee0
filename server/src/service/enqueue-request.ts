/**
 * One Enqueue request, handled the same way whether it came as a unary
 * `QueueService.Enqueue` call or as one request of an EnqueueStream
 * (`enqueue-stream.ts`): validate it (INVALID_ARGUMENT before anything is
 * applied), make sure the queue exists (creating it when the broker
 * auto-creates queues), store the messages through the broker, and build
 * the answer.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { EnqueueRequest, EnqueueResponseSchema } from "@casq/api/casq/v1/queue_service_pb.ts";
import { checkEnqueueOnNewShard } from "../model/new-shard-admission.ts";
import type { ServiceContext } from "./service-context.ts";
import { checkNewMessages, checkQueueName } from "./validation.ts";

/** The answer to an Enqueue request. */
export type EnqueueResponseInit = MessageInitShape<typeof EnqueueResponseSchema>;

/**
 * Handles `req`: resolves once its messages are durable, with where each was
 * stored. `signal` ends the wait (the call's or the request's deadline, a
 * cancel); `traceContext` is the W3C context given to messages that carry
 * none (the broker's span of the request, else the caller's).
 */
export async function handleEnqueue(
  ctx: ServiceContext,
  req: EnqueueRequest,
  signal: AbortSignal,
  traceContext: Record<string, string> | undefined,
): Promise<EnqueueResponseInit> {
  const queue = checkQueueName(req.queue);
  const inputs = checkNewMessages(req.messages, ctx.clock.now(), traceContext);
  let queueCreated = false;
  await ctx.catalog.ensure(
    queue,
    ctx.autoCreateQueues,
    (manifest) => {
      queueCreated = true;
      ctx.logger.info({ queue, shards: manifest.shardCount, autoCreated: true }, "queue created");
    },
    // A request the new queue would refuse (e.g. a header over its limit) does not create it.
    (config) => checkEnqueueOnNewShard(queue, config, inputs, Math.floor(ctx.clock.now())),
  );
  // A batch over shards led by several brokers is refused whole, with the split to make.
  const outcomes = await ctx.broker.enqueue(queue, inputs, signal, async (shard) => {
    const route = await ctx.directory.route(queue, shard, signal);
    return route.live && !route.local ? route.record?.address : undefined;
  });
  return {
    messages: outcomes.map((o) => ({
      id: o.id,
      shard: o.shard,
      offset: BigInt(o.offset),
      duplicate: o.duplicate,
    })),
    queueCreated,
  };
}
