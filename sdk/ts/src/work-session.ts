/**
 * One `QueueService.Work` stream to one broker, as the worker sees it: the
 * requests it sends (an async iterable fed as the worker goes), replies
 * matched to requests by request id, the stream's routing and its state.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { WorkRequestSchema, WorkResponse, WorkRouting } from "@casq/api/casq/v1/work_pb.ts";
import { AsyncQueue } from "./async-queue.ts";
import { type SdkClock, startTimer, systemClock } from "./clock.ts";
import { fromRpcStatus, UnavailableError } from "./errors.ts";
import { CreditWindow } from "./worker/credit-window.ts";

/** A request on the stream, as built by the SDK. */
export type WorkRequestInit = MessageInitShape<typeof WorkRequestSchema>;
/** The command of a {@link WorkRequestInit}. */
export type Command = WorkRequestInit["command"];

/**
 * The stream ended or broke before a request on it was answered: the request
 * may go again by unary call (see the worker's settle and heartbeat).
 */
export class StreamClosedError extends UnavailableError {}

/**
 * One Work stream, to one broker. A request unanswered after
 * `requestTimeoutMs` breaks the stream: the broker is hung or cut off, and
 * holding the request until TCP notices could take forever (a frozen process
 * keeps its connections open).
 */
export class Session {
  readonly requests = new AsyncQueue<WorkRequestInit>();
  readonly abort = new AbortController();
  private readonly pending = new Map<
    bigint,
    { resolve: (r: WorkResponse) => void; reject: (e: unknown) => void; cancelTimer: () => void }
  >();
  /** Why the SDK broke the stream (an unanswered request), if it did. */
  brokenBy: StreamClosedError | undefined;
  private nextId = 0n;
  closed = false;
  draining = false;
  opened = false;
  /**
   * Owned by the run's reconnect loop. Any other session is a secondary: it
   * is dropped when it ends, and opened again only when routing still needs it.
   */
  primary = false;
  /** The latest routing of this stream (from `opened` or `routing`). */
  routing: WorkRouting | undefined;
  /** Settles when the stream has ended: resolves on a clean end, rejects with what broke it. */
  ended: Promise<void> = Promise.resolve();

  /**
   * A stream to `address`; a request unanswered after `requestTimeoutMs` on
   * `clock` breaks it. `credit`: its credit window (default: fixed at 1).
   */
  constructor(
    readonly address: string,
    private readonly requestTimeoutMs: number,
    private readonly clock: SdkClock = systemClock,
    readonly credit: CreditWindow = new CreditWindow({ initial: 1, min: 1, max: 1, maxOutstanding: 1000 }),
  ) {}

  get usable(): boolean {
    return !this.closed && !this.requests.closed && !this.draining;
  }

  send(command: Command): void {
    this.requests.push({ command });
  }

  request(command: Command): Promise<WorkResponse> {
    const requestId = ++this.nextId;
    return new Promise((resolve, reject) => {
      const cancelTimer = startTimer(this.clock, this.requestTimeoutMs, () => this.timedOut(), {
        unref: true,
      });
      this.pending.set(requestId, { resolve, reject, cancelTimer });
      this.requests.push({ requestId, command });
    });
  }

  /** A request went unanswered: fail every open request and end the stream. */
  private timedOut(): void {
    if (this.closed) return;
    this.brokenBy = new StreamClosedError(
      `casq: no answer on the work stream to ${this.address} within ${this.requestTimeoutMs} ms; ` +
        "the broker seems hung, leaving it",
    );
    this.close(this.brokenBy);
    this.abort.abort(this.brokenBy);
  }

  reply(response: WorkResponse): void {
    const waiter = this.pending.get(response.requestId);
    if (!waiter) return;
    waiter.cancelTimer();
    this.pending.delete(response.requestId);
    if (response.event.case === "requestFailed") waiter.reject(fromRpcStatus(response.event.value.status));
    else waiter.resolve(response);
  }

  close(error: unknown): void {
    this.closed = true;
    this.requests.end();
    for (const waiter of this.pending.values()) {
      waiter.cancelTimer();
      waiter.reject(error);
    }
    this.pending.clear();
  }
}
