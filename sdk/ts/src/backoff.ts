/**
 * Capped exponential backoff with jitter: the one retry-delay computation of
 * casq's TypeScript code. The SDK's failover and worker reconnects use it, and
 * so does the server (`@casq/sdk/backoff.ts`): its store retries, the broker's
 * CAS-conflict retries and timers, and the Work stream's claim loop.
 *
 * Retry `attempt` (1-based: the delay after the attempt-th failure) has a cap
 * of 0 for the first `immediateRetries` attempts, then `baseDelayMs * 2^k` for
 * k = 0, 1, 2, ..., never above `maxDelayMs`; the delay is that cap randomised
 * by the jitter mode. Randomness is passed in, so seeded callers (tests, the
 * simulation) replay exactly.
 */

/**
 * How a delay is randomised below its cap `c`:
 * - `full`: uniform in [0, c) — spreads retries the most (AWS's recommendation for contention).
 * - `equal`: uniform in [c/2, c) — guarantees at least half the cap.
 * - `none`: exactly `c` — for timers that only need to slow down, and for tests.
 */
export type JitterMode = "full" | "equal" | "none";

/** The shape of a backoff (see the module header). */
export interface Backoff {
  /** How many of the first retries go out at once, without any delay. */
  readonly immediateRetries: number;
  /** Cap of the first delayed retry, in ms; doubles for each further retry. */
  readonly baseDelayMs: number;
  /** No delay ever exceeds this, in ms. */
  readonly maxDelayMs: number;
  /** How delays are randomised below their cap. */
  readonly jitter: JitterMode;
}

/** A source of uniformly distributed numbers in [0, 1) (the server's `Random` has this shape). */
export interface RandomSource {
  next(): number;
}

/** `Math.random()` as a {@link RandomSource}. */
export const mathRandom: RandomSource = { next: () => Math.random() };

/**
 * The upper bound of the delay after the `attempt`-th failed attempt
 * (1-based), before jitter: 0 for the first `immediateRetries` attempts (and
 * for `baseDelayMs <= 0`), then `baseDelayMs * 2^k` for k = 0, 1, 2, ...,
 * capped at `maxDelayMs`. Pure and non-decreasing in `attempt`.
 */
export function backoffCap(attempt: number, backoff: Omit<Backoff, "jitter">): number {
  if (!(attempt > backoff.immediateRetries) || backoff.baseDelayMs <= 0) return 0;
  const exponent = Math.floor(attempt) - backoff.immediateRetries - 1;
  // 2 ** exponent overflows to Infinity for huge attempts; Math.min handles it.
  return Math.min(backoff.maxDelayMs, backoff.baseDelayMs * 2 ** exponent);
}

/**
 * The delay in ms to wait after the `attempt`-th failed attempt (1-based)
 * before the next one: {@link backoffCap} randomised by `backoff.jitter`.
 * Always within [0, maxDelayMs]. Draws exactly one value from `random` when
 * the cap is positive and jitter is not `none`, and none otherwise, so a
 * seeded caller stays reproducible.
 */
export function backoffDelay(attempt: number, backoff: Backoff, random: RandomSource = mathRandom): number {
  const cap = backoffCap(attempt, backoff);
  if (cap <= 0) return 0;
  switch (backoff.jitter) {
    case "none":
      return cap;
    case "equal":
      return cap / 2 + random.next() * (cap / 2);
    case "full":
      return random.next() * cap;
  }
}
