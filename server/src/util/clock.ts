/**
 * Time and randomness are injected into the engine so that a seeded
 * simulation can replay a run exactly. Engine code never calls `Date.now()`,
 * `setTimeout` or `Math.random()` directly; it asks a {@link Clock} and a
 * {@link Random} (a lint rule in biome.json enforces it, see
 * docs/architecture.md "What holds the layers").
 */

/** A source of wall-clock time and timers. */
export interface Clock {
  /** Milliseconds since the Unix epoch. */
  now(): number;
  /** Resolves after `ms` milliseconds, or rejects with the signal's reason when aborted. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

/**
 * The reason to abort a sleep's signal with when the sleep is only being
 * stopped and nobody reads why: `AbortController.abort()` without a reason
 * builds a DOMException, stack trace and all, tens of microseconds on a
 * path taken once per request.
 */
export const TIMER_STOPPED: Error = new Error("timer stopped");

/** The real clock, backed by `Date.now()` and `setTimeout`. */
export const systemClock: Clock = {
  now: () => Date.now(),
  sleep: (ms, signal) =>
    new Promise<void>((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      const timer = setTimeout(() => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      }, ms);
      const onAbort = () => {
        clearTimeout(timer);
        reject(signal?.reason);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
    }),
};
