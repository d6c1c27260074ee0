/**
 * Thin wrappers over `casq.v1.AdminService`: queue lifecycle, subscriptions,
 * dead letters. Each call fails over and follows redirects like the others.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import { type ClientOptions, resolveClientOptions } from "./client-options.ts";
import { callWithFailover } from "./failover.ts";
import {
  AdminService,
  type CreateQueueResponse,
  type CreateSubscriptionResponse,
  type DeadLetter,
  type DeleteSubscriptionResponse,
  type GetQueueResponse,
  type PurgeQueueResponse,
  type QueueSummary,
  type RedriveDeadLettersResponse,
  SubscriptionStart,
  type UpdateQueueResponse,
} from "./gen/casq/v1/admin_service_pb.ts";
import type { QueueConfigSchema } from "./gen/casq/v1/queue_config_pb.ts";
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
} from "./gen/casq/v1/admin_service_pb.ts";
export { SubscriptionStart } from "./gen/casq/v1/admin_service_pb.ts";

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

  private call<T>(
    fn: (
      client: Client<typeof AdminService>,
      opts: { timeoutMs: number; signal?: AbortSignal },
    ) => Promise<T>,
    options: CallOptions = {},
  ): Promise<T> {
    return callWithFailover(
      this.pool,
      ({ address, signal, timeoutMs }) =>
        fn(this.pool.client(AdminService, address), { timeoutMs, ...(signal ? { signal } : {}) }),
      {
        ...(options.signal ? { signal: options.signal } : {}),
        ...(options.timeoutMs === undefined ? {} : { deadline: Date.now() + options.timeoutMs }),
      },
    );
  }

  /**
   * Creates a queue with `shardCount` shards (default 1) and an optional
   * config. A queue of that name rejects with `AlreadyExistsError`,
   * unless `ifNotExists` is set: then the existing queue is returned as it
   * is (`created` false; `shardCount` and `config` are not applied).
   */
  createQueue(
    queue: string,
    options: { shardCount?: number; config?: QueueConfigInit; ifNotExists?: boolean } & CallOptions = {},
  ): Promise<CreateQueueResponse> {
    return this.call(
      (c, o) =>
        c.createQueue(
          {
            queue,
            shardCount: options.shardCount ?? 0,
            ...(options.config ? { config: options.config } : {}),
            ifNotExists: options.ifNotExists === true,
          },
          o,
        ),
      options,
    );
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

  /** Deletes a queue; refused while it holds messages or dead letters unless `force`. */
  async deleteQueue(queue: string, options: { force?: boolean } & CallOptions = {}): Promise<void> {
    await this.call((c, o) => c.deleteQueue({ queue, force: options.force ?? false }, o), options);
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
    );
  }

  /** Creates a subscription (consumer group) starting at the newest message (default) or the earliest. */
  createSubscription(
    queue: string,
    subscription: string,
    options: { start?: "latest" | "earliest" } & CallOptions = {},
  ): Promise<CreateSubscriptionResponse> {
    const start = options.start === "earliest" ? SubscriptionStart.EARLIEST : SubscriptionStart.LATEST;
    return this.call((c, o) => c.createSubscription({ queue, subscription, start }, o), options);
  }

  /** Deletes a subscription with its messages, leases and dead letters. */
  deleteSubscription(
    queue: string,
    subscription: string,
    options: CallOptions = {},
  ): Promise<DeleteSubscriptionResponse> {
    return this.call((c, o) => c.deleteSubscription({ queue, subscription }, o), options);
  }
}
