/**
 * The producer: enqueue one message or a batch and get back ids once the
 * messages are durable in the object store.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs, timestampFromMs } from "@bufbuild/protobuf/wkt";
import { type ClientOptions, resolveClientOptions } from "./client-options.ts";
import { callWithFailover } from "./failover.ts";
import type { NewMessageSchema } from "./gen/casq/v1/message_pb.ts";
import { QueueService } from "./gen/casq/v1/queue_service_pb.ts";
import { BrokerPool } from "./transport.ts";

/**
 * A message body. A `Uint8Array` is sent as it is, a `string` as UTF-8, and
 * anything else is JSON-encoded (`JSON.stringify`) with the header
 * `content-type: application/json` added unless you set one.
 */
export type Payload = Uint8Array | string | object | number | boolean | null;

/** Per-message options of an enqueue. All optional. */
export interface EnqueueOptions {
  /** Partition key: messages with one key share a shard and keep their order. */
  readonly key?: string;
  /** Claim priority in [-1000, 1000]; higher first. Default 0. */
  readonly priority?: number;
  /** Run no earlier than this many ms after the message is stored. */
  readonly delayMs?: number;
  /** Run no earlier than this time (exclusive with `delayMs`). */
  readonly runAt?: Date;
  /** Application headers copied to every delivery. */
  readonly headers?: Record<string, string>;
  /** Deliveries before dead-lettering, 1..1000. Default: the queue's (5). */
  readonly maxAttempts?: number;
  /**
   * Deduplication id: a second enqueue with the same id within the queue's
   * dedup window stores nothing and returns the original id with
   * `duplicate: true`. Set it to make retries (yours and the SDK's failover)
   * exactly-once.
   */
  readonly dedupId?: string;
}

/** One message of {@link Producer.enqueueBatch}: a payload plus its options. */
export interface OutgoingMessage extends EnqueueOptions {
  readonly payload: Payload;
}

/** Where a message was stored. */
export interface EnqueueResult {
  /** Message id (26-character ULID). */
  readonly id: string;
  /** Shard of the queue that holds it. */
  readonly shard: number;
  /** Offset within the shard. */
  readonly offset: bigint;
  /** True when a message with the same dedup id was already stored; nothing new was stored. */
  readonly duplicate: boolean;
}

/** Per-call options. */
export interface CallOptions {
  /** Aborts the call. */
  readonly signal?: AbortSignal;
  /** Deadline for the whole call including failover retries, in ms from now. */
  readonly timeoutMs?: number;
}

const encoder = new TextEncoder();

/** Encodes a {@link Payload}; returns the bytes and whether it was JSON-encoded. */
export function encodePayload(payload: Payload): { bytes: Uint8Array; json: boolean } {
  if (payload instanceof Uint8Array) return { bytes: payload, json: false };
  if (typeof payload === "string") return { bytes: encoder.encode(payload), json: false };
  const text = JSON.stringify(payload);
  if (text === undefined) throw new TypeError("casq: payload is not JSON-serializable");
  return { bytes: encoder.encode(text), json: true };
}

function toNewMessage(message: OutgoingMessage): MessageInitShape<typeof NewMessageSchema> {
  const { bytes, json } = encodePayload(message.payload);
  const headers = { ...(message.headers ?? {}) };
  if (json && !Object.keys(headers).some((h) => h.toLowerCase() === "content-type")) {
    headers["content-type"] = "application/json";
  }
  if (message.delayMs !== undefined && message.runAt !== undefined) {
    throw new TypeError("casq: set delayMs or runAt, not both");
  }
  return {
    payload: bytes,
    headers,
    key: message.key ?? "",
    priority: message.priority ?? 0,
    maxAttempts: message.maxAttempts ?? 0,
    dedupId: message.dedupId ?? "",
    schedule:
      message.delayMs !== undefined
        ? { case: "delay", value: durationFromMs(Math.max(0, Math.round(message.delayMs))) }
        : message.runAt !== undefined
          ? { case: "runAt", value: timestampFromMs(message.runAt.getTime()) }
          : { case: undefined },
  };
}

/**
 * Enqueues messages. Safe to share; calls go to any broker and follow
 * redirects to the shard's leader.
 *
 * @example
 * const producer = new Producer({ brokers: ["127.0.0.1:50051"] });
 * const { id } = await producer.enqueue("emails", { to: "ann@example.com" });
 */
export class Producer {
  private readonly pool: BrokerPool;

  constructor(options: ClientOptions) {
    this.pool = new BrokerPool(resolveClientOptions(options));
  }

  /** Enqueues one message; resolves once it is durable. */
  async enqueue(
    queue: string,
    payload: Payload,
    options: EnqueueOptions & CallOptions = {},
  ): Promise<EnqueueResult> {
    const [result] = await this.enqueueBatch(queue, [{ ...options, payload }], options);
    return result as EnqueueResult;
  }

  /**
   * Enqueues 1..1000 messages in one request; resolves once all are durable,
   * with one result per message in order. On a multi-shard queue a redirect
   * or outage can leave part of a batch stored: the SDK resends the whole
   * batch, so give messages dedup ids when duplicates matter.
   */
  async enqueueBatch(
    queue: string,
    messages: readonly OutgoingMessage[],
    options: CallOptions = {},
  ): Promise<EnqueueResult[]> {
    if (messages.length === 0) return [];
    const request = { queue, messages: messages.map(toNewMessage) };
    const response = await callWithFailover(
      this.pool,
      ({ address, signal, timeoutMs }) =>
        this.pool
          .client(QueueService, address)
          .enqueue(request, { timeoutMs, ...(signal ? { signal } : {}) }),
      {
        ...(options.signal ? { signal: options.signal } : {}),
        ...(options.timeoutMs === undefined ? {} : { deadline: Date.now() + options.timeoutMs }),
      },
    );
    return response.messages.map((m) => ({
      id: m.id,
      shard: m.shard,
      offset: m.offset,
      duplicate: m.duplicate,
    }));
  }
}
