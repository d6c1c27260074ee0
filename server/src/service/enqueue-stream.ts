/**
 * QueueService.EnqueueStream: Enqueue requests on one long-lived stream
 * (protocol in `proto/casq/v1/queue_service.proto` and `docs/protocol.md`).
 *
 * Each request is handled as a unary Enqueue would be (`enqueue-request.ts`),
 * concurrently with the others, and answered by its request_id once its
 * messages are durable, or with the status the unary call would have failed
 * with. A failed request never ends the stream. Per request, as per unary
 * call: a span of its own (child of the request's trace context), the RPC
 * metrics under `method="EnqueueStream"`, and its `timeout` as its deadline.
 *
 * At most {@link MAX_REQUESTS_IN_FLIGHT} requests of a stream are held at
 * once (worked on, or answered but the answer not yet written out); the
 * stream is read no further until an answer went out.
 *
 * End: on half-close the requests read are answered, then the stream ends
 * with OK. While the server shuts down gracefully ({@link
 * EnqueueStreamSession.drain}) new requests are answered UNAVAILABLE (not
 * applied), those in flight are answered, then the stream ends with
 * UNAVAILABLE; a stream that has not ended by the end of the grace is reset.
 */

import { setMaxListeners } from "node:events";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { RpcStatusSchema } from "@casq/api/casq/v1/errors_pb.ts";
import type { TraceContext } from "@casq/api/casq/v1/message_pb.ts";
import type {
  EnqueueStreamRequest,
  EnqueueStreamResponseSchema,
  QueueService,
} from "@casq/api/casq/v1/queue_service_pb.ts";
import { AsyncQueue } from "@casq/sdk/async-queue.ts";
import { NOT_APPLIED_TRAILER } from "@casq/sdk/errors.ts";
import { Code, ConnectError, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import { CasqError } from "../errors.ts";
import { startStreamRequest } from "../telemetry/rpc-metrics.ts";
import { traceStreamRequest } from "../telemetry/tracing.ts";
import { TIMER_STOPPED } from "../util/clock.ts";
import { handleEnqueue } from "./enqueue-request.ts";
import type { EnqueueStreamHandle } from "./enqueue-stream-registry.ts";
import { reportedConnectError, toConnectError, toRpcStatus } from "./grpc-errors.ts";
import { RESET_CALL } from "./listener.ts";
import type { ServiceContext } from "./service-context.ts";
import { checkRequestTimeout } from "./validation.ts";

/** Most requests of one stream held at once (see the module header). */
export const MAX_REQUESTS_IN_FLIGHT = 1000;

/** The RPC, as spans and logs name it. */
const RPC = "casq.v1.QueueService/EnqueueStream";

/** Why a request on a draining stream is refused: nothing of it was applied. */
const SHUTTING_DOWN = "broker shutting down: send the request to another broker (it was not applied)";

/** The reason a request's signal is aborted with once its `timeout` passed (read by grpc-errors.ts as a deadline). */
const REQUEST_DEADLINE = new ConnectError(
  "the request's timeout passed before it finished; it may or may not have been applied",
  Code.DeadlineExceeded,
);

type EnqueueStreamResponseInit = MessageInitShape<typeof EnqueueStreamResponseSchema>;

/** The EnqueueStream handler. */
export function createEnqueueStreamHandler(
  ctx: ServiceContext,
): ServiceImpl<typeof QueueService>["enqueueStream"] {
  return (requests, call) => enqueueStream(ctx, requests, call);
}

async function* enqueueStream(
  ctx: ServiceContext,
  requests: AsyncIterable<EnqueueStreamRequest>,
  call: HandlerContext,
): AsyncIterable<EnqueueStreamResponseInit> {
  if (ctx.enqueueStreams.draining) throw shuttingDown("open the stream at another broker");
  const session = new EnqueueStreamSession(ctx, call);
  const unregister = ctx.enqueueStreams.add(session);
  try {
    yield* session.run(requests);
  } finally {
    unregister();
  }
}

/** One open EnqueueStream (see the module header). */
class EnqueueStreamSession implements EnqueueStreamHandle {
  private readonly answers = new AsyncQueue<EnqueueStreamResponseInit>();
  private readonly inFlight = new Set<bigint>();
  /**
   * Requests read whose answer is not yet written out (in flight, or
   * answered and queued): the reader waits while there are
   * {@link MAX_REQUESTS_IN_FLIGHT}, so a client that does not read its
   * answers cannot make the broker hold more.
   */
  private held = 0;
  private readEnded = false;
  private draining = false;
  /** Wakes the reader waiting for a free place among the requests held. */
  private placeFreed: (() => void) | undefined;
  private readonly ended: Promise<void>;
  private markEnded: () => void = () => {};

  constructor(
    private readonly ctx: ServiceContext,
    private readonly call: HandlerContext,
  ) {
    this.ended = new Promise((resolve) => {
      this.markEnded = resolve;
    });
    // Each request in flight listens on the call's signal (its deadline's abort): many at once is normal.
    setMaxListeners(0, call.signal);
  }

  /** The answers, while the requests are read and handled. */
  async *run(requests: AsyncIterable<EnqueueStreamRequest>): AsyncIterable<EnqueueStreamResponseInit> {
    void this.read(requests);
    try {
      for await (const answer of this.answers) {
        yield answer;
        // The answer is written out (the adapter pulls the next one only then).
        this.held -= 1;
        const wake = this.placeFreed;
        this.placeFreed = undefined;
        wake?.();
      }
    } finally {
      this.markEnded();
    }
  }

  /**
   * Answers the requests in flight, refuses new ones, then ends the stream
   * with UNAVAILABLE; after `graceMs` (a client that does not read its
   * answers, a write that hangs) the stream is reset instead.
   */
  async drain(graceMs: number): Promise<void> {
    this.draining = true;
    this.endIfDone();
    const stop = new AbortController();
    const graceOver = await Promise.race([
      this.ended.then(() => false),
      this.ctx.clock.sleep(graceMs, stop.signal).then(
        () => true,
        () => false,
      ),
    ]);
    stop.abort(TIMER_STOPPED);
    if (graceOver) this.abort("broker shutting down: reconnect to another broker");
    return this.ended;
  }

  /** Ends the stream at once with UNAVAILABLE, or resets it when it cannot end (answers not sent yet are lost). */
  abort(reason: string): void {
    this.draining = true;
    if (this.answers.closed) this.call.values.get(RESET_CALL)?.();
    else this.answers.fail(new CasqError("unavailable", reason));
  }

  private async read(requests: AsyncIterable<EnqueueStreamRequest>): Promise<void> {
    try {
      for await (const request of requests) {
        if (this.answers.closed) return; // ended (aborted): nothing read now could be answered
        const id = request.requestId;
        if (id === 0n) throw new CasqError("invalid_argument", "request_id must not be 0");
        if (this.inFlight.has(id))
          throw new CasqError("invalid_argument", `request_id ${id} is already in flight on this stream`);
        this.held += 1;
        if (this.draining) this.answers.push(failed(id, { code: Code.Unavailable, message: SHUTTING_DOWN }));
        else {
          this.inFlight.add(id);
          void this.handle(request);
        }
        if (this.held >= MAX_REQUESTS_IN_FLIGHT)
          await new Promise<void>((resolve) => {
            this.placeFreed = resolve;
          });
      }
      this.readEnded = true;
      this.endIfDone();
    } catch (error) {
      // A malformed request, a bad request_id, the client's cancel: the stream ends with it.
      this.answers.fail(toConnectError(error, this.call.signal));
    }
  }

  /** Handles one request and queues its answer; never rejects. */
  private async handle(request: EnqueueStreamRequest): Promise<void> {
    const id = request.requestId;
    const finish = startStreamRequest(this.call.values, "EnqueueStream"); // Telemetry: metrics
    let deadline: RequestDeadline | undefined;
    let answer: EnqueueStreamResponseInit;
    try {
      const { enqueue } = request;
      if (enqueue === undefined)
        throw new CasqError("invalid_argument", "the request has no enqueue: set it to the Enqueue request");
      const until = requestDeadline(this.ctx, this.call.signal, checkRequestTimeout(request.timeout));
      deadline = until;
      const enqueued = await traceStreamRequest(
        this.call.values,
        RPC,
        carrierOf(request.traceContext),
        async (traceContext) => {
          try {
            // Answered at the deadline (or the stream's end) even while the write is still out, as a unary call is.
            return await Promise.race([
              handleEnqueue(this.ctx, enqueue, until.signal, traceContext),
              until.passed,
            ]);
          } catch (error) {
            throw reportedConnectError(this.ctx.logger, error, RPC, until.signal);
          }
        },
      );
      answer = { requestId: id, result: { case: "enqueued", value: enqueued } };
      finish(undefined);
    } catch (error) {
      const status = toRpcStatus(error);
      answer = failed(id, status);
      finish(status.code);
    } finally {
      deadline?.done();
    }
    this.inFlight.delete(id);
    this.answers.push(answer);
    this.endIfDone();
  }

  /** Ends the answers once nothing is in flight and the requests ended, or the server drains. */
  private endIfDone(): void {
    if (this.inFlight.size > 0) return;
    if (this.readEnded) this.answers.end();
    // Every request read was answered: those the client still waits for never reached the broker.
    else if (this.draining) this.answers.fail(shuttingDown("reconnect to another broker"));
  }
}

/** The status a stream ends with while the server shuts down: nothing unanswered was applied. */
function shuttingDown(what: string): ConnectError {
  return new ConnectError(`broker shutting down: ${what}`, Code.Unavailable, {
    [NOT_APPLIED_TRAILER]: "true",
  });
}

/** An answer with a failed status. */
function failed(
  requestId: bigint,
  status: MessageInitShape<typeof RpcStatusSchema>,
): EnqueueStreamResponseInit {
  return { requestId, result: { case: "error", value: status } };
}

/** A request's trace context as a W3C carrier (undefined when it brings none). */
function carrierOf(traceContext: TraceContext | undefined): Record<string, string> | undefined {
  if (!traceContext?.traceparent) return undefined;
  return traceContext.tracestate
    ? { traceparent: traceContext.traceparent, tracestate: traceContext.tracestate }
    : { traceparent: traceContext.traceparent };
}

/** What {@link requestDeadline} gives one request. */
interface RequestDeadline {
  /** Aborted when the stream ends or the request's timeout passed (as a deadline). */
  readonly signal: AbortSignal;
  /** Rejects with the signal's reason when it aborts; never resolves. */
  readonly passed: Promise<never>;
  /** Stops the timer and the listeners. */
  readonly done: () => void;
}

/**
 * The signal of one request: the stream's, and aborted as a deadline once
 * `timeoutMs` passed (when set).
 */
function requestDeadline(
  ctx: ServiceContext,
  stream: AbortSignal,
  timeoutMs: number | undefined,
): RequestDeadline {
  if (timeoutMs === undefined) return withPassed(stream, () => {});
  const request = new AbortController();
  const stop = new AbortController();
  const onStream = () => request.abort(stream.reason);
  if (stream.aborted) onStream();
  else stream.addEventListener("abort", onStream, { once: true });
  ctx.clock.sleep(timeoutMs, stop.signal).then(
    () => request.abort(REQUEST_DEADLINE),
    () => {},
  );
  return withPassed(request.signal, () => {
    stop.abort(TIMER_STOPPED);
    stream.removeEventListener("abort", onStream);
  });
}

function withPassed(signal: AbortSignal, stop: () => void): RequestDeadline {
  let onAbort = () => {};
  const passed = new Promise<never>((_, reject) => {
    onAbort = () => reject(signal.reason);
    if (signal.aborted) onAbort();
    else signal.addEventListener("abort", onAbort, { once: true });
  });
  passed.catch(() => {}); // read by Promise.race only while the request runs
  return {
    signal,
    passed,
    done: () => {
      signal.removeEventListener("abort", onAbort);
      stop();
    },
  };
}
