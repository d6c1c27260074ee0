/**
 * Merging of concurrent {@link Producer.enqueue} calls: the calls made in one
 * event-loop turn for one queue (and one `timeoutMs`) are sent as a single
 * Enqueue RPC, and each caller gets its own message's result or error.
 *
 * Why: the client's cost of an RPC (HTTP/2, protocol library) is far above
 * the cost of one more message in a request, and the broker commits a
 * batch in one write; 64 callers awaiting `enqueue` at once need one RPC,
 * not 64.
 *
 * A merged request holds either messages that all have a dedup id, or
 * messages that have neither dedup id nor key (calls with a key and no
 * dedup id are not merged). With dedup ids, a retried or split batch and the
 * per-message resend below store each message once. Without them, the
 * broker puts every message of the request on one shard, so the request is
 * stored all or none: it is never resent after it may have landed, and it
 * is resent message by message only after a refusal that stored nothing
 * ({@link NOTHING_STORED_FAULTS}).
 *
 * A merged request that fails with an error that may be about one of its
 * messages (see {@link MAY_BE_ONE_MESSAGES_FAULT}) is resent as one request
 * per message, so that each caller sees the outcome it would have seen
 * alone and one bad message does not fail the others. Other failures
 * (outages after the SDK's retries, the deadline, a missing queue, auth)
 * are about the request as a whole and reach every caller of it.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { type NewMessageSchema, TraceContextSchema } from "@casq/api/casq/v1/message_pb.ts";
import { Code } from "@connectrpc/connect";
import { context, ROOT_CONTEXT } from "@opentelemetry/api";
import { toCasqError } from "./errors.ts";
import { activeTraceHeaders } from "./transport.ts";

type NewMessageInit = MessageInitShape<typeof NewMessageSchema>;

/** Limits of one merged Enqueue request. */
export interface BatchingOptions {
  /**
   * Most messages in one merged request, 1..1000 (the broker's limit per
   * Enqueue). Lower it for a queue whose `max_batch` is lower. Default 1000.
   */
  readonly maxMessages?: number;
  /**
   * Most bytes (payloads, keys, headers, dedup ids) in one merged request; a
   * call that would pass it starts the next request. A single message above
   * it is sent alone. Default 4 MiB.
   */
  readonly maxBytes?: number;
}

/** Default of {@link BatchingOptions.maxMessages}: the broker's most messages per Enqueue. */
export const DEFAULT_BATCH_MESSAGES = 1000;
/** Default of {@link BatchingOptions.maxBytes}. */
export const DEFAULT_BATCH_BYTES = 4 * 1024 * 1024;

/**
 * Codes of a failed Enqueue that may be caused by one of its messages (a
 * bad field, a payload over a limit, a batch above the queue's `max_batch`,
 * a shard too full for all of them but not for each), or by the shard of
 * some of them only (a shard refused as unreadable, `DATA_LOSS`; a fault of
 * one shard's write, `INTERNAL`) while the other shards stored their parts:
 * a merged request that fails so is resent message by message.
 */
export const MAY_BE_ONE_MESSAGES_FAULT: ReadonlySet<Code> = new Set([
  Code.InvalidArgument,
  Code.ResourceExhausted,
  Code.FailedPrecondition,
  Code.AlreadyExists,
  Code.OutOfRange,
  Code.DataLoss,
  Code.Internal,
]);

/**
 * The codes of {@link MAY_BE_ONE_MESSAGES_FAULT} that say a request applied
 * on one shard stored nothing (`INTERNAL` does not say so): after one of
 * these a merged request without dedup ids is resent message by message.
 */
export const NOTHING_STORED_FAULTS: ReadonlySet<Code> = new Set(
  [...MAY_BE_ONE_MESSAGES_FAULT].filter((code) => code !== Code.Internal),
);

/** Most requests in flight at once while a failed merged request is resent message by message. */
export const RESEND_PARALLEL = 16;

/** Result of one message, as the producer hands it back. */
export interface BatchedResult {
  readonly id: string;
  readonly shard: number;
  readonly offset: bigint;
  readonly duplicate: boolean;
}

/**
 * Sends one Enqueue of `messages` (the producer's failover, redirects and
 * splits) with `traceHeaders` as the call's trace context, and `deadline`
 * (epoch ms) for the whole call when set. Results are in request order.
 */
export type SendEnqueue = (
  queue: string,
  messages: readonly NewMessageInit[],
  deadline: number | undefined,
  traceHeaders: Record<string, string>,
) => Promise<BatchedResult[]>;

/** One caller waiting in a batch. */
interface Waiter {
  readonly message: NewMessageInit;
  /** The caller's trace context, read when it called. */
  readonly trace: Record<string, string>;
  readonly resolve: (result: BatchedResult) => void;
  readonly reject: (error: unknown) => void;
}

/** Calls collected for one request. */
interface OpenBatch {
  readonly queue: string;
  /** Its messages have dedup ids (else none has a dedup id or a key). */
  readonly deduplicated: boolean;
  /** Fixed by the first caller: the batch's deadline is its earliest caller's. */
  readonly deadline: number | undefined;
  readonly waiters: Waiter[];
  bytes: number;
}

/** Whether `message` may share a merged request: it has a dedup id, or neither dedup id nor key (see module header). */
export function mergeable(message: NewMessageInit): boolean {
  return (message.dedupId ?? "") !== "" || (message.key ?? "") === "";
}

/** Rough size of a message in a request, for {@link BatchingOptions.maxBytes}. */
export function approxMessageBytes(message: NewMessageInit): number {
  let bytes =
    32 + (message.payload?.length ?? 0) + (message.key?.length ?? 0) + (message.dedupId?.length ?? 0);
  for (const [name, value] of Object.entries(message.headers ?? {})) bytes += name.length + value.length + 4;
  return bytes;
}

function sameTrace(a: Record<string, string>, b: Record<string, string>): boolean {
  return a.traceparent === b.traceparent && a.tracestate === b.tracestate;
}

/**
 * Collects {@link Producer.enqueue} calls and sends them in merged requests
 * (see module header). Used by the producer only.
 */
export class EnqueueBatcher {
  private readonly maxMessages: number;
  private readonly maxBytes: number;
  /** Batches still taking calls, by queue and timeout. */
  private readonly open = new Map<string, OpenBatch>();
  private flushScheduled = false;

  constructor(
    private readonly send: SendEnqueue,
    private readonly now: () => number,
    options: BatchingOptions = {},
  ) {
    const maxMessages = options.maxMessages ?? DEFAULT_BATCH_MESSAGES;
    if (!Number.isInteger(maxMessages) || maxMessages < 1 || maxMessages > DEFAULT_BATCH_MESSAGES)
      throw new TypeError(`casq: batching.maxMessages must be an integer in 1..1000 (got ${maxMessages})`);
    const maxBytes = options.maxBytes ?? DEFAULT_BATCH_BYTES;
    if (!Number.isFinite(maxBytes) || maxBytes < 1)
      throw new TypeError(`casq: batching.maxBytes must be a positive number (got ${maxBytes})`);
    this.maxMessages = maxMessages;
    this.maxBytes = maxBytes;
  }

  /**
   * Adds one message to the open batch of `queue`, `timeoutMs` and its kind
   * (with a dedup id, or with neither dedup id nor key: see the module
   * header); resolves with its own result once the batch is answered.
   */
  add(queue: string, message: NewMessageInit, timeoutMs: number | undefined): Promise<BatchedResult> {
    if (!mergeable(message))
      return Promise.reject(new TypeError("casq: a keyed message without a dedup id is not merged"));
    const deduplicated = (message.dedupId ?? "") !== "";
    return new Promise<BatchedResult>((resolve, reject) => {
      const bytes = approxMessageBytes(message);
      const group = `${deduplicated ? "d" : "u"}${timeoutMs ?? ""}\u0000${queue}`;
      let batch = this.open.get(group);
      if (batch !== undefined && batch.waiters.length > 0 && batch.bytes + bytes > this.maxBytes) {
        this.open.delete(group);
        this.dispatch(batch);
        batch = undefined;
      }
      if (batch === undefined) {
        batch = {
          queue,
          deduplicated,
          deadline: timeoutMs === undefined ? undefined : this.now() + timeoutMs,
          waiters: [],
          bytes: 0,
        };
        this.open.set(group, batch);
      }
      batch.waiters.push({ message, trace: activeTraceHeaders(), resolve, reject });
      batch.bytes += bytes;
      if (batch.waiters.length >= this.maxMessages || batch.bytes >= this.maxBytes) {
        this.open.delete(group);
        this.dispatch(batch);
      } else if (!this.flushScheduled) {
        // After this turn: calls made by the callers' code in the same turn join the batch.
        this.flushScheduled = true;
        setImmediate(() => this.flush());
      }
    });
  }

  private flush(): void {
    this.flushScheduled = false;
    const batches = [...this.open.values()];
    this.open.clear();
    for (const batch of batches) this.dispatch(batch);
  }

  /** Sends `batch` (outside any caller's trace context) and settles its callers; never rejects. */
  private dispatch(batch: OpenBatch): void {
    void context.with(ROOT_CONTEXT, () => this.settle(batch));
  }

  private async settle(batch: OpenBatch): Promise<void> {
    const { waiters } = batch;
    try {
      const results = await this.sendMerged(batch.queue, waiters, batch.deadline);
      waiters.forEach((w, i) => {
        w.resolve(results[i] as BatchedResult);
      });
    } catch (thrown) {
      const error = toCasqError(thrown);
      const resendable = batch.deduplicated ? MAY_BE_ONE_MESSAGES_FAULT : NOTHING_STORED_FAULTS;
      if (waiters.length === 1 || !resendable.has(error.code)) {
        for (const w of waiters) w.reject(error);
        return;
      }
      await this.sendEach(batch.queue, waiters, batch.deadline);
    }
  }

  /**
   * One request for all of `waiters`. Callers with one trace context (the
   * usual case: one caller, or all inside one span, or none) share it as the
   * call's; otherwise each message carries its caller's in its own
   * `trace_context`, and the call has none.
   */
  private sendMerged(
    queue: string,
    waiters: readonly Waiter[],
    deadline: number | undefined,
  ): Promise<BatchedResult[]> {
    const first = waiters[0] as Waiter;
    if (waiters.every((w) => sameTrace(w.trace, first.trace))) {
      return this.send(
        queue,
        waiters.map((w) => w.message),
        deadline,
        first.trace,
      );
    }
    const messages = waiters.map((w): NewMessageInit => {
      const { traceparent, tracestate } = w.trace;
      if (traceparent === undefined) return w.message;
      return {
        ...w.message,
        traceContext: create(TraceContextSchema, { traceparent, tracestate: tracestate ?? "" }),
      };
    });
    return this.send(queue, messages, deadline, {});
  }

  /**
   * One request per message, so each caller gets the outcome it would have
   * had alone. Messages with one key go one after another, in call order,
   * to keep their order in the shard; unkeyed messages and different keys
   * go in parallel, at most {@link RESEND_PARALLEL} requests at a time (one
   * bad message among 1,000 unkeyed ones costs ~1,000 / 16 round trips, not
   * 1,000).
   */
  private async sendEach(
    queue: string,
    waiters: readonly Waiter[],
    deadline: number | undefined,
  ): Promise<void> {
    const lanes: Waiter[][] = [];
    const byKey = new Map<string, Waiter[]>();
    for (const w of waiters) {
      const key = w.message.key ?? "";
      if (key === "") {
        lanes.push([w]);
        continue;
      }
      const lane = byKey.get(key);
      if (lane === undefined) {
        const fresh = [w];
        byKey.set(key, fresh);
        lanes.push(fresh);
      } else lane.push(w);
    }
    let next = 0;
    const runner = async () => {
      while (next < lanes.length) {
        const lane = lanes[next++] as Waiter[];
        for (const w of lane) {
          try {
            const [result] = await this.send(queue, [w.message], deadline, w.trace);
            w.resolve(result as BatchedResult);
          } catch (error) {
            w.reject(toCasqError(error));
          }
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(RESEND_PARALLEL, lanes.length) }, runner));
  }
}
