/**
 * `InstrumentedStore` — the seam where observability attaches to the store.
 *
 * Why it exists: every broker decision ends in an object-store call, and the
 * latency, error kinds, bytes and CAS outcomes of those calls are what an
 * operator needs to see (PUT latency bounds group-commit throughput; 412s
 * show contention between brokers; bytes per write show document growth;
 * PUTs per job are the cost metric). Rather than teaching every backend about
 * OpenTelemetry and Prometheus, this wrapper reports each operation to a
 * small, typed {@link StoreObserver}; tracing and metrics are observers
 * written once, and backends stay thin.
 *
 * What is reported, per call:
 * - `onStart` before the inner store is called: the operation, key (or list
 *   prefix), the attempt number when a retrying wrapper supplies one, the
 *   condition etag (`etagBefore`) and the bytes about to be sent.
 * - `onEnd` after it settled: the outcome (`ok`, `not_found` for a get of a
 *   missing key, a {@link StoreErrorKind}, or `error` for anything that is not
 *   a store error), the duration measured with the injected clock, bytes in
 *   and out, and the etag the call produced or read (`etagAfter`).
 * - Optionally `around`, which wraps the inner call so a tracer can make its
 *   span the active context while the backend runs (nesting, e.g., the AWS
 *   SDK's own HTTP spans under the store span).
 *
 * Bytes are counted from the caller's side: `bytesOut` is what the call sends
 * to the store (a put's body), `bytesIn` is what it receives (a get's body).
 *
 * Placement: inside a {@link RetryingStore} it sees every attempt (one span
 * per HTTP request, `attempt` filled in); outside it sees one logical call.
 * Both placements can be used at once with different observers.
 *
 * Observers must not throw; if one does, the error is reported to
 * `onObserverError` (default: a process warning) and the store call proceeds
 * unaffected.
 *
 * @see RetryingStore in ./retrying-store.ts
 */
import { type Clock, systemClock } from "../util/clock.ts";
import type {
  CallOptions,
  ListedObject,
  ObjectStore,
  PutCondition,
  PutResult,
  StoredObject,
} from "./object-store.ts";
import { isStoreError, type StoreErrorKind } from "./store-errors.ts";

/** The operations of an {@link ObjectStore} that touch storage. */
export type StoreOperation = "get" | "put" | "delete" | "list";

/** Every {@link StoreOperation}, in a stable order. */
export const STORE_OPERATIONS: readonly StoreOperation[] = ["get", "put", "delete", "list"];

/**
 * Call options a wrapper above (typically `RetryingStore`) may pass down to
 * say which attempt of a logical call this is (1-based). Backends ignore it.
 */
export interface AttemptCallOptions extends CallOptions {
  /** 1 for the first try, 2 for the first retry, ... */
  readonly attempt?: number;
}

/**
 * How a store call ended: `ok`; `not_found` (a get of a missing key, or a
 * `NotFoundError`); the {@link StoreErrorKind} of a store error; or `error`
 * for a rejection that is not a store error (a bug or an unclassified failure).
 */
export type StoreOutcome = "ok" | StoreErrorKind | "error";

/** Reported when a store call starts. The same object is referenced by the matching {@link StoreOpEnd}. */
export interface StoreOpStart {
  /** Which operation. */
  readonly op: StoreOperation;
  /** The key, or for `list` the prefix. */
  readonly key: string;
  /** Attempt number when a wrapper above supplied one (see {@link AttemptCallOptions}), else `undefined`. */
  readonly attempt: number | undefined;
  /** The condition of a put or delete: `if_match`, `if_absent`, or `none` (unconditional delete, reads). */
  readonly condition: "if_match" | "if_absent" | "none";
  /** The etag the write is conditioned on (`ifMatch`), if any. */
  readonly etagBefore: string | undefined;
  /** Bytes the call sends to the store (a put's body length; 0 otherwise). */
  readonly bytesOut: number;
  /** Clock time when the call started, epoch ms. */
  readonly startedAtMs: number;
}

/** Reported when a store call has settled. */
export interface StoreOpEnd extends StoreOpStart {
  /** The matching start event (the very object passed to `onStart`). */
  readonly start: StoreOpStart;
  /** How the call ended. */
  readonly outcome: StoreOutcome;
  /** `clock.now()` at the end minus at the start. */
  readonly durationMs: number;
  /** Bytes received from the store (a get's body length; 0 otherwise). */
  readonly bytesIn: number;
  /** The etag read (get) or written (put); `undefined` otherwise or on failure. */
  readonly etagAfter: string | undefined;
  /** For `list`: the number of keys returned; `undefined` otherwise. */
  readonly itemCount: number | undefined;
  /** The error the call rejected with, when `outcome` is not `ok`/`not_found`. */
  readonly error: unknown;
}

/** Called with the end event of the call whose `onStart` returned it (e.g. to end a span). */
export type StoreOpFinish = (end: StoreOpEnd) => void;

/**
 * Receives store operations. Every member is optional; an observer that only
 * counts needs `onEnd` alone.
 */
export interface StoreObserver {
  /** Before the call; may return a function that receives this call's end event (per-call state, e.g. a span). */
  onStart?(start: StoreOpStart): StoreOpFinish | undefined;
  /** After the call settled, for every observer, whether or not `onStart` returned a finisher. */
  onEnd?(end: StoreOpEnd): void;
  /**
   * Wraps the inner call; must call `run` exactly once and return (or rethrow)
   * its result. Lets a tracer run the backend inside its span's context.
   */
  around?<T>(start: StoreOpStart, run: () => Promise<T>): Promise<T>;
}

/** An observer that does nothing. */
export const noopStoreObserver: StoreObserver = {};

/** One observer that forwards to several, in order (`around` hooks nest, the first outermost). */
export function combineObservers(...observers: readonly StoreObserver[]): StoreObserver {
  const withAround = observers.filter((o) => o.around !== undefined);
  return {
    onStart(start) {
      const finishers: StoreOpFinish[] = [];
      for (const observer of observers) {
        const finish = observer.onStart?.(start);
        if (finish) finishers.push(finish);
      }
      return finishers.length === 0
        ? undefined
        : (end) => {
            for (const finish of finishers) finish(end);
          };
    },
    onEnd(end) {
      for (const observer of observers) observer.onEnd?.(end);
    },
    ...(withAround.length === 0
      ? {}
      : {
          around<T>(start: StoreOpStart, run: () => Promise<T>): Promise<T> {
            let next = run;
            for (let i = withAround.length - 1; i >= 0; i--) {
              const observer = withAround[i] as StoreObserver;
              const inner = next;
              next = () => (observer.around as NonNullable<StoreObserver["around"]>)(start, inner);
            }
            return next();
          },
        }),
  };
}

/** Options of an {@link InstrumentedStore}. */
export interface InstrumentedStoreOptions {
  /** Where operations are reported. Default {@link noopStoreObserver}. */
  readonly observer?: StoreObserver;
  /** Clock for durations. Default `systemClock`. */
  readonly clock?: Clock;
  /** Receives errors thrown by the observer. Default: `process.emitWarning`. */
  readonly onObserverError?: (error: unknown) => void;
}

interface Settled {
  readonly bytesIn: number;
  readonly etagAfter: string | undefined;
  readonly itemCount: number | undefined;
  readonly notFound: boolean;
}

/** An {@link ObjectStore} wrapper that reports every operation to a {@link StoreObserver}. See the module header. */
export class InstrumentedStore implements ObjectStore {
  /** The inner store's description: instrumentation is invisible in logs. */
  readonly description: string;
  private readonly observer: StoreObserver;
  private readonly clock: Clock;
  private readonly onObserverError: (error: unknown) => void;

  constructor(
    private readonly inner: ObjectStore,
    options: InstrumentedStoreOptions = {},
  ) {
    this.description = inner.description;
    this.observer = options.observer ?? noopStoreObserver;
    this.clock = options.clock ?? systemClock;
    this.onObserverError = options.onObserverError ?? defaultObserverError;
  }

  /** Reads through the inner store; reports `not_found` for a missing key. */
  get(key: string, options?: AttemptCallOptions): Promise<StoredObject | undefined> {
    return this.observe(
      "get",
      key,
      options,
      "none",
      undefined,
      0,
      () => this.inner.get(key, options),
      (result) => ({
        bytesIn: result?.body.byteLength ?? 0,
        etagAfter: result?.etag,
        itemCount: undefined,
        notFound: result === undefined,
      }),
    );
  }

  /** Writes through the inner store; reports the condition etag and the new etag. */
  put(
    key: string,
    body: Uint8Array,
    condition: PutCondition,
    options?: AttemptCallOptions,
  ): Promise<PutResult> {
    const ifMatch = "ifMatch" in condition ? condition.ifMatch : undefined;
    return this.observe(
      "put",
      key,
      options,
      ifMatch === undefined ? "if_absent" : "if_match",
      ifMatch,
      body.byteLength,
      () => this.inner.put(key, body, condition, options),
      (result) => ({ bytesIn: 0, etagAfter: result.etag, itemCount: undefined, notFound: false }),
    );
  }

  /** Deletes through the inner store. */
  delete(key: string, options?: AttemptCallOptions & { readonly ifMatch?: string }): Promise<void> {
    return this.observe(
      "delete",
      key,
      options,
      options?.ifMatch === undefined ? "none" : "if_match",
      options?.ifMatch,
      0,
      () => this.inner.delete(key, options),
      () => ({ bytesIn: 0, etagAfter: undefined, itemCount: undefined, notFound: false }),
    );
  }

  /** Lists through the inner store; `key` in the events is the prefix. */
  list(prefix: string, options?: AttemptCallOptions): Promise<ListedObject[]> {
    return this.observe(
      "list",
      prefix,
      options,
      "none",
      undefined,
      0,
      () => this.inner.list(prefix, options),
      (result) => ({ bytesIn: 0, etagAfter: undefined, itemCount: result.length, notFound: false }),
    );
  }

  /** Closes the inner store (not reported). */
  close(): Promise<void> {
    return this.inner.close();
  }

  private async observe<T>(
    op: StoreOperation,
    key: string,
    options: AttemptCallOptions | undefined,
    condition: StoreOpStart["condition"],
    etagBefore: string | undefined,
    bytesOut: number,
    call: () => Promise<T>,
    describe: (result: T) => Settled,
  ): Promise<T> {
    const start: StoreOpStart = {
      op,
      key,
      attempt: options?.attempt,
      condition,
      etagBefore,
      bytesOut,
      startedAtMs: this.clock.now(),
    };
    let finish: StoreOpFinish | undefined;
    try {
      finish = this.observer.onStart?.(start);
    } catch (error) {
      this.onObserverError(error);
    }

    let result: T;
    try {
      result = await this.invoke(start, call);
    } catch (error) {
      this.report(start, finish, {
        outcome: outcomeOf(error),
        bytesIn: 0,
        etagAfter: undefined,
        itemCount: undefined,
        error,
      });
      throw error;
    }
    const settled = describe(result);
    this.report(start, finish, {
      outcome: settled.notFound ? "not_found" : "ok",
      bytesIn: settled.bytesIn,
      etagAfter: settled.etagAfter,
      itemCount: settled.itemCount,
      error: undefined,
    });
    return result;
  }

  /** Runs the inner call, inside the observer's `around` hook when it has one. */
  private invoke<T>(start: StoreOpStart, call: () => Promise<T>): Promise<T> {
    const observer = this.observer;
    if (observer.around === undefined) return call();
    return observer.around(start, call);
  }

  private report(
    start: StoreOpStart,
    finish: StoreOpFinish | undefined,
    rest: Pick<StoreOpEnd, "outcome" | "bytesIn" | "etagAfter" | "itemCount" | "error">,
  ): void {
    const end: StoreOpEnd = {
      ...start,
      start,
      durationMs: this.clock.now() - start.startedAtMs,
      ...rest,
    };
    try {
      finish?.(end);
    } catch (error) {
      this.onObserverError(error);
    }
    try {
      this.observer.onEnd?.(end);
    } catch (error) {
      this.onObserverError(error);
    }
  }
}

/** The {@link StoreOutcome} of a rejected call. */
function outcomeOf(error: unknown): StoreOutcome {
  return isStoreError(error) ? error.kind : "error";
}

function defaultObserverError(error: unknown): void {
  process.emitWarning(
    `a store observer threw; the store call was not affected: ${error instanceof Error ? error.message : String(error)}`,
    "CasqObserverWarning",
  );
}
