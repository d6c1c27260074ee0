/**
 * The producer: enqueue one message or a batch and get back ids once the
 * messages are durable in the object store.
 */
import { randomUUID } from "node:crypto";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs, timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { NewMessageSchema } from "@casq/api/casq/v1/message_pb.ts";
import type { EnqueueResponse } from "@casq/api/casq/v1/queue_service_pb.ts";
import { Code } from "@connectrpc/connect";
import { type ClientOptions, resolveClientOptions } from "./client-options.ts";
import { type BatchingOptions, EnqueueBatcher, mergeable } from "./enqueue-batcher.ts";
import { EnqueueStreams } from "./enqueue-stream.ts";
import { BatchRedirectError, CasqError } from "./errors.ts";
import { callWithFailover } from "./failover.ts";
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
   * `duplicate: true`. Set it to make your own retries exactly-once. Without
   * one the producer makes up a random id per message (see
   * {@link ProducerOptions.defaultDedupIds}), so that the SDK's own retries
   * of this call store the message once.
   */
  readonly dedupId?: string;
}

/** Options of a {@link Producer}. */
export interface ProducerOptions extends ClientOptions {
  /**
   * Give every message without a `dedupId` a random one (generated once per
   * call, so the SDK's retries of that call reuse it). An attempt that timed
   * out may still have been stored; with a dedup id, its retry at another
   * broker returns the stored message instead of storing it twice. Each id
   * costs about 100 bytes of the shard document for the queue's dedup window
   * (5 minutes by default); set `false` to save that at the price of possible
   * duplicates after an ambiguous failure. Default `true`.
   */
  readonly defaultDedupIds?: boolean;
  /**
   * Merge concurrent {@link Producer.enqueue} calls into one Enqueue
   * request per queue and event-loop turn (default `true`). Calls made in
   * the same turn (e.g. by many callers awaiting `enqueue` at once) go out
   * together after the turn, and each caller still gets its own result or
   * error: a request that fails with an error that may be about one message
   * (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, FAILED_PRECONDITION,
   * ALREADY_EXISTS, OUT_OF_RANGE) is resent message by message, so one bad
   * message fails only its own caller; other failures (after the usual
   * retries) reach every caller of the request. Calls with no `signal` and
   * the same `timeoutMs` are merged: those with a dedup id (the default)
   * with each other, and those with neither dedup id nor key with each
   * other (the broker stores such a request on one shard, all or none, so
   * it is resent message by message only after a refusal that stored
   * nothing). The merged request's deadline is its first caller's. Calls with a `signal`, or with a key and no dedup id, are
   * sent alone, as is every `enqueueBatch`.
   * Each message keeps its caller's trace context.
   *
   * `false` sends every call as its own request. An object sets the limits
   * of a merged request ({@link BatchingOptions}).
   */
  readonly batching?: boolean | BatchingOptions;
  /**
   * Send requests on one `EnqueueStream` per broker instead of one unary
   * `Enqueue` call each (default `true`): the same answers and errors, less
   * CPU and time per request. A stream is closed once no request was in
   * flight for a moment (or by {@link Producer.close}); a broker that lacks
   * the stream gets unary calls. `false`: unary calls only.
   */
  readonly enqueueStream?: boolean;
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
  /**
   * True when a message with the same dedup id was already stored; nothing
   * new was stored. Never for a message whose dedup id the producer made up
   * ({@link ProducerOptions.defaultDedupIds}): only this call could have
   * stored it, so a retry that found it stored (after an attempt whose answer
   * was lost, or a merged request refused for another caller's message) is
   * this call's own store.
   */
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

/**
 * How many times one batch (or a part of it) is split by BatchRedirects. One
 * split is the norm; more mean leadership moved while the parts were in
 * flight, and a fourth would mean it keeps moving faster than we can follow.
 */
export const MAX_BATCH_SPLITS = 3;

type NewMessageInit = MessageInitShape<typeof NewMessageSchema>;

/**
 * What every part of one enqueueBatch call shares: the caller's abort signal
 * and deadline, and for merged calls their trace context as the call's
 * (unset: the active context's, added by the transport).
 */
interface SendContext {
  readonly signal: AbortSignal | undefined;
  readonly deadline: number | undefined;
  readonly traceHeaders?: Record<string, string>;
}

/** Encodes a {@link Payload}; returns the bytes and whether it was JSON-encoded. */
export function encodePayload(payload: Payload): { bytes: Uint8Array; json: boolean } {
  if (payload instanceof Uint8Array) return { bytes: payload, json: false };
  if (typeof payload === "string") return { bytes: encoder.encode(payload), json: false };
  const text = JSON.stringify(payload);
  if (text === undefined) throw new TypeError("casq: payload is not JSON-serializable");
  return { bytes: encoder.encode(text), json: true };
}

function toNewMessage(message: OutgoingMessage, defaultDedupIds: boolean): NewMessageInit {
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
    // Generated here, once per call: every retry and split part resends this same id.
    dedupId: message.dedupId ?? (defaultDedupIds ? randomUUID() : ""),
    schedule:
      message.delayMs !== undefined
        ? { case: "delay", value: durationFromMs(Math.max(0, Math.round(message.delayMs))) }
        : message.runAt !== undefined
          ? { case: "runAt", value: timestampFromMs(message.runAt.getTime()) }
          : { case: undefined },
  };
}

/** The result of a message whose dedup id the producer made up: never a duplicate (see {@link EnqueueResult.duplicate}). */
function ownStore(result: EnqueueResult): EnqueueResult {
  return result.duplicate ? { ...result, duplicate: false } : result;
}

/**
 * Checks that `routes` give every one of `count` messages exactly one broker;
 * otherwise the results could not be put back in request order.
 */
function checkRoutes(error: BatchRedirectError, count: number): void {
  const seen = new Array<boolean>(count).fill(false);
  for (const route of error.routes) {
    if (route.leaderAddress === "" && route.messageIndexes.length > 0) {
      throw new CasqError(Code.Internal, "casq: BatchRedirect has a route without a broker address", {
        cause: error,
      });
    }
    for (const index of route.messageIndexes) {
      if (!Number.isInteger(index) || index < 0 || index >= count || seen[index]) {
        throw new CasqError(Code.Internal, `casq: BatchRedirect routes message ${index} of ${count} badly`, {
          cause: error,
        });
      }
      seen[index] = true;
    }
  }
  if (seen.includes(false)) {
    throw new CasqError(
      Code.Internal,
      `casq: BatchRedirect leaves some of ${count} messages without a route`,
      {
        cause: error,
      },
    );
  }
}

/**
 * An abort signal that fires when `parent` does or when the returned `abort`
 * is called; `dispose` unhooks it from `parent` so long-lived caller signals
 * do not collect listeners.
 */
function childSignal(parent: AbortSignal | undefined): {
  signal: AbortSignal;
  abort: (reason: unknown) => void;
  dispose: () => void;
} {
  const controller = new AbortController();
  const onAbort = () => controller.abort(parent?.reason);
  if (parent?.aborted) onAbort();
  else parent?.addEventListener("abort", onAbort, { once: true });
  return {
    signal: controller.signal,
    abort: (reason) => controller.abort(reason),
    dispose: () => parent?.removeEventListener("abort", onAbort),
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
  private readonly defaultDedupIds: boolean;
  /** Undefined when batching is off. */
  private readonly batcher: EnqueueBatcher | undefined;
  /** Sends each request, on a stream or as a unary call. */
  private readonly streams: EnqueueStreams;

  constructor(options: ProducerOptions) {
    this.pool = new BrokerPool(resolveClientOptions(options));
    this.streams = new EnqueueStreams(this.pool, options.enqueueStream ?? true);
    this.defaultDedupIds = options.defaultDedupIds ?? true;
    const batching = options.batching ?? true;
    this.batcher =
      batching === false
        ? undefined
        : new EnqueueBatcher(
            (queue, messages, deadline, traceHeaders) =>
              this.send(queue, messages, { signal: undefined, deadline, traceHeaders }, undefined, 0),
            () => this.pool.options.clock.now(),
            batching === true ? {} : batching,
          );
  }

  /**
   * Closes the producer's enqueue streams now instead of after their idle
   * moment (requests in flight are still answered). The producer stays
   * usable: a later call opens a stream again.
   */
  close(): void {
    this.streams.close();
  }

  /**
   * Enqueues one message; resolves once it is durable. Concurrent calls are
   * merged into one request unless batching is off (see
   * {@link ProducerOptions.batching}); the result and any error are this
   * message's own either way.
   */
  async enqueue(
    queue: string,
    payload: Payload,
    options: EnqueueOptions & CallOptions = {},
  ): Promise<EnqueueResult> {
    if (this.batcher !== undefined && options.signal === undefined) {
      const message = toNewMessage({ ...options, payload }, this.defaultDedupIds);
      // A keyed message without a dedup id could share a merged request with messages of
      // other shards, and a resend after a partial store would store it twice.
      if (mergeable(message)) {
        const result = await this.batcher.add(queue, message, options.timeoutMs);
        return options.dedupId === undefined ? ownStore(result) : result;
      }
    }
    const [result] = await this.enqueueBatch(queue, [{ ...options, payload }], options);
    return result as EnqueueResult;
  }

  /**
   * Enqueues 1..1000 messages in one request; resolves once all are durable,
   * with one result per message in order. On a multi-shard queue a redirect
   * or outage can leave part of a batch stored: the SDK resends the whole
   * batch, whose dedup ids (yours or the default ones) keep the stored part
   * from being stored twice.
   *
   * A batch whose shards are led by several brokers is answered with a
   * BatchRedirect (nothing stored): the SDK splits it into one request per
   * leader, sends those in parallel and merges the results, so the caller
   * sees one call. If one part fails, the others are aborted and the call
   * fails; parts that were stored stay stored (dedup ids make a retry safe).
   */
  async enqueueBatch(
    queue: string,
    messages: readonly OutgoingMessage[],
    options: CallOptions = {},
  ): Promise<EnqueueResult[]> {
    if (messages.length === 0) return [];
    // The deadline is fixed once, so that every part of a split batch counts against it.
    const ctx: SendContext = {
      signal: options.signal,
      deadline:
        options.timeoutMs === undefined ? undefined : this.pool.options.clock.now() + options.timeoutMs,
    };
    const encoded = messages.map((m) => toNewMessage(m, this.defaultDedupIds));
    const results = await this.send(queue, encoded, ctx, undefined, 0);
    if (!this.defaultDedupIds) return results;
    return results.map((r, i) => (messages[i]?.dedupId === undefined ? ownStore(r) : r));
  }

  /**
   * One Enqueue of `messages` through failover (starting at `address` when
   * given); on a BatchRedirect, the parts go to their routes' brokers
   * concurrently, each split again if leadership moved meanwhile.
   */
  private async send(
    queue: string,
    messages: readonly NewMessageInit[],
    ctx: SendContext,
    address: string | undefined,
    splits: number,
  ): Promise<EnqueueResult[]> {
    const request = { queue, messages: [...messages] };
    let response: EnqueueResponse;
    try {
      response = await callWithFailover(
        this.pool,
        (attempt) =>
          this.streams.enqueue(attempt.address, request, {
            timeoutMs: attempt.timeoutMs,
            signal: attempt.signal,
            traceHeaders: ctx.traceHeaders,
          }),
        {
          ...(ctx.signal ? { signal: ctx.signal } : {}),
          ...(ctx.deadline === undefined ? {} : { deadline: ctx.deadline }),
          ...(address === undefined ? {} : { address }),
          // Without a dedup id, a resend after an attempt that may have landed could store a message twice.
          idempotent: messages.every((m) => (m.dedupId ?? "") !== ""),
        },
      );
    } catch (error) {
      if (!(error instanceof BatchRedirectError)) throw error;
      return this.split(queue, messages, ctx, error, splits);
    }
    if (response.messages.length !== messages.length) {
      throw new CasqError(
        Code.Internal,
        `casq: broker returned ${response.messages.length} results for ${messages.length} messages`,
      );
    }
    return response.messages.map((m) => ({
      id: m.id,
      shard: m.shard,
      offset: m.offset,
      duplicate: m.duplicate,
    }));
  }

  /** Sends the routes of `redirect` in parallel and merges their results into request order. */
  private async split(
    queue: string,
    messages: readonly NewMessageInit[],
    ctx: SendContext,
    redirect: BatchRedirectError,
    splits: number,
  ): Promise<EnqueueResult[]> {
    if (splits >= MAX_BATCH_SPLITS) {
      throw new BatchRedirectError(
        `casq: batch still spans several leaders after ${splits} splits (leadership keeps moving); ` +
          "retry it later, with dedup ids parts already stored are not stored twice",
        redirect,
        { cause: redirect },
      );
    }
    checkRoutes(redirect, messages.length);
    const routes = redirect.routes.filter((r) => r.messageIndexes.length > 0);
    // A failed part aborts its siblings: the call fails anyway, and the caller
    // should not get its error while other parts keep retrying in the background.
    const child = childSignal(ctx.signal);
    const partCtx: SendContext = { ...ctx, signal: child.signal };
    // The first failure is the one to report; later ones are mostly the aborts it caused.
    let failed = false;
    let failure: unknown;
    try {
      const settled = await Promise.allSettled(
        routes.map((route) =>
          this.send(
            queue,
            route.messageIndexes.map((i) => messages[i] as NewMessageInit),
            partCtx,
            route.leaderAddress,
            splits + 1,
          ).catch((error: unknown) => {
            if (!failed) {
              failed = true;
              failure = error;
              child.abort(error);
            }
            throw error;
          }),
        ),
      );
      if (failed) throw failure;
      const results = new Array<EnqueueResult>(messages.length);
      routes.forEach((route, r) => {
        const part = (settled[r] as PromiseFulfilledResult<EnqueueResult[]>).value;
        route.messageIndexes.forEach((index, j) => {
          results[index] = part[j] as EnqueueResult;
        });
      });
      return results;
    } finally {
      child.dispose();
    }
  }
}
