/**
 * The request side of a client-streaming or bidirectional gRPC call as an
 * async iterable that code pushes into: connect-node pulls items from it and
 * sends them; {@link RequestQueue.end} half-closes the call once everything
 * queued has been sent.
 */

/** An unbounded async queue: the request side of a client stream. */
export class RequestQueue<T> implements AsyncIterable<T> {
  readonly #items: T[] = [];
  #ended = false;
  #waiter: ((result: IteratorResult<T>) => void) | undefined;

  /** Adds an item (ignored after {@link end}). */
  push(item: T): void {
    if (this.#ended) return;
    const waiter = this.#waiter;
    if (waiter !== undefined) {
      this.#waiter = undefined;
      waiter({ value: item, done: false });
    } else {
      this.#items.push(item);
    }
  }

  /** Ends the queue: the consumer sees the end after the items already queued (half-close). */
  end(): void {
    if (this.#ended) return;
    this.#ended = true;
    const waiter = this.#waiter;
    if (waiter !== undefined && this.#items.length === 0) {
      this.#waiter = undefined;
      waiter({ value: undefined, done: true });
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    return {
      next: () => {
        const item = this.#items.shift();
        if (item !== undefined) return Promise.resolve({ value: item, done: false });
        if (this.#ended) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve) => {
          this.#waiter = resolve;
        });
      },
      return: () => {
        this.end();
        this.#items.length = 0;
        return Promise.resolve({ value: undefined, done: true });
      },
      // connect calls throw() on the request iterator when the call fails: stop producing.
      throw: () => {
        this.end();
        this.#items.length = 0;
        return Promise.resolve({ value: undefined, done: true });
      },
    };
  }
}
