/**
 * A small unbounded async queue: producers push, one consumer iterates, in
 * push order. The one such queue of the TypeScript code: the SDK's worker
 * feeds a Work stream's requests through it, the server's Work stream
 * merges events from several tasks (replies, jobs, routing changes) into
 * its one response stream with it (`@casq/sdk/async-queue.ts`), and tests
 * write request streams with it.
 */

/** An async-iterable queue that ends normally ({@link end}) or with an error ({@link fail}). */
export class AsyncQueue<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private waiter: (() => void) | undefined;
  private ended = false;
  private failure: { error: unknown } | undefined;

  /** Adds an item; ignored once the queue has ended. */
  push(item: T): void {
    if (this.ended) return;
    this.items.push(item);
    this.wake();
  }

  /** Ends the queue after the items already pushed. */
  end(): void {
    if (this.ended) return;
    this.ended = true;
    this.wake();
  }

  /** Ends the queue with an error, raised after the items already pushed. */
  fail(error: unknown): void {
    if (this.ended) return;
    this.ended = true;
    this.failure = { error };
    this.wake();
  }

  /** True once {@link end} or {@link fail} was called. */
  get closed(): boolean {
    return this.ended;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      if (this.items.length > 0) {
        yield this.items.shift() as T;
        continue;
      }
      if (this.ended) {
        if (this.failure) throw this.failure.error;
        return;
      }
      await new Promise<void>((resolve) => {
        this.waiter = resolve;
      });
    }
  }

  private wake(): void {
    const waiter = this.waiter;
    this.waiter = undefined;
    waiter?.();
  }
}
