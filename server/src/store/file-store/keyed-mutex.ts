/**
 * The file store's in-process mutex per key: calls of one process on the same
 * key queue here, in order, before they contend for the key's cross-process
 * lock, so concurrent callers do not spin on the file system.
 */
import { UnavailableError } from "../store-errors.ts";
import { throwIfAborted } from "./fs-errors.ts";

/** FIFO mutex per key; a waiter that gives up passes its turn on without blocking the queue. */
export class KeyedMutex {
  private readonly tails = new Map<string, Promise<void>>();

  /** Waits for the key's turn; resolves to the release function. Rejects `unavailable` on abort or deadline. */
  async acquire(key: string, signal: AbortSignal | undefined, deadline: number): Promise<() => void> {
    const previous = this.tails.get(key) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((resolve) => {
      release = resolve;
    });
    const tail = previous.then(() => mine);
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    let turn = false;
    void previous.then(() => {
      turn = true;
    });
    await new Promise<void>((resolve) => {
      const finish = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", finish);
        resolve();
      };
      const timer = setTimeout(finish, Math.max(0, deadline - Date.now()));
      if (signal?.aborted) return finish();
      signal?.addEventListener("abort", finish, { once: true });
      void previous.then(finish);
    });
    if (!turn) {
      release();
      throwIfAborted(signal, key, "while waiting for the key's lock (nothing was written)");
      throw new UnavailableError(key, "timed out waiting for another call on the same key in this process");
    }
    return release;
  }
}
