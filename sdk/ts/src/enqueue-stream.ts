/**
 * Enqueue requests on one `QueueService.EnqueueStream` per broker, instead
 * of one unary `Enqueue` call each (protocol in docs/protocol.md).
 *
 * Why: a unary call opens an HTTP/2 stream and runs a call on both sides
 * (headers, call objects, trailers) for every request; on an open stream a
 * request is one message and its answer another. That is less CPU on both
 * sides and less time from `enqueue` to the job at a worker
 * (docs/benchmarks.md).
 *
 * What a caller sees is what the unary call gives: the same answer, and on
 * failure the same errors (the broker answers a failed request with the
 * status the unary call would have had, redirects included), so failover,
 * redirects and batch splits in the producer work unchanged. The
 * differences, all handled here:
 *
 * - **Streams come and go.** A stream to a broker is opened by the first
 *   request for it and closed once no request was in flight for
 *   {@link STREAM_LINGER_MS} (so an idle producer holds no stream, and a
 *   process that is done exits), or by {@link EnqueueStreams.close}.
 * - **A broken stream.** Requests unanswered when a stream breaks fail with
 *   {@link OutcomeUnknownError} (they may have been applied; the producer's
 *   failover resends them only when that is safe), unless the connection
 *   was never made (nothing was sent), the broker refused the stream as a
 *   whole (e.g. authentication), or the broker said that it answered every
 *   request it read (`casq-not-applied`, a graceful shutdown): then with
 *   that error, which failover resends whatever the request.
 * - **A hung broker.** A request unanswered after the client's `timeoutMs`
 *   fails DEADLINE_EXCEEDED and breaks the stream (the others then fail as
 *   above); a shorter deadline of the caller's fails only its request.
 * - **An older broker** answers UNIMPLEMENTED: from then on requests to it
 *   go as unary calls.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { TraceContextSchema } from "@casq/api/casq/v1/message_pb.ts";
import {
  type EnqueueRequestSchema,
  type EnqueueResponse,
  type EnqueueStreamRequestSchema,
  type EnqueueStreamResponse,
  QueueService,
} from "@casq/api/casq/v1/queue_service_pb.ts";
import { Code, ConnectError } from "@connectrpc/connect";
import { context, ROOT_CONTEXT } from "@opentelemetry/api";
import { AsyncQueue } from "./async-queue.ts";
import { type SdkClock, startTimer } from "./clock.ts";
import {
  CasqError,
  fromRpcStatus,
  NOT_APPLIED_TRAILER,
  OutcomeUnknownError,
  toCasqError,
  UnavailableError,
} from "./errors.ts";
import { callAborted, neverSent } from "./failover.ts";
import { activeTraceHeaders, type BrokerPool } from "./transport.ts";

/** A stream with no request in flight for this long is closed. */
export const STREAM_LINGER_MS = 250;

/** A broker that answered UNIMPLEMENTED is asked for the stream again after this long (it may have been upgraded). */
const UNARY_ONLY_MS = 60_000;

/** The longest timer Node keeps (`setTimeout` fires at once beyond it). */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** The longest `timeout` a broker takes on a request (longer ones are sent without). */
const MAX_REQUEST_TIMEOUT_MS = 24 * 60 * 60 * 1000;

type EnqueueRequestInit = MessageInitShape<typeof EnqueueRequestSchema>;
type EnqueueStreamRequestInit = MessageInitShape<typeof EnqueueStreamRequestSchema>;

/** One request's options, as for the unary call. */
export interface StreamRequestOptions {
  /** The attempt's timeout (the unary call's `timeoutMs`). */
  readonly timeoutMs: number;
  /** Aborts the request (its answer, if any, is dropped). */
  readonly signal?: AbortSignal | undefined;
  /** The request's W3C trace context; unset: the active span's. */
  readonly traceHeaders?: Readonly<Record<string, string>> | undefined;
}

/**
 * How the producer sends its Enqueue requests: on EnqueueStreams, one per
 * broker address at a time (see the module header), or as unary calls.
 */
export class EnqueueStreams {
  private readonly open = new Map<string, EnqueueStream>();
  /** Brokers that answered UNIMPLEMENTED, and until when they get unary calls. */
  private readonly unaryOnly = new Map<string, number>();

  /** `useStreams` false: every request is a unary call (the producer's `enqueueStream: false`). */
  constructor(
    private readonly pool: BrokerPool,
    private readonly useStreams = true,
  ) {}

  /** Sends `request` to the broker at `address` and resolves with its answer. */
  async enqueue(
    address: string,
    request: EnqueueRequestInit,
    options: StreamRequestOptions,
  ): Promise<EnqueueResponse> {
    if (this.useStreams && (this.unaryOnly.get(address) ?? 0) <= this.pool.options.clock.now()) {
      try {
        return await this.stream(address).send(request, options);
      } catch (error) {
        if (!(error instanceof StreamUnimplemented)) throw error;
        this.unaryOnly.set(address, this.pool.options.clock.now() + UNARY_ONLY_MS);
      }
    }
    return this.pool.client(QueueService, address).enqueue(request, {
      timeoutMs: options.timeoutMs,
      ...(options.signal ? { signal: options.signal } : {}),
      ...(options.traceHeaders ? { headers: options.traceHeaders } : {}),
    });
  }

  /** Closes every stream: the requests in flight are still answered. */
  close(): void {
    for (const stream of this.open.values()) stream.finish();
    this.open.clear();
  }

  private stream(address: string): EnqueueStream {
    let stream = this.open.get(address);
    if (stream === undefined || stream.closed) {
      const fresh = new EnqueueStream(address, this.pool, () => {
        if (this.open.get(address) === fresh) this.open.delete(address);
      });
      this.open.set(address, fresh);
      stream = fresh;
    }
    return stream;
  }
}

/** The broker does not have EnqueueStream (nothing was applied): send unary calls. */
class StreamUnimplemented extends Error {}

/** A request waiting for its answer. */
interface Pending {
  readonly resolve: (response: EnqueueResponse) => void;
  readonly reject: (error: unknown) => void;
  readonly cancelTimer: () => void;
  readonly unhook: () => void;
}

/** One EnqueueStream to one broker. */
class EnqueueStream {
  private readonly requests = new AsyncQueue<EnqueueStreamRequestInit>();
  private readonly pending = new Map<bigint, Pending>();
  private readonly abort = new AbortController();
  private readonly clock: SdkClock;
  private nextId = 0n;
  private cancelLinger: (() => void) | undefined;
  /** When the broker was last heard from on this stream (opened, or an answer). */
  private lastHeardAt: number;
  /** Settles when the stream has ended or broken (and its pending requests failed). */
  private readonly ended: Promise<void>;
  /** True once no request may be sent on it any more. */
  closed = false;

  constructor(
    readonly address: string,
    private readonly pool: BrokerPool,
    private readonly onClosed: () => void,
  ) {
    this.clock = pool.options.clock;
    this.lastHeardAt = this.clock.now();
    // Outside any caller's trace context: each request carries its own.
    this.ended = context.with(ROOT_CONTEXT, () =>
      this.read(
        pool.client(QueueService, address).enqueueStream(this.requests, { signal: this.abort.signal }),
      ),
    );
  }

  send(request: EnqueueRequestInit, options: StreamRequestOptions): Promise<EnqueueResponse> {
    const { signal, timeoutMs } = options;
    if (signal?.aborted) return Promise.reject(callAborted(signal));
    if (this.closed)
      return Promise.reject(
        new UnavailableError(`casq: the enqueue stream to ${this.address} is closed; resend`),
      );
    const requestId = ++this.nextId;
    const trace = options.traceHeaders ?? activeTraceHeaders();
    this.cancelLinger?.();
    this.cancelLinger = undefined;
    // As for a unary call: 0 (or no finite value) means no timeout.
    const bounded = Number.isFinite(timeoutMs) && timeoutMs > 0;
    return new Promise<EnqueueResponse>((resolve, reject) => {
      const onAbort = () => this.settle(requestId, callAborted(signal));
      signal?.addEventListener("abort", onAbort, { once: true });
      const cancelTimer =
        bounded && timeoutMs <= MAX_TIMER_MS
          ? startTimer(this.clock, timeoutMs, () => this.timedOut(requestId, timeoutMs), { unref: true })
          : () => {};
      this.pending.set(requestId, {
        resolve,
        reject,
        cancelTimer,
        unhook: () => signal?.removeEventListener("abort", onAbort),
      });
      this.requests.push({
        requestId,
        enqueue: request,
        ...(trace.traceparent === undefined
          ? {}
          : {
              traceContext: create(TraceContextSchema, {
                traceparent: trace.traceparent,
                tracestate: trace.tracestate ?? "",
              }),
            }),
        ...(bounded && timeoutMs <= MAX_REQUEST_TIMEOUT_MS ? { timeout: durationFromMs(timeoutMs) } : {}),
      });
    });
  }

  /**
   * Half-closes the stream: no more requests; those in flight are still
   * answered. A broker that has not ended the stream within the client's
   * timeout then (e.g. still at a request whose caller gave up) has it
   * cancelled, so that it does not keep the process alive.
   */
  finish(): void {
    if (this.closed) return;
    this.closed = true;
    this.cancelLinger?.();
    this.requests.end();
    this.onClosed();
    const cancel = startTimer(
      this.clock,
      Math.min(this.pool.options.timeoutMs, MAX_TIMER_MS),
      () => this.abort.abort(),
      { unref: true },
    );
    void this.ended.then(cancel);
  }

  private async read(answers: AsyncIterable<EnqueueStreamResponse>): Promise<void> {
    let failure: unknown;
    try {
      for await (const answer of answers) this.answered(answer);
    } catch (error) {
      failure = error;
    }
    this.broken(failure);
  }

  private answered(answer: EnqueueStreamResponse): void {
    this.lastHeardAt = this.clock.now();
    const { result } = answer;
    if (result.case === "enqueued") this.settle(answer.requestId, undefined, result.value);
    else this.settle(answer.requestId, fromRpcStatus(result.value));
  }

  /** Resolves or rejects one pending request; starts the linger once none is left. */
  private settle(requestId: bigint, error: unknown, response?: EnqueueResponse): void {
    const waiter = this.pending.get(requestId);
    if (waiter === undefined) return;
    this.pending.delete(requestId);
    waiter.cancelTimer();
    waiter.unhook();
    if (error === undefined) waiter.resolve(response as EnqueueResponse);
    else waiter.reject(error);
    if (this.pending.size === 0 && !this.closed)
      this.cancelLinger = startTimer(this.clock, STREAM_LINGER_MS, () => this.finish(), { unref: true });
  }

  /**
   * A request's own timeout passed: it fails DEADLINE_EXCEEDED. When that
   * was the client's full timeout (not a caller's shorter deadline) and the
   * broker answered nothing else on the stream all that time, the broker
   * seems hung and the stream is given up; a broker that answers other
   * requests is only slow at this one (a slow shard), and the stream stays.
   */
  private timedOut(requestId: bigint, timeoutMs: number): void {
    this.settle(
      requestId,
      new CasqError(Code.DeadlineExceeded, `casq: no answer from ${this.address} within ${timeoutMs} ms`),
    );
    const silentMs = this.clock.now() - this.lastHeardAt;
    if (timeoutMs >= this.pool.options.timeoutMs && silentMs >= timeoutMs) {
      this.abort.abort();
      this.broken(
        new CasqError(
          Code.Unavailable,
          `casq: a request on the enqueue stream to ${this.address} went unanswered for ${timeoutMs} ms; ` +
            "the broker seems hung, leaving it",
        ),
      );
    }
  }

  /** The stream ended (`failure` undefined) or broke: fails what is still pending (see the module header). */
  private broken(failure: unknown): void {
    this.finish();
    this.abort.abort();
    if (this.pending.size === 0) return;
    const error = pendingError(this.address, failure);
    for (const id of [...this.pending.keys()]) this.settle(id, error);
  }
}

/** What the requests still pending on a stream that ended with `failure` fail with. */
function pendingError(address: string, failure: unknown): unknown {
  if (failure === undefined)
    return new OutcomeUnknownError(
      `casq: the enqueue stream to ${address} ended before answering the request`,
    );
  const error = toCasqError(failure);
  if (error.code === Code.Unimplemented) return new StreamUnimplemented(error.message);
  // The broker answered every request it read (a graceful shutdown): the rest never reached it.
  if (failure instanceof ConnectError && failure.metadata.get(NOT_APPLIED_TRAILER) === "true")
    return new UnavailableError(`casq: ${error.message} (the request was not applied)`, { cause: error });
  if (neverSent(error)) return error;
  // Refused by the broker as a whole (authentication, permissions): no request was handled.
  if (error.code === Code.Unauthenticated || error.code === Code.PermissionDenied) return error;
  return new OutcomeUnknownError(
    `casq: the enqueue stream to ${address} broke before the request was answered (${error.message}); ` +
      "it may or may not have been applied",
    { cause: error },
  );
}
