/**
 * One queue shard, led by this broker: group commit over CAS.
 *
 * The protocol in plain words:
 *
 * 1. **Load.** Read the shard document and its etag (or, if it does not
 *    exist, plan to create it with put-if-absent). A document that does not
 *    parse or has an unknown format is refused: every request gets
 *    `data_loss` and nothing is ever written over it. So is a missing
 *    document that `documentExpected` says must exist (its data was lost):
 *    it is not recreated empty behind the operator's back.
 * 2. **Group commit.** Requests are buffered. Exactly one CAS write is in
 *    flight at a time; when it lands, everything buffered meanwhile (up to
 *    `maxBatch` operations) is applied to the in-memory document and written as
 *    the next CAS (`If-Match: <etag>`). A caller's promise settles only after
 *    the write that contains its operation has landed: an "ok" is durable.
 *    Operations that change nothing (a heartbeat inside the persisted lease, a
 *    claim that found nothing) are answered without a write, unless the
 *    leadership lease needs renewing anyway.
 * 3. **Lost race.** On 412/409 or an ambiguous write (timeout: it may or may
 *    not have landed) re-read the document. If one of our attempts' write ids
 *    is in its write chain (`recent_write_ids` + `write_id`), that write
 *    landed and its results are the truth, even if others wrote on top since
 *    (see `write-resolution.ts`); if whether it landed cannot be decided, the
 *    batch fails as "outcome unknown" and is not applied again. If another
 *    broker now holds a live lease, we were deposed: fail the batch with a
 *    redirect to it. Otherwise re-apply the batch to the fresh document and
 *    try again — the first three conflicts at once, then with backoff.
 * 4. **Leadership.** Every write renews this broker's lease in the document;
 *    an idle leader writes a renewal when less than half the lease remains.
 *    Taking over a shard whose lease expired (or was released by a graceful
 *    stop) is a write that bumps the epoch. See `leadership.ts`.
 *
 * The in-memory document is mutated in place by each batch; when a write
 * fails the document is rebuilt from the store (or from the last committed
 * bytes), so a failed batch leaves no trace.
 */
import { CasqError, isCasqError } from "../errors.ts";
import { applyOperation } from "../model/apply-operation.ts";
import type { ExpireResult, Operation, OperationResult } from "../model/operations.ts";
import type { QueueConfig } from "../model/queue-config.ts";
import { type BrokerRecord, ShardState } from "../model/shard-state.ts";
import { nextHousekeepingAt, nextWakeAt } from "../model/shard-stats.ts";
import type { ObjectStore, PutCondition, StoredObject } from "../store/object-store.ts";
import { backoffDelay, DEFAULT_RETRY_POLICY, type RetryPolicy } from "../store/retrying-store.ts";
import { isStoreError } from "../store/store-errors.ts";
import type { Clock } from "../util/clock.ts";
import type { Random } from "../util/random.ts";
import { type BrokerIdentity, heldByOther, isOwnRecord, needsRenewal, takeoverRecord } from "./leadership.ts";
import { operationChangesState } from "./operation-effects.ts";
import { shardKey } from "./shard-key.ts";
import type { CommitInfo, ShardObserver } from "./shard-observer.ts";
import { resolveWrites, type WriteAttempt } from "./write-resolution.ts";

/** Tuning of one shard's commit loop. Defaults come from the source document. */
export interface CommitOptions {
  /** Leadership lease written into the document. Default 10 s. */
  readonly leaseMs: number;
  /** Most operations applied in one write. Default 1000. */
  readonly maxBatch: number;
  /** Wait this long before taking a batch, to gather more per PUT. Default 0 (latency first). */
  readonly lingerMs: number;
  /** `false` writes one CAS per operation (for comparison benchmarks only). Default true. */
  readonly groupCommit: boolean;
  /** Buffered operations beyond this are refused with `unavailable`. Default 100,000. */
  readonly maxPendingOps: number;
  /** Conflicts retried at once before backing off. Default 3. */
  readonly immediateConflictRetries: number;
  /** Give up a batch (answering `unavailable`) after this many lost races. Default 50. */
  readonly maxConflictRetries: number;
  /** Backoff between conflict retries after the immediate ones. */
  readonly conflictBackoff: RetryPolicy;
}

/** Defaults for {@link CommitOptions}. */
export const DEFAULT_COMMIT_OPTIONS: CommitOptions = {
  leaseMs: 10_000,
  maxBatch: 1000,
  lingerMs: 0,
  groupCommit: true,
  maxPendingOps: 100_000,
  immediateConflictRetries: 3,
  maxConflictRetries: 50,
  // The immediate retries are counted by `immediateConflictRetries`; backoff starts after them.
  conflictBackoff: { ...DEFAULT_RETRY_POLICY, immediateRetries: 0 },
};

/** Everything a {@link ShardLeader} needs. */
export interface ShardLeaderParams {
  readonly store: ObjectStore;
  readonly queue: string;
  readonly shard: number;
  readonly identity: BrokerIdentity;
  readonly clock: Clock;
  readonly random: Random;
  readonly options?: Partial<CommitOptions>;
  /** Config of the document when this broker creates it. */
  readonly initialConfig?: Partial<QueueConfig>;
  readonly observer?: ShardObserver;
  /**
   * Asked when the document does not exist: true when it should (the queue's
   * manifest says the shard was created), which refuses the shard instead of
   * creating it empty. Default: a missing document is a new shard.
   */
  readonly documentExpected?: () => Promise<boolean>;
}

// Telemetry: tracing — an optional hook the shard leader calls so that a tracer can
// tie each group commit to the calls whose operations it carried. The engine knows
// nothing of OpenTelemetry: tokens are opaque, and without a hook nothing is allocated.
/** Per-batch tracing returned by {@link CommitTracing.begin}. */
export interface CommitTrace {
  /** Runs the batch's commit (its store calls and observer callbacks) inside the commit's trace context. */
  run<T>(fn: () => Promise<T>): Promise<T>;
  /** The batch is done; `failure` is what it failed with, if it failed. */
  end(failure: unknown): void;
}

/** Telemetry: tracing hook of a shard leader (see {@link ShardObserverWithTracing}). */
export interface CommitTracing {
  /** At `submit`: an opaque token of the submitting call's trace context, or undefined. */
  capture(): unknown;
  /** At the start of a batch: the tokens of its operations (undefined entries skipped). */
  begin(queue: string, shard: number, operations: number, tokens: readonly unknown[]): CommitTrace;
}

/** Telemetry: tracing — a ShardObserver that may also carry a {@link CommitTracing} hook. */
export interface ShardObserverWithTracing extends ShardObserver {
  readonly commitTracing?: CommitTracing | undefined;
}

/** The leader's view of a shard. */
export type ShardMode = "unloaded" | "leading" | "following" | "refused" | "stopped";

type Settle<T> = { resolve(value: T): void; reject(error: unknown): void };

type BatchItem =
  | ({ kind: "op"; op: Operation; signal?: AbortSignal; trace?: unknown } & Settle<OperationResult>)
  | ({ kind: "read"; read(state: ShardState): unknown } & Settle<unknown>);

type Outcome = { ok: true; result: OperationResult } | { ok: false; error: unknown };

/**
 * Group-commits every operation on one queue shard into CAS writes of its
 * document, and holds (or follows) the shard's leadership.
 */
export class ShardLeader {
  readonly queue: string;
  readonly shard: number;
  readonly key: string;

  private readonly store: ObjectStore;
  private readonly identity: BrokerIdentity;
  private readonly clock: Clock;
  private readonly random: Random;
  private readonly options: CommitOptions;
  private readonly initialConfig: Partial<QueueConfig> | undefined;
  private readonly observer: ShardObserver | undefined;
  private readonly documentExpected: (() => Promise<boolean>) | undefined;
  /** Telemetry: tracing hook, undefined when tracing is off. */
  private readonly tracing: CommitTracing | undefined;
  /** Telemetry: tracing — what the current batch failed with (for its commit span). */
  private batchFailure: unknown;

  private mode: ShardMode = "unloaded";
  /** The refusal message last reported to observers while refused (so a refusal is reported once per reason). */
  private refusedFor: string | undefined;
  /** The committed document (in place mutation happens only inside a batch). `undefined` = does not exist yet. */
  private state: ShardState | undefined;
  private etag: string | undefined;
  /** Bytes of the committed version, to rebuild the state cheaply after a failed write. */
  private committedBytes: Uint8Array | undefined;
  /** The broker record seen in the store, kept while following to redirect without a read. */
  private seenRecord: BrokerRecord | undefined;
  /** When `seenRecord` was read. It is trusted for a tenth of a lease: long enough to spare
   * the store a read per redirected request, short enough to notice a graceful release soon. */
  private seenAt = Number.NEGATIVE_INFINITY;

  private pending: BatchItem[] = [];
  private loop: Promise<void> | undefined;
  private writeCounter = 0;
  private timer: AbortController | undefined;
  private releaseRequested = false;
  private timerFailures = 0;
  private readonly commitListeners = new Set<(state: ShardState) => void>();

  constructor(params: ShardLeaderParams) {
    this.store = params.store;
    this.queue = params.queue;
    this.shard = params.shard;
    this.key = shardKey(params.queue, params.shard);
    this.identity = params.identity;
    this.clock = params.clock;
    this.random = params.random;
    this.options = { ...DEFAULT_COMMIT_OPTIONS, ...params.options };
    this.initialConfig = params.initialConfig;
    this.observer = params.observer;
    this.documentExpected = params.documentExpected;
    this.tracing = (params.observer as ShardObserverWithTracing | undefined)?.commitTracing; // Telemetry: tracing
  }

  /** Current mode, for stats and tests. */
  get currentMode(): ShardMode {
    return this.mode;
  }

  /** The broker record last seen in the store (ours while leading). */
  get brokerRecord(): BrokerRecord | undefined {
    return this.mode === "leading" ? this.state?.broker : this.seenRecord;
  }

  /** Number of operations waiting for the next write. */
  get pendingCount(): number {
    return this.pending.length;
  }

  /**
   * Submits one operation. Resolves with its result once the write containing
   * it has landed (or at once when it changes nothing); rejects with a
   * {@link CasqError} (`redirect` when another broker leads the shard).
   * An abort before the operation joins a batch cancels it; after that the
   * write proceeds and the result is simply dropped by the caller.
   */
  submit(op: Operation, options?: { signal?: AbortSignal }): Promise<OperationResult> {
    return new Promise<OperationResult>((resolve, reject) => {
      const refusal = this.admission();
      if (refusal) return reject(refusal);
      if (options?.signal?.aborted) return reject(cancelled());
      const item: BatchItem = { kind: "op", op, resolve, reject };
      if (options?.signal) item.signal = options.signal;
      if (this.tracing) item.trace = this.tracing.capture(); // Telemetry: tracing
      this.pending.push(item);
      this.kick();
    });
  }

  /**
   * Runs `read` against the committed document once this broker leads the
   * shard and no write is half-applied. Used for stats and inspection.
   */
  read<T>(read: (state: ShardState) => T): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const refusal = this.admission();
      if (refusal) return reject(refusal);
      this.pending.push({ kind: "read", read, resolve: resolve as (value: unknown) => void, reject });
      this.kick();
    });
  }

  /** Calls `listener` after every commit (or no-write batch) with the committed document. Returns an unsubscribe. */
  onCommit(listener: (state: ShardState) => void): () => void {
    this.commitListeners.add(listener);
    return () => this.commitListeners.delete(listener);
  }

  /**
   * Stops the shard: waits for buffered operations to commit, then, when
   * `release` is set and this broker leads, writes `lease_until = 0` so that
   * another broker can take over at once.
   */
  async stop(options: { release: boolean }): Promise<void> {
    if (this.mode === "stopped") return;
    this.releaseRequested = options.release && this.mode === "leading";
    this.kick();
    while (this.loop) await this.loop;
    this.mode = "stopped";
    this.timer?.abort();
    this.timer = undefined;
    for (const item of this.pending.splice(0)) item.reject(shuttingDown(this.queue, this.shard));
  }

  /**
   * The time in whole milliseconds: the model (and the document) take integer
   * ms, while a clock may return fractions (e.g. a manual clock after a
   * jittered sleep).
   */
  private now(): number {
    return Math.floor(this.clock.now());
  }

  private admission(): CasqError | undefined {
    if (this.mode === "stopped") return shuttingDown(this.queue, this.shard);
    if (this.pending.length >= this.options.maxPendingOps)
      return new CasqError(
        "unavailable",
        `shard ${this.queue}/${this.shard} has ${this.pending.length} operations waiting for the store; retry with backoff`,
        { queue: this.queue, shard: this.shard },
      );
    return undefined;
  }

  private kick(): void {
    if (this.loop) return;
    this.loop = this.runLoop().finally(() => {
      this.loop = undefined;
      if (this.pending.length > 0 && this.mode !== "stopped") this.kick();
    });
  }

  private async runLoop(): Promise<void> {
    while (this.pending.length > 0 || this.releaseRequested) {
      if (this.options.lingerMs > 0 && this.pending.length < this.options.maxBatch)
        await this.clock.sleep(this.options.lingerMs);
      // Let callers answered by the previous write submit their next operation
      // first, so that it joins this batch instead of waiting for the next.
      else await nextTurn();
      const batch = this.takeBatch();
      const release = this.releaseRequested && this.pending.length === 0;
      if (release) this.releaseRequested = false;
      // Telemetry: tracing — one commit trace per batch, linked to the calls it carries.
      const trace = this.tracing?.begin(
        this.queue,
        this.shard,
        batch.length,
        batch.map((item) => (item.kind === "op" ? item.trace : undefined)),
      );
      this.batchFailure = undefined;
      try {
        await (trace ? trace.run(() => this.commitBatch(batch, release)) : this.commitBatch(batch, release));
      } catch (error) {
        // commitBatch settles every item itself; this is a last line of defence.
        this.batchFailure = error;
        for (const item of batch) item.reject(asCasqError(error, this.queue, this.shard));
      }
      trace?.end(this.batchFailure);
    }
    this.armTimer();
  }

  private takeBatch(): BatchItem[] {
    const limit = this.options.groupCommit ? this.options.maxBatch : 1;
    const batch: BatchItem[] = [];
    let ops = 0;
    while (this.pending.length > 0) {
      const next = this.pending[0] as BatchItem;
      if (next.kind === "op") {
        if (ops >= limit) break;
        ops += 1;
      }
      this.pending.shift();
      if (next.kind === "op" && next.signal?.aborted) {
        next.reject(cancelled());
        continue;
      }
      batch.push(next);
    }
    return batch;
  }

  /** Applies one batch and writes it, retrying lost races; settles every item. */
  private async commitBatch(batch: BatchItem[], release: boolean): Promise<void> {
    const started = this.now();
    const attempts = new Map<string, WriteAttempt<Outcome[]>>();
    let conflicts = 0;
    let justReloaded = false;
    for (;;) {
      if (!justReloaded && (this.mode !== "leading" || this.state === undefined)) {
        const problem = await this.ensureLoaded();
        if (problem) return this.failBatch(batch, problem);
      }
      justReloaded = false;
      const now = this.now();
      const existing = this.state;
      if (existing && heldByOther(existing.broker, this.identity, now)) {
        this.mode = "following";
        this.seenRecord = existing.broker;
        return this.failBatch(batch, this.redirect(existing.broker));
      }

      const creating = existing === undefined;
      const working =
        existing ??
        ShardState.create({ queue: this.queue, shard: this.shard, config: this.initialConfig ?? {}, now });
      const previousRecord = working.broker;
      const takingOver = creating || !isOwnRecord(previousRecord, this.identity);
      const expire = applyOperation(working, { kind: "expire" }, now);
      let changed = creating || takingOver || release || operationChangesState(expire);
      const outcomes: Outcome[] = [];
      for (const item of batch) {
        if (item.kind !== "op") continue;
        try {
          const result = applyOperation(working, item.op, now);
          if (operationChangesState(result)) changed = true;
          outcomes.push({ ok: true, result });
        } catch (error) {
          outcomes.push({ ok: false, error });
        }
      }
      if (!changed && previousRecord && needsRenewal(previousRecord, now, this.options.leaseMs))
        changed = true;

      if (!changed) {
        this.state = working;
        this.mode = "leading";
        this.settle(batch, outcomes);
        this.observer?.onCommit?.(
          this.commitInfo(batch, started, 0, "no_write", 0, { now, outcomes, expire }),
        );
        return;
      }

      working.broker = takingOver
        ? takeoverRecord(previousRecord, this.identity, now, this.options.leaseMs)
        : {
            ...(previousRecord as BrokerRecord),
            address: this.identity.address,
            leaseUntil: release ? 0 : now + this.options.leaseMs,
          };
      const writeId = `${this.identity.id}.${++this.writeCounter}`;
      const basedOn = creating ? undefined : working.writeId;
      working.recordWrite(writeId);
      const bytes = working.encode();
      const attempt = { value: outcomes, basedOn, ambiguous: false };
      attempts.set(writeId, attempt);
      const condition: PutCondition = creating ? { ifAbsent: true } : { ifMatch: this.etag as string };
      try {
        const put = await this.store.put(this.key, bytes, condition);
        this.state = working;
        this.etag = put.etag;
        this.committedBytes = bytes;
        this.mode = "leading";
        if (takingOver)
          this.observer?.onLeadership?.({
            queue: this.queue,
            shard: this.shard,
            event: "acquired",
            record: working.broker,
          });
        this.settle(batch, outcomes);
        this.observer?.onCommit?.(
          this.commitInfo(batch, started, conflicts + 1, "ok", bytes.byteLength, { now, outcomes, expire }),
        );
        return;
      } catch (error) {
        const kind = isStoreError(error) ? error.kind : "internal";
        this.observer?.onCasAttempt?.({
          queue: this.queue,
          shard: this.shard,
          outcome: kind,
          attempt: conflicts + 1,
        });
        attempts.set(writeId, { ...attempt, ambiguous: kind === "ambiguous" });
        if (kind !== "precondition_failed" && kind !== "conflict" && kind !== "ambiguous") {
          // The write did not happen (unavailable) or cannot (invalid): restore and answer.
          this.restoreCommitted();
          return this.failBatch(batch, asCasqError(error, this.queue, this.shard));
        }
        const fresh = await this.reload();
        // No write of this batch may have landed, and the shard is now refused: say so.
        if (isCasqError(fresh, "data_loss") && ![...attempts.values()].some((a) => a.ambiguous))
          return this.failBatch(batch, fresh);
        if (fresh instanceof CasqError) {
          const unknown = new CasqError(
            "unavailable",
            `shard ${this.queue}/${this.shard}: a write may or may not have landed and the store cannot be read to find out (${fresh.message}); retry — use dedup ids to make enqueue retries safe`,
            { queue: this.queue, shard: this.shard },
            { cause: fresh },
          );
          return this.failBatch(batch, unknown);
        }
        const verdict = resolveWrites(
          this.state?.writeChain() ?? [],
          this.state?.writeChainComplete() ?? true,
          attempts,
        );
        if (verdict.kind === "landed") {
          // The mode follows the document's broker record (reload set it): a rival may lead by now.
          this.settle(batch, verdict.value);
          this.observer?.onCommit?.(
            this.commitInfo(batch, started, conflicts + 1, "ok", bytes.byteLength, {
              now,
              outcomes: verdict.value,
            }),
          );
          return;
        }
        if (verdict.kind === "unknown") {
          return this.failBatch(
            batch,
            new CasqError(
              "unavailable",
              `shard ${this.queue}/${this.shard}: a write may or may not have landed and too many writes followed to find out; retry — use dedup ids to make enqueue retries safe`,
              { queue: this.queue, shard: this.shard },
            ),
          );
        }
        justReloaded = true;
        conflicts += 1;
        if (conflicts > this.options.maxConflictRetries) {
          return this.failBatch(
            batch,
            new CasqError(
              "unavailable",
              `shard ${this.queue}/${this.shard} lost ${conflicts} write races in a row; is another process writing it? retry later`,
              { queue: this.queue, shard: this.shard },
            ),
          );
        }
        if (conflicts > this.options.immediateConflictRetries) {
          await this.clock.sleep(
            backoffDelay(
              conflicts - this.options.immediateConflictRetries,
              this.options.conflictBackoff,
              this.random,
            ),
          );
        }
      }
    }
  }

  /** Loads the document if needed. Returns the error to fail the batch with, if any. */
  private async ensureLoaded(): Promise<CasqError | undefined> {
    const now = this.now();
    if (
      this.mode === "following" &&
      heldByOther(this.seenRecord, this.identity, now) &&
      now - this.seenAt < this.options.leaseMs / 10
    ) {
      return this.redirect(this.seenRecord);
    }
    const result = await this.reload();
    return result instanceof CasqError ? result : undefined;
  }

  /** Re-reads the document from the store into `state`. */
  private async reload(): Promise<StoredObject | undefined | CasqError> {
    let stored: StoredObject | undefined;
    try {
      stored = await this.store.get(this.key);
    } catch (error) {
      this.state = undefined;
      this.mode = "unloaded";
      return asCasqError(error, this.queue, this.shard);
    }
    if (!stored) {
      this.state = undefined;
      this.etag = undefined;
      this.committedBytes = undefined;
      this.mode = "unloaded";
      let expected: boolean;
      try {
        expected = (await this.documentExpected?.()) ?? false;
      } catch (error) {
        return asCasqError(error, this.queue, this.shard);
      }
      if (!expected) return undefined;
      return this.refuse(
        new CasqError(
          "data_loss",
          `shard document ${this.key} is missing, but queue ${this.queue} was created with this shard: its messages were lost (deleted by hand, or by a store lifecycle rule?). It will not be recreated empty behind your back: restore it from a backup, or recreate it with \`casq repair ${this.queue} --shard ${this.shard}\`.`,
          { queue: this.queue, shard: this.shard },
        ),
      );
    }
    try {
      this.state = ShardState.decode(stored.body, { queue: this.queue, shard: this.shard });
    } catch (error) {
      return this.refuse(
        new CasqError(
          "data_loss",
          `shard document ${this.key} cannot be read and will not be overwritten: ${error instanceof Error ? error.message : String(error)}. Inspect it with \`casq inspect ${this.queue} --shard ${this.shard}\`, restore it from a backup, or replace it with \`casq repair ${this.queue} --shard ${this.shard}\` (which keeps a copy).`,
          { queue: this.queue, shard: this.shard },
          { cause: error },
        ),
      );
    }
    this.etag = stored.etag;
    this.committedBytes = stored.body;
    this.seenRecord = this.state.broker;
    this.seenAt = this.now();
    const wasLeading = this.mode === "leading";
    if (isOwnRecord(this.state.broker, this.identity)) {
      this.mode = "leading";
    } else {
      this.mode = "following";
      if (wasLeading)
        this.observer?.onLeadership?.({
          queue: this.queue,
          shard: this.shard,
          event: "lost",
          record: this.state.broker,
        });
    }
    return stored;
  }

  /**
   * Refuses the shard: every request gets `refusal` until a reload finds a
   * document it can use. Observers hear of it once per distinct reason, not on
   * every request that meets the refused shard again.
   */
  private refuse(refusal: CasqError): CasqError {
    this.state = undefined;
    const repeated = this.mode === "refused" && this.refusedFor === refusal.message;
    this.mode = "refused";
    this.refusedFor = refusal.message;
    if (!repeated) {
      this.observer?.onLeadership?.({
        queue: this.queue,
        shard: this.shard,
        event: "refused",
        reason: refusal.message,
      });
    }
    return refusal;
  }

  private restoreCommitted(): void {
    if (this.committedBytes) {
      this.state = ShardState.decode(this.committedBytes);
    } else {
      this.state = undefined;
      this.mode = "unloaded";
    }
  }

  private settle(batch: BatchItem[], outcomes: Outcome[]): void {
    let index = 0;
    const state = this.state as ShardState;
    for (const item of batch) {
      if (item.kind === "read") {
        try {
          item.resolve(item.read(state));
        } catch (error) {
          item.reject(error);
        }
        continue;
      }
      const outcome = outcomes[index++] as Outcome;
      if (outcome.ok) item.resolve(outcome.result);
      else item.reject(outcome.error);
    }
    for (const listener of this.commitListeners) listener(state);
  }

  private failBatch(batch: BatchItem[], error: CasqError): void {
    if (this.tracing) this.batchFailure = error; // Telemetry: tracing
    for (const item of batch) item.reject(error);
  }

  private redirect(record: BrokerRecord | undefined): CasqError {
    if (record !== undefined && record.address === this.identity.address) {
      // An earlier process at this very address (before a crash or restart) still holds
      // the lease: a redirect would send the client straight back here. Ask for a retry.
      const waitMs = Math.max(0, record.leaseUntil - this.now());
      return new CasqError(
        "unavailable",
        `shard ${this.queue}/${this.shard} is still leased to ${record.id}, an earlier broker process at this address, for ${waitMs} ms; retry in ${waitMs} ms`,
        { queue: this.queue, shard: this.shard },
      );
    }
    return new CasqError(
      "redirect",
      `shard ${this.queue}/${this.shard} is led by broker ${record?.id ?? "?"} at ${record?.address || "an unknown address"}; send the request there`,
      {
        queue: this.queue,
        shard: this.shard,
        ...(record ? { leaderAddress: record.address, leaderId: record.id, epoch: record.epoch } : {}),
      },
    );
  }

  /** Arms one timer for the next thing due: a delayed message, a lease expiry, or lease renewal. */
  private armTimer(): void {
    this.timer?.abort();
    this.timer = undefined;
    if (this.mode !== "leading" || !this.state?.broker) return;
    const now = this.now();
    const renewAt = this.state.broker.leaseUntil - this.options.leaseMs / 2;
    const due = Math.min(
      renewAt,
      nextWakeAt(this.state, now) ?? Number.POSITIVE_INFINITY,
      nextHousekeepingAt(this.state) ?? Number.POSITIVE_INFINITY,
    );
    const controller = new AbortController();
    this.timer = controller;
    // A floor, and backoff while the store keeps failing, keep the timer from busy-looping.
    const floor =
      this.timerFailures === 0 ? MIN_TIMER_MS : Math.min(2000, MIN_TIMER_MS * 2 ** this.timerFailures);
    const delay = Math.max(floor, due - now);
    this.clock.sleep(delay, controller.signal).then(
      () => {
        if (this.timer !== controller || this.mode !== "leading") return;
        this.timer = undefined;
        // An empty read batch runs the expiry sweep and renews the lease if due.
        this.read(() => undefined).then(
          () => {
            this.timerFailures = 0;
          },
          () => {
            this.timerFailures += 1;
          },
        );
      },
      () => {},
    );
  }

  private commitInfo(
    batch: BatchItem[],
    started: number,
    casAttempts: number,
    outcome: "ok" | "no_write",
    bytes: number,
    applied?: { now: number; outcomes: readonly Outcome[]; expire?: ExpireResult },
  ): CommitInfo {
    const opsByKind: Record<string, number> = {};
    for (const item of batch) {
      const kind = item.kind === "op" ? item.op.kind : "read";
      opsByKind[kind] = (opsByKind[kind] ?? 0) + 1;
    }
    return {
      queue: this.queue,
      shard: this.shard,
      epoch: this.state?.broker?.epoch ?? 0,
      operations: batch.length,
      opsByKind,
      casAttempts,
      outcome,
      documentBytes: bytes,
      durationMs: this.now() - started,
      ...(applied && {
        appliedAt: applied.now,
        applied: appliedOperations(batch, applied.outcomes),
        ...(applied.expire && { expired: applied.expire }),
      }),
    };
  }
}

const MIN_TIMER_MS = 10;

/** Resolves after the current turn of the event loop (not a timer: no clock involved). */
function nextTurn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

function cancelled(): CasqError {
  return new CasqError("cancelled", "the request was cancelled before it was written");
}

function shuttingDown(queue: string, shard: number): CasqError {
  return new CasqError(
    "unavailable",
    `this broker is shutting down and no longer serves shard ${queue}/${shard}; retry, another broker takes over`,
    { queue, shard },
  );
}

/** Turns a store or unknown error into a {@link CasqError}. */
function asCasqError(error: unknown, queue: string, shard: number): CasqError {
  if (isCasqError(error)) return error;
  if (isStoreError(error)) {
    const code = error.kind === "invalid" ? "internal" : "unavailable";
    return new CasqError(code, `object store: ${error.message}`, { queue, shard }, { cause: error });
  }
  return new CasqError(
    "internal",
    error instanceof Error ? error.message : String(error),
    { queue, shard },
    { cause: error },
  );
}

/** The batch's operations that succeeded, each with its result (outcomes are in the order of the batch's operations). */
function appliedOperations(
  batch: readonly BatchItem[],
  outcomes: readonly Outcome[],
): { op: Operation; result: OperationResult }[] {
  const ops = batch.flatMap((item) => (item.kind === "op" ? [item.op] : []));
  return ops.flatMap((op, i) => {
    const outcome = outcomes[i];
    return outcome?.ok ? [{ op, result: outcome.result }] : [];
  });
}
