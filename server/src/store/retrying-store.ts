/**
 * `RetryingStore` — retries the store failures that are safe to retry, and
 * only those.
 *
 * Why it exists: object stores fail transiently all the time (503 SlowDown,
 * 500s, connection resets before a request was sent). Those failures mean
 * "the request did not happen", so repeating the identical request (same
 * key, same body, same `If-Match` condition) is always safe, for reads and
 * for conditional writes alike. Writing that loop once, around any backend,
 * keeps backends thin and gives the whole engine one retry policy.
 *
 * What it never retries, because the caller must decide:
 * - `precondition_failed` (412): another writer won the CAS race. Repeating
 *   the same `If-Match` would fail forever; the broker must re-read.
 * - `conflict` (409): a concurrent conditional write was in flight; the
 *   broker re-reads first (its conflict loop backs off with the same
 *   `backoffDelay` of `@casq/sdk/backoff.ts`).
 * - `ambiguous`: the write may have landed. Nobody may be told anything until
 *   a re-read finds out, and a blind retry of an `If-Match` write that did
 *   land would then fail with 412 and hide the success.
 * - `invalid`, `not_found`, and anything that is not a `StoreError`.
 *
 * Policy (see {@link RetryPolicy}): the first `immediateRetries` retries go
 * out at once (a single hiccup costs no latency), then exponential backoff
 * from `baseDelayMs`, doubling, capped at `maxDelayMs`, with jitter so that
 * brokers that failed together do not retry together; at most `maxAttempts`
 * attempts in total. The delays are computed by the one backoff helper of
 * the TypeScript code, `backoffDelay` in `@casq/sdk/backoff.ts`. Delays are
 * slept on the injected {@link Clock} and jittered with the injected
 * {@link Random}, so tests and the simulation see simulated, reproducible time.
 *
 * Aborting the call's signal stops retrying: an in-progress backoff sleep is
 * cut short and the call rejects with an `UnavailableError` (the last attempt
 * did not happen, so nothing landed). `close()` does the same for every call
 * in flight, then closes the inner store.
 *
 * Each attempt is passed down with `attempt` set in its options (see
 * {@link AttemptCallOptions}) so an `InstrumentedStore` placed inside can
 * label every HTTP request with its attempt number.
 */
import { setMaxListeners } from "node:events";
import { type Backoff, backoffDelay } from "@casq/sdk/backoff.ts";
import { type Clock, systemClock } from "../util/clock.ts";
import { type Random, systemRandom } from "../util/random.ts";
import type { AttemptCallOptions, StoreOperation } from "./instrumented-store.ts";
import type {
  CallOptions,
  ListedObject,
  ObjectStore,
  PutCondition,
  PutResult,
  StoredObject,
} from "./object-store.ts";
import { isTransient, UnavailableError } from "./store-errors.ts";

/** A retry policy: a {@link Backoff} and an attempt limit. Used by {@link RetryingStore}. */
export interface RetryPolicy extends Backoff {
  /** Attempts in total, including the first. 1 disables retrying. */
  readonly maxAttempts: number;
}

/**
 * The default store retry policy: 1 immediate retry, then full-jitter
 * exponential backoff 50, 100, 200, 400, 800 ms caps (ceiling 2 s), 7 attempts
 * in total. The worst case sleeps about 1.55 s, well inside the >= 5 s request
 * timeout the source design asks for, so a broker gives up on a store outage
 * quickly and can report `unavailable` instead of hanging a client.
 */
export const DEFAULT_RETRY_POLICY: RetryPolicy = Object.freeze({
  maxAttempts: 7,
  immediateRetries: 1,
  baseDelayMs: 50,
  maxDelayMs: 2000,
  jitter: "full",
});

/**
 * Fills unspecified fields from {@link DEFAULT_RETRY_POLICY} and validates the
 * result. Throws `RangeError` for a policy that cannot work (non-integer or
 * non-positive `maxAttempts`, negative delays, `maxDelayMs < baseDelayMs`,
 * unknown jitter mode).
 */
export function resolveRetryPolicy(overrides: Partial<RetryPolicy> = {}): RetryPolicy {
  const policy: RetryPolicy = { ...DEFAULT_RETRY_POLICY, ...stripUndefined(overrides) };
  if (!Number.isInteger(policy.maxAttempts) || policy.maxAttempts < 1)
    throw new RangeError(`retry policy: maxAttempts must be an integer >= 1, got ${policy.maxAttempts}`);
  if (!Number.isInteger(policy.immediateRetries) || policy.immediateRetries < 0)
    throw new RangeError(
      `retry policy: immediateRetries must be an integer >= 0, got ${policy.immediateRetries}`,
    );
  if (!Number.isFinite(policy.baseDelayMs) || policy.baseDelayMs < 0)
    throw new RangeError(`retry policy: baseDelayMs must be a finite number >= 0, got ${policy.baseDelayMs}`);
  if (!Number.isFinite(policy.maxDelayMs) || policy.maxDelayMs < policy.baseDelayMs)
    throw new RangeError(
      `retry policy: maxDelayMs must be finite and >= baseDelayMs (${policy.baseDelayMs}), got ${policy.maxDelayMs}`,
    );
  if (policy.jitter !== "full" && policy.jitter !== "equal" && policy.jitter !== "none")
    throw new RangeError(
      `retry policy: jitter must be "full", "equal" or "none", got ${String(policy.jitter)}`,
    );
  return Object.freeze(policy);
}

/** Reported before each retry of a {@link RetryingStore}. */
export interface RetryEvent {
  /** The operation being retried. */
  readonly op: StoreOperation;
  /** The key, or for `list` the prefix. */
  readonly key: string;
  /** The attempt that just failed (1-based); the next attempt is `attempt + 1`. */
  readonly attempt: number;
  /** How long the store waits before the next attempt (0 for an immediate retry). */
  readonly delayMs: number;
  /** The transient error that caused the retry. */
  readonly error: unknown;
}

/** Options of a {@link RetryingStore}. */
export interface RetryingStoreOptions {
  /** Overrides of {@link DEFAULT_RETRY_POLICY}. */
  readonly policy?: Partial<RetryPolicy>;
  /** Clock the backoff sleeps on. Default `systemClock`. */
  readonly clock?: Clock;
  /** Source of jitter. Default `systemRandom`. */
  readonly random?: Random;
  /** Called before each retry (for logs and metrics); errors it throws are ignored. */
  readonly onRetry?: (event: RetryEvent) => void;
}

/** An {@link ObjectStore} wrapper that retries transient (`unavailable`) failures. See the module header. */
export class RetryingStore implements ObjectStore {
  /** The inner store's description: retrying is invisible in logs. */
  readonly description: string;
  /** The resolved policy in force. */
  readonly policy: RetryPolicy;
  private readonly clock: Clock;
  private readonly random: Random;
  private readonly onRetry: ((event: RetryEvent) => void) | undefined;
  private readonly closing = new AbortController();

  constructor(
    private readonly inner: ObjectStore,
    options: RetryingStoreOptions = {},
  ) {
    this.description = inner.description;
    this.policy = resolveRetryPolicy(options.policy);
    this.clock = options.clock ?? systemClock;
    this.random = options.random ?? systemRandom;
    this.onRetry = options.onRetry;
    // Every call in backoff listens on this signal; many at once is normal, not a leak.
    setMaxListeners(0, this.closing.signal);
  }

  /** Reads a key, retrying transient failures. */
  get(key: string, options?: CallOptions): Promise<StoredObject | undefined> {
    return this.run("get", key, options, (o) => this.inner.get(key, o));
  }

  /** Writes a key under its condition, retrying transient failures (the same condition each time). */
  put(key: string, body: Uint8Array, condition: PutCondition, options?: CallOptions): Promise<PutResult> {
    return this.run("put", key, options, (o) => this.inner.put(key, body, condition, o));
  }

  /** Deletes a key, retrying transient failures. */
  delete(key: string, options?: CallOptions & { readonly ifMatch?: string }): Promise<void> {
    return this.run("delete", key, options, (o) => this.inner.delete(key, { ...options, ...o }));
  }

  /** Lists a prefix, retrying transient failures. */
  list(prefix: string, options?: CallOptions): Promise<ListedObject[]> {
    return this.run("list", prefix, options, (o) => this.inner.list(prefix, o));
  }

  /** Stops every pending backoff (those calls reject as unavailable), then closes the inner store. */
  close(): Promise<void> {
    this.closing.abort(new Error("the store is closing"));
    return this.inner.close();
  }

  private async run<T>(
    op: StoreOperation,
    key: string,
    options: CallOptions | undefined,
    call: (options: AttemptCallOptions) => Promise<T>,
  ): Promise<T> {
    const signal = options?.signal;
    for (let attempt = 1; ; attempt++) {
      try {
        return await call({ ...options, attempt });
      } catch (error) {
        if (!isTransient(error)) throw error;
        // The caller gave up (or we are closing): the error already says "did not happen".
        if (signal?.aborted || this.closing.signal.aborted) throw error;
        if (attempt >= this.policy.maxAttempts)
          throw new UnavailableError(
            key,
            `gave up after ${attempt} attempt${attempt === 1 ? "" : "s"}; last error: ${messageOf(error)}`,
            { cause: error },
          );
        const delayMs = backoffDelay(attempt, this.policy, this.random);
        this.notify({ op, key, attempt, delayMs, error });
        if (delayMs > 0) {
          try {
            await this.sleep(delayMs, signal);
          } catch {
            throw new UnavailableError(
              key,
              `stopped retrying after ${attempt} attempt${attempt === 1 ? "" : "s"}: ${
                this.closing.signal.aborted ? "the store is closing" : "the call was aborted"
              }; last error: ${messageOf(error)}`,
              { cause: error },
            );
          }
        }
      }
    }
  }

  /** Sleeps on the clock until `ms` passed, the call's signal aborts, or the store closes. */
  private async sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
    if (signal === undefined) return this.clock.sleep(ms, this.closing.signal);
    const linked = new AbortController();
    const forward = (source: AbortSignal) => () => linked.abort(source.reason);
    const onCall = forward(signal);
    const onClose = forward(this.closing.signal);
    if (signal.aborted) onCall();
    else if (this.closing.signal.aborted) onClose();
    signal.addEventListener("abort", onCall, { once: true });
    this.closing.signal.addEventListener("abort", onClose, { once: true });
    try {
      await this.clock.sleep(ms, linked.signal);
    } finally {
      signal.removeEventListener("abort", onCall);
      this.closing.signal.removeEventListener("abort", onClose);
    }
  }

  private notify(event: RetryEvent): void {
    if (!this.onRetry) return;
    try {
      this.onRetry(event);
    } catch {
      // A logging hook must never change what the store does.
    }
  }
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function stripUndefined<T extends object>(value: T): Partial<T> {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as Partial<T>;
}
