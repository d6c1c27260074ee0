/**
 * A fake {@link Clock} for tests and the seeded simulation.
 *
 * Why it exists: casq's timing behaviour (retry backoff, lease expiry,
 * heartbeats, group-commit flush timers, store latency) must be testable
 * without waiting for real time and must replay exactly for a given seed.
 * Engine code only ever asks a `Clock`, so handing it a `ManualClock` turns
 * every timer into simulated time that the test moves forward explicitly.
 *
 * How time moves:
 * - `now()` returns the current simulated time; it changes only when the test
 *   advances the clock.
 * - `sleep(ms)` registers a timer with deadline `now() + ms`. A timer fires
 *   (its promise resolves) when the clock is advanced to or past its
 *   deadline. Timers fire in deadline order; equal deadlines fire in the order
 *   `sleep` was called. An aborted sleep is removed and rejects with the
 *   signal's reason, exactly like `systemClock.sleep`.
 * - `sleep(ms)` with `ms <= 0` (or NaN) resolves at once without a timer, so
 *   a zero delay never needs a tick to make progress.
 *
 * Two ways to advance:
 * - {@link ManualClock.advanceBy}, {@link ManualClock.runUntil} and
 *   {@link ManualClock.runUntilIdle} are asynchronous and are what tests and the
 *   simulation should normally use. They fire ONE timer at a time: set
 *   `now()` to that timer's deadline, resolve it, then let the event loop run
 *   (`settleTurns` rounds of `setImmediate`, which drains every pending
 *   microtask) before looking for the next timer. Code woken by a timer
 *   therefore observes `now()` equal to its own deadline and may schedule new
 *   timers that fire in the same advance if they fall inside the window.
 * - {@link ManualClock.advance} and {@link ManualClock.advanceTo} are
 *   synchronous: they move time and resolve every due timer in order, but no
 *   awaiting code runs until the caller yields, and by then `now()` is already
 *   the final time. Use them only when nothing is awaiting or when that is
 *   exactly the behaviour wanted.
 *
 * Determinism: given the same sequence of calls (and the same seeded
 * randomness in the code under test), the order in which timers fire and the
 * times code observes are identical from run to run, because time never moves
 * on its own and ties are broken by registration order.
 */
import type { Clock } from "../src/util/clock.ts";

/** Default start time of a {@link ManualClock}: 2024-01-01T00:00:00Z, a realistic epoch-milliseconds value. */
export const MANUAL_CLOCK_DEFAULT_START_MS = Date.UTC(2024, 0, 1);

/** Options of a {@link ManualClock}. */
export interface ManualClockOptions {
  /** The initial value of `now()`, in epoch milliseconds. Default {@link MANUAL_CLOCK_DEFAULT_START_MS}. */
  readonly startMs?: number;
  /**
   * How many `setImmediate` turns {@link ManualClock.settle} waits. One turn
   * drains every microtask chain (promises, `queueMicrotask`, `process.nextTick`);
   * raise it only if the code under test itself hops through macrotasks
   * (e.g. `setImmediate`). Default 1.
   */
  readonly settleTurns?: number;
  /**
   * Upper bound on timers fired by one {@link ManualClock.runUntilIdle} or
   * {@link ManualClock.runUntil} call, to turn a runaway periodic loop into an
   * error instead of a hang. Default 100 000.
   */
  readonly maxTimersPerRun?: number;
}

interface Timer {
  readonly deadline: number;
  readonly seq: number;
  readonly resolve: () => void;
  readonly cleanup: () => void;
}

/** A settable clock whose timers fire only when the test advances it. See the module header. */
export class ManualClock implements Clock {
  private current: number;
  private readonly settleTurns: number;
  private readonly maxTimersPerRun: number;
  /** Pending timers, kept sorted by (deadline, seq). */
  private timers: Timer[] = [];
  private seq = 0;

  constructor(options: ManualClockOptions = {}) {
    this.current = options.startMs ?? MANUAL_CLOCK_DEFAULT_START_MS;
    this.settleTurns = Math.max(1, Math.floor(options.settleTurns ?? 1));
    this.maxTimersPerRun = options.maxTimersPerRun ?? 100_000;
    if (!Number.isFinite(this.current)) throw new RangeError(`startMs must be finite, got ${this.current}`);
  }

  /** The current simulated time in epoch milliseconds. */
  now(): number {
    return this.current;
  }

  /**
   * Resolves once the clock has been advanced `ms` past the current time, or
   * rejects with `signal.reason` when the signal aborts first (a signal that
   * is already aborted rejects at once). `ms <= 0` resolves without a timer.
   */
  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (!(ms > 0)) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const onAbort = () => {
        this.remove(timer);
        reject(signal?.reason);
      };
      const timer: Timer = {
        deadline: this.current + ms,
        seq: this.seq++,
        resolve,
        cleanup: () => signal?.removeEventListener("abort", onAbort),
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.insert(timer);
    });
  }

  /** Number of timers waiting to fire. */
  pendingTimers(): number {
    return this.timers.length;
  }

  /** Deadline of the earliest pending timer, or `undefined` when none is pending. */
  nextDeadline(): number | undefined {
    return this.timers[0]?.deadline;
  }

  /**
   * Synchronously moves time forward by `ms` and resolves every timer whose
   * deadline is reached, in order. Awaiting code runs only after the caller
   * yields (and then sees the final time). Returns the number of timers fired.
   */
  advance(ms: number): number {
    if (!(ms >= 0)) throw new RangeError(`cannot advance a clock by ${ms} ms`);
    return this.advanceTo(this.current + ms);
  }

  /**
   * Synchronously sets the time to `timeMs` (which must not be in the past)
   * and resolves every timer due by then, in order. Returns the number fired.
   */
  advanceTo(timeMs: number): number {
    this.checkForward(timeMs);
    let fired = 0;
    for (let timer = this.timers[0]; timer && timer.deadline <= timeMs; timer = this.timers[0]) {
      this.timers.shift();
      this.current = timer.deadline;
      this.fire(timer);
      fired++;
    }
    this.current = timeMs;
    return fired;
  }

  /**
   * Lets the event loop run until every pending microtask has settled
   * (`settleTurns` rounds of `setImmediate`). Time does not move.
   */
  async settle(): Promise<void> {
    for (let i = 0; i < this.settleTurns; i++) await new Promise<void>((resolve) => setImmediate(resolve));
  }

  /**
   * Advances time by `ms`, firing due timers one at a time in deadline order
   * and settling after each, so woken code runs (and may schedule more timers)
   * before the next one fires. Ends with `now()` exactly `ms` later. Returns
   * the number of timers fired.
   */
  async advanceBy(ms: number): Promise<number> {
    if (!(ms >= 0)) throw new RangeError(`cannot advance a clock by ${ms} ms`);
    return this.runUntil(this.current + ms);
  }

  /**
   * Like {@link advanceBy} with an absolute target: settles, then fires every
   * timer due by `timeMs` one at a time (settling after each), then sets
   * `now()` to `timeMs` and settles once more. Returns the number fired.
   */
  async runUntil(timeMs: number): Promise<number> {
    this.checkForward(timeMs);
    let fired = 0;
    await this.settle();
    for (let timer = this.timers[0]; timer && timer.deadline <= timeMs; timer = this.timers[0]) {
      this.guard(fired);
      this.timers.shift();
      this.current = timer.deadline;
      this.fire(timer);
      fired++;
      await this.settle();
    }
    this.current = timeMs;
    await this.settle();
    return fired;
  }

  /**
   * Settles, then keeps firing the earliest timer (settling after each) until
   * no timer is pending. Time ends at the last deadline fired. Throws when
   * more than `maxTimersPerRun` timers fire, which means something keeps
   * re-arming a timer (a periodic loop): use {@link runUntil} for those.
   * Returns the number of timers fired.
   */
  async runUntilIdle(): Promise<number> {
    let fired = 0;
    await this.settle();
    for (let timer = this.timers[0]; timer; timer = this.timers[0]) {
      this.guard(fired);
      this.timers.shift();
      this.current = timer.deadline;
      this.fire(timer);
      fired++;
      await this.settle();
    }
    return fired;
  }

  private fire(timer: Timer): void {
    timer.cleanup();
    timer.resolve();
  }

  private guard(fired: number): void {
    if (fired >= this.maxTimersPerRun)
      throw new Error(
        `ManualClock fired ${fired} timers in one run without going idle; a periodic timer is probably re-arming itself (use runUntil with a time bound)`,
      );
  }

  private checkForward(timeMs: number): void {
    if (!Number.isFinite(timeMs)) throw new RangeError(`cannot move a clock to ${timeMs}`);
    if (timeMs < this.current)
      throw new RangeError(`a ManualClock never goes backwards (now ${this.current}, asked for ${timeMs})`);
  }

  private insert(timer: Timer): void {
    // Binary search for the first timer that sorts after this one; deadlines
    // are compared first, then registration order, so ties keep insertion order.
    let lo = 0;
    let hi = this.timers.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      const other = this.timers[mid] as Timer;
      if (other.deadline < timer.deadline || (other.deadline === timer.deadline && other.seq < timer.seq))
        lo = mid + 1;
      else hi = mid;
    }
    this.timers.splice(lo, 0, timer);
  }

  private remove(timer: Timer): void {
    const index = this.timers.indexOf(timer);
    if (index >= 0) this.timers.splice(index, 1);
  }
}
