/**
 * The SDK's source of time and timers. The producer, the admin client and
 * the worker read the time and wait only through a {@link SdkClock}, so that
 * a test or casq's seeded simulation can hand them a fake clock (the server's
 * `ManualClock` fits this shape) and replay a run exactly. Production code
 * uses {@link systemClock}: `Date.now()` and `setTimeout`.
 */

/** Time and waiting, as the SDK uses them (the server's `Clock` has this shape). */
export interface SdkClock {
  /** Milliseconds since the Unix epoch. */
  now(): number;
  /** Resolves after `ms` milliseconds, or rejects with the signal's reason when it aborts first. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

/** The real clock: `Date.now()` and `setTimeout`. */
export const systemClock: SdkClock = {
  now: () => Date.now(),
  sleep: (ms, signal) =>
    new Promise<void>((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      const onAbort = () => {
        clearTimeout(timer);
        reject(signal?.reason);
      };
      const timer = setTimeout(() => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      }, ms);
      signal?.addEventListener("abort", onAbort, { once: true });
    }),
};

/** Options of {@link startTimer}. */
export interface TimerOptions {
  /**
   * With the {@link systemClock}: the timer does not keep the process alive
   * (Node's `unref`). Other clocks have no process to keep alive.
   */
  readonly unref?: boolean;
}

/**
 * Calls `fire` once, `ms` from now on `clock`; returns the function that
 * cancels it (a no-op once it fired). With the system clock this is a plain
 * `setTimeout`, so production timers behave as before.
 */
export function startTimer(
  clock: SdkClock,
  ms: number,
  fire: () => void,
  options: TimerOptions = {},
): () => void {
  if (clock === systemClock) {
    const timer = setTimeout(fire, ms);
    if (options.unref) timer.unref();
    return () => clearTimeout(timer);
  }
  const cancel = new AbortController();
  clock.sleep(Math.max(0, ms), cancel.signal).then(
    () => {
      if (!cancel.signal.aborted) fire();
    },
    () => {},
  );
  return () => cancel.abort();
}

/**
 * Calls `fire` every `ms` on `clock` until the returned function is called
 * (like `setInterval`: the next call is scheduled when one fires, whether or
 * not the work `fire` started has finished).
 */
export function startInterval(
  clock: SdkClock,
  ms: number,
  fire: () => void,
  options: TimerOptions = {},
): () => void {
  if (clock === systemClock) {
    const timer = setInterval(fire, ms);
    if (options.unref) timer.unref();
    return () => clearInterval(timer);
  }
  let stopped = false;
  let cancel = () => {};
  const arm = () => {
    cancel = startTimer(clock, ms, () => {
      if (stopped) return;
      arm();
      fire();
    });
  };
  arm();
  return () => {
    stopped = true;
    cancel();
  };
}
