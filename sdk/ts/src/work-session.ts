/**
 * One `QueueService.Work` stream to one broker, as the worker sees it: the
 * requests it sends (an async iterable fed as the worker goes), replies
 * matched to requests by request id, the stream's routing and its state.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { fromRpcStatus } from "./errors.ts";
import type { WorkRequestSchema, WorkResponse, WorkRouting } from "./gen/casq/v1/work_pb.ts";

/** A request on the stream, as built by the SDK. */
export type WorkRequestInit = MessageInitShape<typeof WorkRequestSchema>;
/** The command of a {@link WorkRequestInit}. */
export type Command = WorkRequestInit["command"];

/** An async iterable fed by push(); end() finishes it. */
class Pushable<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private wake: (() => void) | undefined;
  private done = false;

  push(item: T): void {
    if (this.done) return;
    this.items.push(item);
    this.wake?.();
  }

  end(): void {
    this.done = true;
    this.wake?.();
  }

  get ended(): boolean {
    return this.done;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      const item = this.items.shift();
      if (item !== undefined) {
        yield item;
        continue;
      }
      if (this.done) return;
      await new Promise<void>((resolve) => {
        this.wake = resolve;
      });
      this.wake = undefined;
    }
  }
}

/** One Work stream, to one broker. */
export class Session {
  readonly requests = new Pushable<WorkRequestInit>();
  readonly abort = new AbortController();
  private readonly pending = new Map<
    bigint,
    { resolve: (r: WorkResponse) => void; reject: (e: unknown) => void }
  >();
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

  constructor(readonly address: string) {}

  get usable(): boolean {
    return !this.closed && !this.requests.ended && !this.draining;
  }

  send(command: Command): void {
    this.requests.push({ command });
  }

  request(command: Command): Promise<WorkResponse> {
    const requestId = ++this.nextId;
    return new Promise((resolve, reject) => {
      this.pending.set(requestId, { resolve, reject });
      this.requests.push({ requestId, command });
    });
  }

  reply(response: WorkResponse): void {
    const waiter = this.pending.get(response.requestId);
    if (!waiter) return;
    this.pending.delete(response.requestId);
    if (response.event.case === "requestFailed") waiter.reject(fromRpcStatus(response.event.value.status));
    else waiter.resolve(response);
  }

  close(error: unknown): void {
    this.closed = true;
    this.requests.end();
    for (const waiter of this.pending.values()) waiter.reject(error);
    this.pending.clear();
  }
}
