/**
 * Thin wrappers over `casq.v1.AdminService`: queue lifecycle, subscriptions,
 * dead letters. Each call fails over and follows redirects like the others.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import {
  AdminService,
  type CreateQueueResponse,
  type CreateSubscriptionResponse,
  CreateSubscriptionResponseSchema,
  type DeadLetter,
  type DeleteSubscriptionResponse,
  DeleteSubscriptionResponseSchema,
  type GetQueueResponse,
  type PurgeQueueResponse,
  type QueueSummary,
  type RedriveDeadLettersResponse,
  SubscriptionStart,
  type UpdateQueueResponse,
} from "@casq/api/casq/v1/admin_service_pb.ts";
import type { QueueConfigSchema } from "@casq/api/casq/v1/queue_config_pb.ts";
import type { Client } from "@connectrpc/connect";
import { type ClientOptions, resolveClientOptions } from "./client-options.ts";
import { AlreadyExistsError, NotFoundError, toCasqError } from "./errors.ts";
import { callWithFailover } from "./failover.ts";
import type { CallOptions } from "./producer.ts";
import { BrokerPool } from "./transport.ts";

export type {
  CreateQueueResponse,
  CreateSubscriptionResponse,
  DeadLetter,
  DeleteSubscriptionResponse,
  GetQueueResponse,
  PurgeQueueResponse,
  QueueSummary,
  RedriveDeadLettersResponse,
  UpdateQueueResponse,
} from "@casq/api/casq/v1/admin_service_pb.ts";
export { SubscriptionStart } from "@casq/api/casq/v1/admin_service_pb.ts";

/** Queue configuration as accepted by createQueue (see `casq.v1.QueueConfig`). */
export type QueueConfigInit = MessageInitShape<typeof QueueConfigSchema>;

/**
 * Administration of queues. Needs the `admin` permission when the server uses tokens.
 *
 * @example
 * const admin = new Admin({ brokers: ["127.0.0.1:50051"] });
 * await admin.createQueue("emails", { shardCount: 4 });
 */
export class Admin {
  private readonly pool: BrokerPool;

  constructor(options: ClientOptions) {
    this.pool = new BrokerPool(resolveClientOptions(options));
  }

  /**
   * One call through failover. `idempotent: false` (purge, redrive): never
   * resent after an attempt that may have been applied. `fn` gets
   * `uncertain` true on such a resend of an idempotent call, to read an
   * ALREADY_EXISTS or NOT_FOUND that the earlier attempt may have caused.
   */
  private call<T>(
    fn: (
      client: Client<typeof AdminService>,
      opts: { timeoutMs: number; signal?: AbortSignal },
      uncertain: boolean,
    ) => Promise<T>,
    options: CallOptions = {},
    idempotent = true,
  ): Promise<T> {
    return callWithFailover(
      this.pool,
      ({ address, signal, timeoutMs, uncertain }) =>
        fn(this.pool.client(AdminService, address), { timeoutMs, ...(signal ? { signal } : {}) }, uncertain),
      {
        ...(options.signal ? { signal: options.signal } : {}),
        ...(options.timeoutMs === undefined
          ? {}
          : { deadline: this.pool.options.clock.now() + options.timeoutMs }),
        idempotent,
      },
    );
  }

  /**
   * Creates a queue with `shardCount` shards (default 1) and an optional
   * config. A queue of that name rejects with `AlreadyExistsError`,
   * unless `ifNotExists` is set: then the existing queue is returned as it
   * is (`created` false; `shardCount` and `config` are not applied).
   *
   * A resend after an attempt that may have created the queue (it timed out,
   * or its connection broke) asks with `ifNotExists`: a queue found there
   * with the requested shard count is taken as that attempt's (`created`
   * false, since this call cannot tell); another shard count rejects with
   * `AlreadyExistsError`.
   */
  createQueue(
    queue: string,
    options: { shardCount?: number; config?: QueueConfigInit; ifNotExists?: boolean } & CallOptions = {},
  ): Promise<CreateQueueResponse> {
    const shardCount = options.shardCount ?? 0;
    return this.call(async (c, o, uncertain) => {
      const response = await c.createQueue(
        {
          queue,
          shardCount,
          ...(options.config ? { config: options.config } : {}),
          ifNotExists: options.ifNotExists === true || uncertain,
        },
        o,
      );
      if (uncertain && !response.created && options.ifNotExists !== true) {
        if (response.shardCount !== Math.max(1, shardCount)) {
          throw new AlreadyExistsError(
            `casq: queue ${queue} exists with ${response.shardCount} shards, not the ${Math.max(1, shardCount)} requested`,
          );
        }
      }
      return response;
    }, options);
  }

  /** Changes the given config fields on every shard; unset fields keep their values. */
  updateQueue(
    queue: string,
    config: QueueConfigInit,
    options: CallOptions = {},
  ): Promise<UpdateQueueResponse> {
    return this.call((c, o) => c.updateQueue({ queue, config }, o), options);
  }

  /** The raw JSON shard document of `queue`/`shard` (default 0) as stored, with its etag: for debugging and support. */
  getDocument(
    queue: string,
    options: { shard?: number } & CallOptions = {},
  ): Promise<{ document: Uint8Array; etag: string }> {
    return this.call(async (c, o) => {
      const chunks: Uint8Array[] = [];
      let etag = "";
      // A retried attempt reads the whole stream again.
      for await (const part of c.getDocument({ queue, shard: options.shard ?? 0 }, o)) {
        chunks.push(part.chunk);
        if (part.etag !== "") etag = part.etag;
      }
      const document = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
      let at = 0;
      for (const chunk of chunks) {
        document.set(chunk, at);
        at += chunk.length;
      }
      return { document, etag };
    }, options);
  }

  /** Config, statistics per subscription and per shard of a queue. */
  getQueue(queue: string, options: CallOptions = {}): Promise<GetQueueResponse> {
    return this.call((c, o) => c.getQueue({ queue }, o), options);
  }

  /** Every queue (all pages). */
  async listQueues(options: CallOptions = {}): Promise<QueueSummary[]> {
    const out: QueueSummary[] = [];
    let pageToken = "";
    do {
      const page = await this.call((c, o) => c.listQueues({ pageToken }, o), options);
      out.push(...page.queues);
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
    return out;
  }

  /**
   * Deletes a queue; refused while it holds messages or dead letters unless
   * `force`. A resend after an attempt that may have deleted it (a timeout, a
   * broken connection) that finds it gone counts as success.
   */
  async deleteQueue(queue: string, options: { force?: boolean } & CallOptions = {}): Promise<void> {
    await this.call(async (c, o, uncertain) => {
      try {
        await c.deleteQueue({ queue, force: options.force ?? false }, o);
      } catch (error) {
        // An earlier attempt of this call may have deleted it.
        if (uncertain && toCasqError(error) instanceof NotFoundError) return;
        throw error;
      }
    }, options);
  }

  /** Drops messages of one subscription (default "default"), or of all, and optionally the dead letters. */
  purge(
    queue: string,
    options: { subscription?: string; allSubscriptions?: boolean; deadLetters?: boolean } & CallOptions = {},
  ): Promise<PurgeQueueResponse> {
    return this.call(
      (c, o) =>
        c.purgeQueue(
          {
            queue,
            subscription: options.allSubscriptions ? "" : (options.subscription ?? "default"),
            allSubscriptions: options.allSubscriptions ?? false,
            deadLetters: options.deadLetters ?? false,
          },
          o,
        ),
      options,
      // A second purge would drop what was enqueued in between.
      false,
    );
  }

  /** Dead letters of a subscription (default "default"), all pages. */
  async listDeadLetters(
    queue: string,
    options: { subscription?: string } & CallOptions = {},
  ): Promise<DeadLetter[]> {
    const out: DeadLetter[] = [];
    let pageToken = "";
    do {
      const page = await this.call(
        (c, o) => c.listDeadLetters({ queue, subscription: options.subscription ?? "", pageToken }, o),
        options,
      );
      out.push(...page.deadLetters);
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
    return out;
  }

  /** Puts dead letters back to work: the given `ids`, or all of them (default), at most `limit`. */
  redrive(
    queue: string,
    options: { subscription?: string; ids?: string[]; limit?: number } & CallOptions = {},
  ): Promise<RedriveDeadLettersResponse> {
    const ids = options.ids ?? [];
    return this.call(
      (c, o) =>
        c.redriveDeadLetters(
          {
            queue,
            subscription: options.subscription ?? "",
            all: ids.length === 0,
            ids,
            limit: options.limit ?? 0,
          },
          o,
        ),
      options,
      // A second redrive would move dead letters that arrived in between.
      false,
    );
  }

  /**
   * Creates a subscription (consumer group) starting at the newest message
   * (default) or the earliest. When a resend after an attempt that may have
   * created it (a timeout, a broken connection) finds it there, that counts as
   * success, with `backlog` 0 (not known to this call).
   */
  createSubscription(
    queue: string,
    subscription: string,
    options: { start?: "latest" | "earliest" } & CallOptions = {},
  ): Promise<CreateSubscriptionResponse> {
    const start = options.start === "earliest" ? SubscriptionStart.EARLIEST : SubscriptionStart.LATEST;
    return this.call(async (c, o, uncertain) => {
      try {
        return await c.createSubscription({ queue, subscription, start }, o);
      } catch (error) {
        // An earlier attempt of this call may have created it.
        if (uncertain && toCasqError(error) instanceof AlreadyExistsError) {
          return create(CreateSubscriptionResponseSchema, { subscription, start });
        }
        throw error;
      }
    }, options);
  }

  /**
   * Deletes a subscription with its messages, leases and dead letters. When
   * a resend after an attempt that may have deleted it finds it gone, that
   * counts as success, with every count 0 (not known to this call).
   */
  deleteSubscription(
    queue: string,
    subscription: string,
    options: CallOptions = {},
  ): Promise<DeleteSubscriptionResponse> {
    return this.call(async (c, o, uncertain) => {
      try {
        return await c.deleteSubscription({ queue, subscription }, o);
      } catch (error) {
        // An earlier attempt of this call may have deleted it.
        if (uncertain && toCasqError(error) instanceof NotFoundError) {
          return create(DeleteSubscriptionResponseSchema, {});
        }
        throw error;
      }
    }, options);
  }
}
