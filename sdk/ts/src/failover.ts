/**
 * The call wrapper behind every unary call of the SDK: follows redirects to
 * the leading broker at once, moves on to the next broker with exponential
 * backoff and equal jitter ({@link retryDelayMs}) on outages, connection errors and attempts that
 * timed out (a hung broker), and gives up when the retry budget
 * (`retryTimeoutMs`, optionally `maxAttempts`) is spent, on an abort, or at
 * the caller's deadline.
 *
 * Two deadlines, two meanings: `timeoutMs` bounds one attempt at one broker
 * (its DEADLINE_EXCEEDED means "this broker did not answer in time, try
 * another"), the caller's `deadline` bounds the whole call (its
 * DEADLINE_EXCEEDED ends the call, never retried).
 *
 * Resending after an attempt that may have been applied: an attempt that ran
 * into its own timeout, or whose connection broke after the request was
 * sent, may have landed at the broker. Only an idempotent call (the default)
 * is resent then; such a resend is marked `uncertain` in its
 * {@link AttemptContext}, so that a caller which made its request safe to
 * repeat (e.g. CreateQueue with `if_not_exists`) can read an ALREADY_EXISTS
 * or LEASE_LOST answer for what it is. A call with `idempotent: false` fails
 * with that attempt's error instead.
 */
import { Code } from "@connectrpc/connect";
import { backoffDelay, type RandomSource } from "./backoff.ts";
import type { ResolvedClientOptions } from "./client-options.ts";
import { type SdkClock, systemClock } from "./clock.ts";
import { CasqError, isRetryable, OutcomeUnknownError, RedirectError, toCasqError } from "./errors.ts";
import type { BrokerPool } from "./transport.ts";

/** Options of one call through {@link callWithFailover}. */
export interface FailoverCallOptions {
  /** Aborts the call and any wait between attempts. */
  readonly signal?: AbortSignal;
  /** Absolute deadline (epoch ms) for the whole call, retries included. */
  readonly deadline?: number;
  /** Start at this broker instead of the pool's preferred one (e.g. a known leader). */
  readonly address?: string;
  /** Override of the pool's attempt limit. */
  readonly maxAttempts?: number;
  /**
   * `false`: an outage (or hung attempt) at a broker the call was not
   * redirected to ends the call at once, with that error. For a client that
   * knows a single broker and should say so quickly (the `casq` CLI). An
   * outage at a redirect's leader still sends the call back to wait at the
   * redirecting broker. Default `true`: the next broker, after a backoff.
   */
  readonly retryOutages?: boolean;
  /**
   * Called before each wait at a broker that redirects to a leader which
   * already failed in this call: the leader is probably dead, and the call
   * waits for its leader lease to run out (the redirecting broker then takes
   * the shard over). `delayMs` is the wait about to start.
   */
  readonly onLeaderWait?: (redirect: RedirectError, delayMs: number) => void;
  /**
   * `false`: the request must not reach a broker twice (e.g. an Enqueue
   * without dedup ids, a PurgeQueue). After an attempt that may have been
   * applied (see {@link mayHaveBeenApplied}) the call is not resent and fails
   * with that attempt's error. Attempts that surely were not applied
   * (redirects, refused connections, UNAVAILABLE answers) are still retried.
   * Default `true`.
   */
  readonly idempotent?: boolean;
}

/** What one attempt gets: the broker to call, and the per-attempt signal and timeout. */
export interface AttemptContext {
  readonly address: string;
  readonly signal: AbortSignal | undefined;
  readonly timeoutMs: number;
  readonly attempt: number;
  /**
   * True when an earlier attempt of this call may have been applied (it ran
   * into its own timeout, or its connection broke after the request was
   * sent): an answer such as ALREADY_EXISTS may be that attempt's doing.
   */
  readonly uncertain: boolean;
}

/** Node.js error codes of a connection that was never made: the request was not sent. */
const NOT_SENT = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EAI_NONAME",
  "EHOSTUNREACH",
  "ENETUNREACH",
]);

/** True when `error` says the connection was never made, so the request was not sent. */
export function neverSent(error: unknown): boolean {
  const system = systemErrorCode(error);
  return system !== undefined && NOT_SENT.has(system);
}

/** The Node.js error code (`ECONNRESET`, ...) somewhere in an error's cause chain. */
function systemErrorCode(error: unknown): string | undefined {
  let current: unknown = error;
  for (let depth = 0; depth < 6 && current !== undefined && current !== null; depth++) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string") return code;
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

/**
 * True when a failed attempt may still have been applied by the broker: it
 * ran into its own timeout (`ownTimeout`: the broker may have stored the
 * request and hung before answering), or its connection (or the stream it
 * went on: {@link OutcomeUnknownError}) broke after the request was sent.
 * False for answers of the broker (redirects, UNAVAILABLE, errors) and for
 * connections that were never made.
 */
export function mayHaveBeenApplied(error: CasqError, ownTimeout: boolean): boolean {
  if (error instanceof OutcomeUnknownError) return true;
  if (error.code === Code.DeadlineExceeded) return ownTimeout;
  if (error instanceof RedirectError || !isRetryable(error)) return false;
  const system = systemErrorCode(error.cause);
  if (system !== undefined) return !NOT_SENT.has(system);
  // No transport error behind it: an UNAVAILABLE the broker answered, or a
  // transport failure described only in words.
  return error.code !== Code.Unavailable && !/ECONNREFUSED|ENOTFOUND|EHOSTUNREACH/.test(error.message);
}

/**
 * The SDK's delay in whole ms before retry number `attempt` (1-based), from
 * the client's backoff options: equal jitter (see `backoff.ts`), uniform
 * between half and all of min(backoffMaxMs, backoffInitialMs * 2^(attempt-1)),
 * so a retry always waits at least half its cap (full jitter would sometimes
 * retry at once).
 */
export function retryDelayMs(
  attempt: number,
  options: Pick<ResolvedClientOptions, "backoffInitialMs" | "backoffMaxMs">,
  random?: RandomSource,
): number {
  const backoff = {
    immediateRetries: 0,
    baseDelayMs: options.backoffInitialMs,
    maxDelayMs: options.backoffMaxMs,
    jitter: "equal",
  } as const;
  return Math.round(backoffDelay(attempt, backoff, random));
}

/** The error of a call its caller aborted through `signal`. */
export function callAborted(signal: AbortSignal | undefined): CasqError {
  return new CasqError(Code.Canceled, "casq: call aborted", { cause: signal?.reason });
}

/**
 * Resolves after `ms` on `clock` (default: the system clock), or rejects with
 * a CANCELLED CasqError when `signal` aborts.
 */
export async function sleep(ms: number, signal?: AbortSignal, clock: SdkClock = systemClock): Promise<void> {
  if (signal?.aborted) throw callAborted(signal);
  try {
    await clock.sleep(ms, signal);
  } catch {
    throw callAborted(signal);
  }
}

/**
 * Runs `attempt` against brokers of `pool` until it succeeds:
 * - {@link RedirectError}: the leader is added to the pool, preferred, and called at once —
 *   unless that leader already failed to answer in this call: then it is dead, the
 *   redirecting broker takes its shards over once the leader's lease runs out, so the
 *   call stays with the redirecting broker and backs off;
 * - outage / connection error (see {@link isRetryable}), or an attempt that ran into its own
 *   `timeoutMs` (not the caller's deadline): the next broker, after a backoff;
 * - anything else: thrown as a {@link CasqError}.
 * Throws the last error after `maxAttempts` attempts or when a backoff would pass the
 * caller's deadline or the retry budget (`retryTimeoutMs` from the first attempt).
 */
export async function callWithFailover<T>(
  pool: BrokerPool,
  attempt: (ctx: AttemptContext) => Promise<T>,
  options: FailoverCallOptions = {},
): Promise<T> {
  const { timeoutMs, retryTimeoutMs, clock } = pool.options;
  const maxAttempts = options.maxAttempts ?? pool.options.maxAttempts;
  const giveUpAt = clock.now() + retryTimeoutMs;
  let address = options.address ?? pool.preferred();
  let failures = 0;
  // An earlier attempt may have been applied.
  let uncertain = false;
  // Brokers that failed without a redirect during this call.
  const failed = new Set<string>();
  /** Sleeps the next backoff delay; rethrows `error` when that would pass the deadline. */
  const backOff = async (error: CasqError): Promise<void> => {
    const delay = retryDelayMs(++failures, pool.options, pool.options.random);
    const end = clock.now() + delay;
    if (end >= giveUpAt || (options.deadline !== undefined && end >= options.deadline)) throw error;
    if (error instanceof RedirectError && failed.has(error.leaderAddress))
      options.onLeaderWait?.(error, delay);
    await sleep(delay, options.signal, clock);
  };
  // Brokers this call reached by following a redirect, and the broker that redirected there.
  const redirectedFrom = new Map<string, string>();
  for (let n = 1; ; n++) {
    if (options.signal?.aborted) throw callAborted(options.signal);
    const left = options.deadline === undefined ? Number.POSITIVE_INFINITY : options.deadline - clock.now();
    if (left <= 0) throw new CasqError(Code.DeadlineExceeded, "casq: deadline exceeded");
    // When the caller's deadline is the nearer one, a timeout of this attempt is the caller's.
    const callerBound = left <= timeoutMs;
    try {
      return await attempt({
        address,
        signal: options.signal,
        timeoutMs: Math.min(timeoutMs, left),
        attempt: n,
        uncertain,
      });
    } catch (thrown) {
      const error = toCasqError(thrown);
      if (options.signal?.aborted) throw callAborted(options.signal);
      if (n >= maxAttempts) throw error;
      if (error instanceof RedirectError) {
        if (failed.has(error.leaderAddress)) {
          // Bouncing between this broker and a dead leader would burn every
          // attempt within a fraction of the leader's lease: wait here instead.
          pool.prefer(address);
          await backOff(error);
          continue;
        }
        pool.prefer(error.leaderAddress);
        // A redirect back to the broker we just asked means its view is stale: back off a little.
        if (error.leaderAddress === address) await backOff(error);
        else redirectedFrom.set(error.leaderAddress, address);
        address = error.leaderAddress;
        continue;
      }
      // This attempt's own timeout: the broker is hung (or too slow); another may answer.
      const hung = error.code === Code.DeadlineExceeded && !callerBound;
      if (!hung && !isRetryable(error)) throw error;
      if (mayHaveBeenApplied(error, hung)) {
        // Resending could apply it twice.
        if (options.idempotent === false) throw error;
        uncertain = true;
      }
      const from = redirectedFrom.get(address);
      if (options.retryOutages === false && from === undefined) throw error;
      failed.add(address);
      await backOff(error);
      address = options.retryOutages === false && from !== undefined ? from : pool.rotate(address);
    }
  }
}
