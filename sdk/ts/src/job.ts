/**
 * A job as a worker handler sees it: the message, its delivery (receipt,
 * attempt) and an AbortSignal that fires when the worker no longer holds it.
 */
import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { ClaimedMessage } from "@casq/api/casq/v1/message_pb.ts";

/** W3C trace context the producer attached to a message. */
export interface JobTraceContext {
  readonly traceparent: string;
  readonly tracestate: string;
}

/** One delivery of one message to a worker handler. */
export interface Job {
  /** Message id (ULID). */
  readonly id: string;
  /** Queue of the message. */
  readonly queue: string;
  /** Subscription this delivery belongs to. */
  readonly subscription: string;
  /** Shard of the queue holding the message. */
  readonly shard: number;
  /** Offset of the message in its shard. */
  readonly offset: bigint;
  /** The body as enqueued. */
  readonly payload: Uint8Array;
  /** Application headers as enqueued. */
  readonly headers: Readonly<Record<string, string>>;
  /** Partition key ("" when none). */
  readonly key: string;
  /** Claim priority. */
  readonly priority: number;
  /** This delivery's attempt number, from 1. */
  readonly attempt: number;
  /** Attempts allowed before the message is dead-lettered. */
  readonly maxAttempts: number;
  /** Opaque name of this delivery (do not parse it). */
  readonly receipt: string;
  /** Producer's trace context, if it sent one. */
  readonly traceContext: JobTraceContext | undefined;
  /** When the message was stored. */
  readonly enqueuedAt: Date | undefined;
  /** Producer-chosen deduplication id ("" when none). */
  readonly dedupId: string;
  /**
   * When the lease of this delivery runs out, as granted with the claim; the
   * worker's heartbeats move the broker's deadline later than this.
   */
  readonly leaseDeadline: Date | undefined;
  /**
   * Aborted when the worker no longer holds the job: its lease was lost
   * (expired, purged, redriven) or the worker stopped hard. Stop working then;
   * the outcome of the handler will not be acked.
   */
  readonly signal: AbortSignal;
  /** The payload decoded as UTF-8. */
  text(): string;
  /** The payload parsed as JSON (UTF-8). */
  json<T = unknown>(): T;
}

const decoder = new TextDecoder();

/**
 * A delivery's {@link Job}: one class, so that every job shares one shape
 * and `signal`, `text` and `json` are getters on the prototype (an object
 * literal with a getter and two closures per job was ~1.9 KB of heap a job,
 * in dictionary mode; an instance of this is ~0.45 KB).
 */
class DeliveredJob implements Job {
  readonly id: string;
  readonly queue: string;
  readonly subscription: string;
  readonly shard: number;
  readonly offset: bigint;
  readonly payload: Uint8Array;
  readonly headers: Readonly<Record<string, string>>;
  readonly key: string;
  readonly priority: number;
  readonly attempt: number;
  readonly maxAttempts: number;
  readonly receipt: string;
  readonly traceContext: JobTraceContext | undefined;
  readonly enqueuedAt: Date | undefined;
  readonly dedupId: string;
  readonly leaseDeadline: Date | undefined;
  readonly #signal: () => AbortSignal;

  constructor(claimed: ClaimedMessage, signal: () => AbortSignal) {
    const m = claimed.message;
    const trace = m?.traceContext;
    this.id = m?.id ?? "";
    this.queue = m?.queue ?? "";
    this.subscription = claimed.subscription;
    this.shard = m?.shard ?? 0;
    this.offset = m?.offset ?? 0n;
    this.payload = m?.payload ?? new Uint8Array();
    this.headers = { ...(m?.headers ?? {}) };
    this.key = m?.key ?? "";
    this.priority = m?.priority ?? 0;
    this.attempt = claimed.attempt;
    this.maxAttempts = claimed.maxAttempts;
    this.receipt = claimed.receipt;
    this.traceContext =
      trace && trace.traceparent !== ""
        ? { traceparent: trace.traceparent, tracestate: trace.tracestate }
        : undefined;
    this.enqueuedAt = m?.enqueuedAt ? timestampDate(m.enqueuedAt) : undefined;
    this.dedupId = m?.dedupId ?? "";
    this.leaseDeadline = claimed.leaseDeadline ? timestampDate(claimed.leaseDeadline) : undefined;
    this.#signal = signal;
  }

  get signal(): AbortSignal {
    return this.#signal();
  }

  // Getters that hand out functions bound to this job, so that a handler may
  // take them apart as well (`async ({ json }) => json()`); made when read.
  get text(): () => string {
    const payload = this.payload;
    return () => decoder.decode(payload);
  }

  get json(): <T = unknown>() => T {
    const payload = this.payload;
    return <T>() => JSON.parse(decoder.decode(payload)) as T;
  }
}

/**
 * Builds the {@link Job} of a delivery. `signal` is called each time
 * `job.signal` is read and must answer the same signal every time (the worker
 * makes it on first read: see worker/lazy-abort.ts).
 */
export function jobFromClaim(claimed: ClaimedMessage, signal: () => AbortSignal): Job {
  return new DeliveredJob(claimed, signal);
}
