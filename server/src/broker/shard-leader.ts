/**
 * One queue shard, led by this broker: group commit over CAS.
 *
 * The protocol in plain words:
 *
 * 1. **Group commit.** Requests are buffered. Exactly one CAS write is in
 *    flight at a time; when it lands, everything buffered meanwhile (up to
 *    `maxBatch` operations) is applied to the in-memory document and written as
 *    the next CAS. A caller's promise settles only after the write that
 *    contains its operation has landed: an "ok" is durable. Operations that
 *    change nothing (a heartbeat inside the persisted lease, a claim that found
 *    nothing) are answered without a write, unless the leadership lease needs
 *    renewing anyway.
 * 2. **The CAS loop** — loading the head, refusing one that cannot be read
 *    (or is missing although the queue's manifest says it exists, see
 *    `documentExpected`), fencing by epoch, taking over, resolving lost races and ambiguous writes
 *    — is `shard-head-store.ts`. This class hands it one batch at a time and
 *    answers the batch's callers with what the write that landed carried.
 * 3. **Timers.** After each batch one timer is armed for the next thing due
 *    (a delayed message, a lease expiry, the leadership renewal); it runs an
 *    empty batch, which sweeps expiries and renews the lease.
 *
 * The in-memory document is mutated in place by each batch; when a write
 * fails the head store rebuilds it from the store (or from the last
 * committed bytes), so a failed batch leaves no trace.
 */
import { type Backoff, backoffCap } from "@casq/sdk/backoff.ts";
import { CasqError } from "../errors.ts";
import { applyOperation } from "../model/apply-operation.ts";
import { INDEX_SEGMENT_SIZE } from "../model/index-segments.ts";
import type { ClaimedMessage, ExpireResult, Operation, OperationResult } from "../model/operations.ts";
import type { QueueConfig } from "../model/queue-config.ts";
import {
  claimPositions,
  coldFront,
  coldFrontOf,
  coldSegmentsOfDeadLetters,
  segmentAfter,
  segmentsNeededBy,
} from "../model/segment-residency.ts";
import type { BrokerRecord, ShardState } from "../model/shard-state.ts";
import { hasRunnable, nextHousekeepingAt, nextWakeAt } from "../model/shard-stats.ts";
import type { ObjectStore } from "../store/object-store.ts";
import { type Clock, TIMER_STOPPED } from "../util/clock.ts";
import type { Random } from "../util/random.ts";
import { DEFAULT_RESIDENT_DEDUP_ID_BYTES, type DedupIdPager } from "./dedup-id-pager.ts";
import type { BrokerIdentity } from "./leadership.ts";
import { operationChangesState } from "./operation-effects.ts";
import type { SegmentBodyCache } from "./segment-body-cache.ts";
import { asCasqError, ShardHeadStore } from "./shard-head-store.ts";
import { shardKey } from "./shard-key.ts";
import type { CommitInfo, ShardObserver } from "./shard-observer.ts";

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
  readonly conflictBackoff: Backoff;
  /** Bytes of newest messages kept in the head before the oldest are sealed into a segment. Default 256 KiB. */
  readonly tailBytes: number;
  /**
   * Sealed messages held in memory (as meta) per shard before the newest
   * untouched segments go cold and are read back when claims reach them
   * (`model/cold-segments.ts`). Default 20,000.
   */
  readonly warmSealedMessages: number;
  /**
   * Bytes of sealed dedup ids kept in memory per shard beyond those a batch
   * needs; the rest are read back from their dedup segments when a lookup
   * needs them (`dedup-id-pager.ts`). Default 2 MiB.
   */
  readonly residentDedupIdBytes: number;
  /**
   * Segments whose index entries go into one index segment once the head
   * lists more than twice as many (`model/index-segments.ts`). Default 64.
   */
  readonly indexSegmentSize: number;
}

/** Defaults for {@link CommitOptions}. */
/** Lease expiries due this soon after a batch starts have their bodies paged in with it (ms). */
const PAGE_IN_SLACK_MS = 1000;

/** Writes at least this slow (ms) that handed out jobs make the next batch gather their settles. */
const GATHER_MIN_WRITE_MS = 20;
/** A gathering waits at most this fraction of the write's latency... */
const GATHER_WRITE_FRACTION = 0.5;
/** ...and at most this long (ms). */
const GATHER_MAX_MS = 50;
/** A gathering ends once settles for this fraction of the jobs handed out are in. */
const GATHER_SETTLED_FRACTION = 0.9;
/** After gatherings that ran out of time with under half their settles, at most this many slow writes in a row skip gathering. */
const GATHER_MAX_SKIPS = 16;
/**
 * Once a gathering's settles are in, a batch of settles only waits at most
 * this fraction of the write's latency (within GATHER_MAX_MS) for the claim
 * the workers' returned credit makes (see ShardLeader.holdSettles).
 */
const CLAIM_HOLD_WRITE_FRACTION = 0.1;

/**
 * A batch of settles only waits at most this long (ms) for an enqueue or a
 * claim to ride with (see ShardLeader.holdSettles): about the gap between
 * jobs at a few hundred jobs a second, a few fast writes.
 */
const SETTLE_HOLD_MS = 5;
/** Weight of the newest fast write in the running write latency (whether writes cost time at all). */
const WRITE_EWMA_WEIGHT = 0.2;

/** Settles awaited after a slow write that handed out jobs (see ShardLeader.gatherSettles). */
interface Gathering {
  /** Receipts of pending acks and nacks that end the gathering. */
  readonly expected: number;
  /** Clock time at which it ends anyway. */
  readonly until: number;
  /** Receipts of acks and nacks pending when the write landed (older than its deliveries). */
  readonly settlesBefore: number;
  done?: () => void;
}

/** Rounds of warming claim fronts before one batch (each warms the cold segments at the fronts). */
const MAX_WARM_ROUNDS = 4;

export const DEFAULT_COMMIT_OPTIONS: CommitOptions = {
  leaseMs: 10_000,
  maxBatch: 1000,
  lingerMs: 0,
  groupCommit: true,
  maxPendingOps: 100_000,
  immediateConflictRetries: 3,
  maxConflictRetries: 50,
  // The immediate retries are counted by `immediateConflictRetries`; backoff starts after them:
  // full jitter (contention is what it spreads best) below caps of 50 ms, doubling, up to 2 s.
  conflictBackoff: { immediateRetries: 0, baseDelayMs: 50, maxDelayMs: 2000, jitter: "full" },
  tailBytes: 256 * 1024,
  warmSealedMessages: 20_000,
  residentDedupIdBytes: DEFAULT_RESIDENT_DEDUP_ID_BYTES,
  indexSegmentSize: INDEX_SEGMENT_SIZE,
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
  /** The broker's page cache of segment bodies, shared by its shards (default: one of this shard's own). */
  readonly bodyCache?: SegmentBodyCache;
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

/**
 * A consumer waiting for messages on this shard (a Work stream with credit
 * and nothing runnable). Its claim rides in the next commit that leaves
 * something runnable for its subscription, so an enqueue and the claim that
 * hands it to a waiting worker are one write instead of two.
 */
export interface StandingClaim {
  readonly subscription: string;
  readonly workerId: string;
  /** Lease TTL; undefined means the queue's. */
  readonly leaseTtlMs: number | undefined;
  /**
   * How many messages the consumer wants now. Shared by its standing claims
   * on every shard and taken synchronously as a commit applies them, so they
   * never claim more than it wants together.
   */
  readonly credit: ClaimCredit;
  /** The messages claimed for it, once their commit is durable (leases may have run out since: check). */
  deliver(messages: readonly ClaimedMessage[]): void;
}

/** A standing claim applied in one commit attempt. */
interface StandingFill {
  readonly claim: StandingClaim;
  readonly messages: readonly ClaimedMessage[];
  /** The claim operation as applied, for the commit observer. */
  readonly applied: AppliedOperation;
}

/**
 * A consumer's credit, shared with the leader: a claim submitted with it
 * claims what it holds when its batch is applied, not when it was submitted
 * (see {@link ShardLeader.submit}). Taken synchronously as the claim applies.
 */
export interface ClaimCredit {
  available: number;
  /**
   * Called when credit a claim took comes back without jobs sent for it (its
   * write failed, or its jobs could not be filled in): a consumer that
   * stopped claiming for want of credit must claim again, or it waits for
   * ever for jobs it will never be sent.
   */
  returned?(): void;
}

/** Gives `n` credit back to its consumer and tells it (see {@link ClaimCredit.returned}). */
export function returnCredit(credit: ClaimCredit, n: number): void {
  if (n <= 0) return;
  credit.available += n;
  credit.returned?.();
}

type Settle<T> = { resolve(value: T): void; reject(error: unknown): void };

type BatchItem =
  | ({
      kind: "op";
      op: Operation;
      signal?: AbortSignal;
      trace?: unknown;
      credit?: ClaimCredit;
    } & Settle<OperationResult>)
  | ({ kind: "read"; read(state: ShardState): unknown } & Settle<unknown>);

/** An operation's outcome; `op` is the operation as applied (a credited claim's `max` is set then). */
type Outcome = { ok: true; op: Operation; result: OperationResult } | { ok: false; error: unknown };

/** Credit a claim took in one commit attempt (given back when the attempt does not count). */
type CreditTaken = { readonly credit: ClaimCredit; readonly n: number };

/** What one attempt at a batch did: the `now` it saw, each operation's outcome, its expiry sweep. */
type AppliedBatch = {
  now: number;
  outcomes: Outcome[];
  expire: ExpireResult;
  /** The standing claims that rode in this attempt, and the credit its claims took (an earlier attempt may be the one that landed). */
  fills: StandingFill[];
  taken: CreditTaken[];
};
type AppliedOperation = { op: Operation; result: OperationResult };

/**
 * Group-commits every operation on one queue shard into CAS writes of its
 * document, and holds (or follows) the shard's leadership.
 */
export class ShardLeader {
  readonly queue: string;
  readonly shard: number;
  readonly key: string;

  private readonly clock: Clock;
  private readonly options: CommitOptions;
  private readonly observer: ShardObserver | undefined;
  /** Telemetry: tracing hook, undefined when tracing is off. */
  private readonly tracing: CommitTracing | undefined;
  /** Telemetry: tracing — what the current batch failed with (for its commit span). */
  private batchFailure: unknown;

  private readonly head: ShardHeadStore;
  private stopped = false;

  private pending: BatchItem[] = [];
  private loop: Promise<void> | undefined;
  /** True while a batch is being committed ({@link commitBatch}). */
  private committing = false;
  /** The turn after a commit's answers, when {@link afterAnswers} runs. */
  private answersOut: Promise<void> | undefined;
  private timer: AbortController | undefined;
  private releaseRequested = false;
  private timerFailures = 0;
  /** Batches in a row whose cold segments could not be warmed (backs the retry timer off). */
  private warmFailures = 0;
  private readonly commitListeners = new Set<(state: ShardState) => void>();
  private readonly standing = new Set<StandingClaim>();
  /** After a slow write that handed out jobs: the settles the next batch waits for (see {@link gatherSettles}). */
  private gathering: Gathering | undefined;
  /** Receipts of the acks and nacks in `pending`. */
  private pendingSettles = 0;
  /** `stop` was called: no more gathering. */
  private stopRequested = false;
  /** Slow writes that skip gathering after the last ran out of time: doubles per miss, 0 after a gathering that got its settles. */
  private gatherSkips = 0;
  /** Slow writes still to skip gathering. */
  private gatherSkipsLeft = 0;
  /** Running latency of fast writes (ms, fractional): settle-only batches are held only when writes cost time. */
  private writeMsAverage = 0;
  /** The last write was slow (gathering's domain): settle-only batches are held only after a gathering got its settles. */
  private lastWriteSlow = false;
  /** Latency of the last write that landed (ms). */
  private lastWriteMs = 0;
  /** Clock time until which the buffered settles are held (see {@link holdSettles}); undefined: not holding. */
  private holdUntil: number | undefined;
  /** Ends the current hold's wait early (something that is not a settle came in). */
  private holdWake: (() => void) | undefined;

  constructor(params: ShardLeaderParams) {
    this.queue = params.queue;
    this.shard = params.shard;
    this.key = shardKey(params.queue, params.shard);
    this.clock = params.clock;
    this.options = { ...DEFAULT_COMMIT_OPTIONS, ...params.options };
    this.observer = params.observer;
    this.head = new ShardHeadStore({
      store: params.store,
      queue: params.queue,
      shard: params.shard,
      identity: params.identity,
      clock: params.clock,
      random: params.random,
      options: this.options,
      initialConfig: params.initialConfig,
      observer: params.observer,
      documentExpected: params.documentExpected,
      bodyCache: params.bodyCache,
    });
    this.tracing = (params.observer as ShardObserverWithTracing | undefined)?.commitTracing; // Telemetry: tracing
  }

  /** Current mode, for stats and tests. */
  get currentMode(): ShardMode {
    return this.stopped ? "stopped" : this.head.mode;
  }

  /** The broker record last seen in the store (ours while leading). */
  get brokerRecord(): BrokerRecord | undefined {
    return this.head.brokerRecord;
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
   *
   * A claim with `credit` claims up to what the credit holds when its batch
   * is applied (its `max` is ignored; it applies after the batch's other
   * operations, so it sees the messages they enqueued), and takes what it
   * claimed from it then: credit a consumer gains while the claim waits for
   * the write in flight rides in the same claim instead of waiting for the
   * next. The
   * credit is given back when the write fails or the claimed bodies cannot
   * be read (the claim then fails).
   */
  submit(op: Operation, options?: { signal?: AbortSignal; credit?: ClaimCredit }): Promise<OperationResult> {
    return new Promise<OperationResult>((resolve, reject) => {
      const refusal = this.admission();
      if (refusal) return reject(refusal);
      if (options?.signal?.aborted) return reject(cancelled());
      const item: BatchItem = { kind: "op", op, resolve, reject };
      if (options?.signal) item.signal = options.signal;
      if (options?.credit && op.kind === "claim") item.credit = options.credit;
      if (this.tracing) item.trace = this.tracing.capture(); // Telemetry: tracing
      this.pending.push(item);
      if (op.kind === "ack" || op.kind === "nack") this.pendingSettles += op.receipts.length;
      if (this.gathering !== undefined) this.gathered();
      if (this.holdWake !== undefined && (!holdable(item) || this.pending.length >= this.options.maxBatch))
        this.holdWake();
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
      this.holdWake?.();
      this.kick();
    });
  }

  /**
   * Whether `subscription` has something runnable in the state this broker
   * holds for the shard now, without waiting for a turn of the commit loop
   * (a hint for a consumer deciding whether to claim, not an answer).
   * Undefined when this broker does not lead the shard with its state
   * loaded (ask by claiming, or {@link read}), and for "nothing" while a
   * commit is under way: the state then holds its batch applied, and a
   * write that fails gives back what that batch claimed without telling
   * anyone (a claim queued behind the commit sees the outcome).
   */
  runnableNow(subscription: string): boolean | undefined {
    const state = this.head.state;
    if (this.stopped || this.head.mode !== "leading" || state === undefined) return undefined;
    if (hasRunnable(state, subscription, this.now())) return true;
    return this.head.committing ? undefined : false;
  }

  /** The config in force on this shard: its loaded state's, or read (loading the shard) when none is loaded. */
  config(): Promise<QueueConfig> {
    const state = this.head.state;
    return state !== undefined ? Promise.resolve(state.config) : this.read((s) => s.config);
  }

  /**
   * Registers a {@link StandingClaim} until the returned function is called
   * (or it was filled once: then it is removed). If something is runnable
   * now, a commit is started to fill it.
   */
  stand(claim: StandingClaim): () => void {
    this.standing.add(claim);
    const state = this.head.state;
    if (state && hasRunnable(state, claim.subscription, this.now()))
      void this.read(() => undefined).catch(() => {});
    return () => this.standing.delete(claim);
  }

  /** How many standing claims wait on this shard (for observation and tests). */
  get standingClaims(): number {
    return this.standing.size;
  }

  /** The sealed dedup ids this shard holds in memory, and the dedup segments read back for them (for observation and tests). */
  get dedupIdStats(): DedupIdPager["stats"] {
    return this.head.dedupIds.stats;
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
    if (this.stopped) return;
    this.releaseRequested = options.release && this.head.mode === "leading";
    this.stopRequested = true;
    this.gathering?.done?.();
    this.holdWake?.();
    this.kick();
    while (this.loop) await this.loop;
    // The loop may have been past its last check of `releaseRequested` when it was set.
    if (this.releaseRequested) {
      this.kick();
      while (this.loop) await this.loop;
    }
    this.stopped = true;
    await this.head.settled();
    this.timer?.abort(TIMER_STOPPED);
    this.timer = undefined;
    this.pendingSettles = 0;
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
    if (this.stopped) return shuttingDown(this.queue, this.shard);
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
      if (this.pending.length > 0 && !this.stopped) this.kick();
    });
  }

  private async runLoop(): Promise<void> {
    while (this.pending.length > 0 || this.releaseRequested) {
      if (this.options.lingerMs > 0 && this.pending.length < this.options.maxBatch)
        await this.clock.sleep(this.options.lingerMs);
      // Let callers answered by the previous write submit their next operation
      // first, so that it joins this batch instead of waiting for the next.
      else {
        const settlesGathered = this.gathering !== undefined && (await this.gatherSettles(this.gathering));
        await nextTurn();
        this.gathering = undefined;
        const hold = this.holdSettles(settlesGathered);
        if (hold === "wait") {
          await this.waitHold();
          continue;
        }
        if (hold === "others") {
          await this.runBatch(this.takeUnheld(), false);
          continue;
        }
      }
      this.gathering = undefined;
      this.holdUntil = undefined;
      const batch = this.takeBatch();
      const release = this.releaseRequested && this.pending.length === 0;
      if (release) this.releaseRequested = false;
      await this.runBatch(batch, release);
    }
    this.armTimer();
  }

  /** Commits one batch inside its commit trace. */
  private async runBatch(batch: BatchItem[], release: boolean): Promise<void> {
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

  /**
   * Whether the buffered operations wait before they are written: acks and
   * nacks alone change nothing anyone waits for but their callers, and on
   * a fast store each would otherwise be a write of its own, keeping the
   * writer busy when the next enqueue or claim comes in (which then waits
   * for it). So a batch of settles only is held, for up to
   * {@link SETTLE_HOLD_MS}, until something else comes in to ride with:
   * "wait". Claims that would find nothing and heartbeats
   * do not end the hold; they are committed on their own at once (usually
   * without a write): "others". "none": take the batch now. Settles are
   * still answered only after their write lands. A stopping shard never
   * holds.
   *
   * After a slow write, settles are held only once a gathering waited for
   * them and they came in (`settlesGathered`), for
   * {@link CLAIM_HOLD_WRITE_FRACTION} of the write: a worker sends its
   * returned credit after the acks of the same jobs, so the claim that
   * credit makes comes in a few ms after them. Taken without it, the batch
   * is a write of acks alone, and the claim waits for the next write (a
   * whole store round trip). A gathering that ran out of time, or none,
   * does not hold.
   */
  private holdSettles(settlesGathered: boolean): "none" | "wait" | "others" {
    const state = this.head.state;
    if (
      (this.lastWriteSlow && !settlesGathered) ||
      this.stopRequested ||
      this.releaseRequested ||
      !this.options.groupCommit ||
      this.head.mode !== "leading" ||
      state === undefined ||
      this.pending.length >= this.options.maxBatch
    )
      return "none";
    const now = this.clock.now();
    if (this.holdUntil === undefined) {
      if (this.lastWriteSlow) {
        this.holdUntil = now + Math.min(GATHER_MAX_MS, this.lastWriteMs * CLAIM_HOLD_WRITE_FRACTION);
      } else {
        // A store that answers at once (a memory store, a test's) gains nothing from fewer writes.
        if (this.writeMsAverage <= 0) return "none";
        this.holdUntil = now + SETTLE_HOLD_MS;
      }
    }
    if (now >= this.holdUntil) return "none";
    const at = Math.floor(now);
    let held = 0;
    let others = 0;
    for (const item of this.pending) {
      if (holdable(item)) held += 1;
      else if (passesHold(item, state, at)) others += 1;
      else return "none";
    }
    if (held === 0) return "none";
    for (const claim of this.standing)
      if (claim.credit.available > 0 && hasRunnable(state, claim.subscription, at)) return "none";
    return others > 0 ? "others" : "wait";
  }

  /** Waits until the hold ends, or something that ends it comes in (see {@link holdSettles}). */
  private async waitHold(): Promise<void> {
    const remaining = (this.holdUntil ?? 0) - this.clock.now();
    if (remaining <= 0) return;
    const timer = new AbortController();
    const woken = new Promise<void>((resolve) => {
      this.holdWake = resolve;
    });
    await Promise.race([woken, this.clock.sleep(remaining, timer.signal).catch(() => {})]);
    timer.abort(TIMER_STOPPED);
    this.holdWake = undefined;
  }

  /** Takes the buffered operations that do not wait with held settles (see {@link holdSettles}). */
  private takeUnheld(): BatchItem[] {
    const batch: BatchItem[] = [];
    const kept: BatchItem[] = [];
    for (const item of this.pending) {
      if (holdable(item)) kept.push(item);
      else if (item.kind === "op" && item.signal?.aborted) item.reject(cancelled());
      else batch.push(item);
    }
    this.pending = kept;
    return batch;
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
      if (next.kind === "op" && (next.op.kind === "ack" || next.op.kind === "nack"))
        this.pendingSettles -= next.op.receipts.length;
      if (next.kind === "op" && next.signal?.aborted) {
        next.reject(cancelled());
        continue;
      }
      batch.push(next);
    }
    return batch;
  }

  /** Applies one batch and writes it through the head store; settles every item. */
  private async commitBatch(batch: BatchItem[], release: boolean): Promise<void> {
    this.committing = true;
    try {
      await this.commitAndSettle(batch, release);
    } finally {
      this.committing = false;
    }
  }

  private async commitAndSettle(batch: BatchItem[], release: boolean): Promise<void> {
    const started = this.now();
    const startedExact = this.clock.now();
    // The standing claims filled by the latest attempt (the head store may
    // apply a batch again after a lost race: the earlier attempt's fills are
    // given back first).
    let fills: StandingFill[] = [];
    // Likewise the credit the batch's credited claims took.
    let taken: CreditTaken[] = [];
    // The consumers are told: an attempt applied again may take less (a standing claim withdrawn
    // meanwhile fills nothing), and a consumer that stopped claiming for want of credit must
    // claim again (telling one whose credit is taken again at once costs it a look).
    const giveBack = () => {
      for (const fill of fills) returnCredit(fill.claim.credit, fill.messages.length);
      for (const t of taken) returnCredit(t.credit, t.n);
    };
    const committing = this.head.commit<AppliedBatch>(
      (working, now) => {
        giveBack();
        fills = [];
        taken = [];
        const expire = applyOperation(working, { kind: "expire" }, now);
        let changed = operationChangesState(expire);
        // Credited claims (Work streams') are applied after the batch's other operations, so
        // that they claim what those made runnable. A stream submits its next claim as soon as
        // a commit answers the last one, usually while the next write is in flight, so it is
        // buffered ahead of the enqueues arriving during that write: in arrival order it would
        // find nothing, and those jobs would wait one more commit (the stream stands a claim
        // only after the empty answer). Every operation of a batch is answered after the same
        // write, so any order among them is one its callers could have seen. Outcomes stay in
        // batch order, as the items are settled.
        const outcomes: Outcome[] = [];
        const applyItem = (item: Extract<BatchItem, { kind: "op" }>, index: number) => {
          try {
            const op = effectiveOp(item);
            const result = op === undefined ? NOTHING_CLAIMED : applyOperation(working, op, now);
            if (operationChangesState(result)) changed = true;
            if (item.credit && result.kind === "claim" && result.messages.length > 0) {
              item.credit.available -= result.messages.length;
              taken.push({ credit: item.credit, n: result.messages.length });
            }
            outcomes[index] = { ok: true, op: op ?? item.op, result };
          } catch (error) {
            outcomes[index] = { ok: false, error };
          }
        };
        const credited: [Extract<BatchItem, { kind: "op" }>, number][] = [];
        let index = 0;
        for (const item of batch) {
          if (item.kind !== "op") continue;
          if (item.credit !== undefined) credited.push([item, index]);
          else applyItem(item, index);
          index += 1;
        }
        for (const [item, at] of credited) applyItem(item, at);
        if (!release) fills = this.fillStanding(working, now);
        if (fills.length > 0) changed = true;
        return { value: { now, outcomes, expire, fills, taken }, changed };
      },
      { release, prepare: (state, now) => this.pageInFor(batch, state, now) },
    );
    const result = await committing.catch((error: unknown) => {
      // A bug threw out of the commit (its state was rebuilt): nothing was sent for the credit taken.
      this.head.pager.unpin();
      giveBack();
      throw error;
    });
    const writeMs = this.now() - started;
    if (result.kind === "written") this.noteWrite(this.clock.now() - startedExact);
    this.head.pager.unpin();
    if (result.kind === "failed") {
      giveBack();
      return this.failBatch(batch, result.error);
    }
    const applied = result.value;
    if (applied.fills !== fills) {
      // An earlier attempt landed (an ambiguous write found applied after a later attempt was
      // made): its leases are what the store holds, so its claims are what is sent and taken.
      giveBack();
      fills = applied.fills;
      taken = applied.taken;
      for (const fill of fills) fill.claim.credit.available -= fill.messages.length;
      for (const t of taken) t.credit.available -= t.n;
    }
    for (const fill of fills) this.standing.delete(fill.claim);
    const unfilled = await this.fillClaimedBodies(applied, fills);
    // The claims failed instead (their leases run out): nothing was sent for that credit.
    if (unfilled !== undefined) for (const t of taken) returnCredit(t.credit, t.n);
    this.settle(batch, applied.outcomes);
    for (const fill of fills)
      if (unfilled === undefined) fill.claim.deliver(fill.messages);
      else returnCredit(fill.claim.credit, fill.messages.length); // nothing sent: the leases run out
    this.afterAnswers();
    if (result.kind === "written" && unfilled === undefined) this.gatherAfter(writeMs, applied, fills);
    this.observer?.onCommit?.(
      result.kind === "written"
        ? this.commitInfo(batch, started, result.casAttempts, "ok", result.bytes, applied)
        : this.commitInfo(batch, started, 0, "no_write", 0, applied),
    );
  }

  /** Tracks the latency of writes that landed (see {@link holdSettles}). */
  private noteWrite(ms: number): void {
    this.lastWriteMs = ms;
    this.lastWriteSlow = ms >= GATHER_MIN_WRITE_MS;
    if (this.lastWriteSlow) return;
    this.writeMsAverage =
      this.writeMsAverage === 0 ? ms : this.writeMsAverage + WRITE_EWMA_WEIGHT * (ms - this.writeMsAverage);
  }

  /**
   * After a slow write that handed out jobs: the next batch waits (a while,
   * see {@link gatherSettles}) for their settles, so that their acks and the
   * claims of the credit they give back ride in one write instead of trailing
   * into the next ones.
   */
  private gatherAfter(writeMs: number, applied: AppliedBatch, fills: readonly StandingFill[]): void {
    if (writeMs < GATHER_MIN_WRITE_MS || this.stopped || this.releaseRequested) return;
    // Only deliveries whose leases still run are sent (and then settled); the others are dropped.
    const now = this.now();
    let handedOut = 0;
    const count = (messages: readonly ClaimedMessage[]) => {
      for (const m of messages) if (m.leaseDeadline > now) handedOut += 1;
    };
    for (const outcome of applied.outcomes)
      if (outcome.ok && outcome.result.kind === "claim") count(outcome.result.messages);
    for (const fill of fills) count(fill.messages);
    if (handedOut === 0) return;
    // Handlers slower than the wait: waiting only delays everyone else's operations.
    if (this.gatherSkipsLeft > 0) {
      this.gatherSkipsLeft -= 1;
      return;
    }
    const waitMs = Math.min(GATHER_MAX_MS, writeMs * GATHER_WRITE_FRACTION);
    this.gathering = {
      expected: Math.ceil(handedOut * GATHER_SETTLED_FRACTION),
      until: now + waitMs,
      settlesBefore: this.pendingSettles,
    };
  }

  /** Counts the settles a gathering waits for, and ends it once they are in (or a batch is full). */
  private gathered(): void {
    const gathering = this.gathering as Gathering;
    if (this.pendingSettles >= gathering.expected || this.pending.length >= this.options.maxBatch)
      gathering.done?.();
  }

  /**
   * Waits until the settles of the jobs the last write handed out are in,
   * or until the gathering's deadline (a fraction of that write's latency,
   * capped): on a slow store, jobs handed out by one write come back acked
   * (with their credit) within a few ms, while the next write takes a whole
   * store round trip. A fast write never gathers. A gathering that runs out
   * of time with fewer than half its settles in makes the next slow writes
   * (1, then 2, 4 … 16 in a row while that repeats) skip it: handlers slower
   * than the wait would only delay everyone else's operations.
   *
   * What it counts is every settle waiting in `pending`, not only those of
   * the deliveries the last write handed out: on a busy shard of a slow
   * store the settles of earlier deliveries that came in during the write
   * often reach `expected` already, and then the gathering ends at once.
   * Counting only the new ones made it really wait, and that was slower
   * (4.4-4.7k against 5.1-5.3k jobs/s at 100 ms PUTs, measured 2026-12-05),
   * so the count stays as it is.
   *
   * Resolves true when it ended with its settles in, some of them new since
   * the write landed: the workers that sent those send their returned credit
   * next (see {@link holdSettles}). Settles pending when the write landed are
   * older ones, whose credit came with them.
   */
  private async gatherSettles(gathering: Gathering): Promise<boolean> {
    if (this.stopRequested) return false;
    const newSettles = () => this.pendingSettles > gathering.settlesBefore;
    if (this.pendingSettles >= gathering.expected) return newSettles();
    const timer = new AbortController();
    const ready = new Promise<void>((resolve) => {
      gathering.done = resolve;
    });
    const remaining = gathering.until - this.now();
    if (remaining <= 0) return false;
    let gathered = false;
    await Promise.race([
      ready.then(() => {
        gathered = true;
      }),
      this.clock.sleep(remaining, timer.signal).catch(() => {}),
    ]);
    timer.abort(TIMER_STOPPED);
    if (this.stopRequested) return false;
    // Most settles in, the rest just late: worth waiting for next time too.
    const worthIt = gathered || this.pendingSettles * 2 >= gathering.expected;
    this.gatherSkips = worthIt ? 0 : Math.min(GATHER_MAX_SKIPS, Math.max(1, this.gatherSkips * 2));
    this.gatherSkipsLeft = this.gatherSkips;
    return gathered && newSettles();
  }

  /**
   * Before a batch applies: reads back the sealed dedup ids its enqueues
   * look up ({@link pageInDedupIds}), warms the cold segments it needs (those at the
   * front of a claim order; every one for a purge or a subscription's
   * deletion; those a redrive's dead letters came from), then pages in (and
   * pins) the bodies its nacks and the lease expiries due by then may
   * dead-letter (a dead letter is a whole copy). A failure is left to the
   * operations: a claim then stops at the cold segment, a purge or a nack
   * answers `unavailable` (retry), an expiry waits for a later sweep.
   */
  private async pageInFor(batch: readonly BatchItem[], state: ShardState, now: number): Promise<void> {
    const ops: Operation[] = [];
    for (const item of batch) if (item.kind === "op") ops.push(effectiveOp(item) ?? item.op);
    await this.pageInDedupIds(ops, state, now);
    if (state.segments.size === 0 || this.head.state !== state) return; // refused meanwhile: the commit reloads
    try {
      if (state.coldSegments.length > 0) await this.warmFor(ops, state, now);
      this.warmFailures = 0;
    } catch (error) {
      this.warmFailures += 1;
      this.head.refuseIfLost(error);
      return;
    }
    const wanted = segmentsNeededBy(state, ops, now, PAGE_IN_SLACK_MS);
    if (wanted.length === 0) return;
    // Pinned until the commit is done (cached ones too), so that no page-in or
    // read-ahead meanwhile evicts one the batch needs.
    await this.head.pager.pageIn(wanted, { pin: true }).catch((error) => this.head.refuseIfLost(error));
  }

  /**
   * Before a batch applies: reads back the sealed dedup ids the batch's
   * enqueues will look up and pages out others beyond the budget
   * (`dedup-id-pager.ts`). A failed read is left to the enqueues that need
   * it (`unavailable`); a lost segment refuses the shard.
   */
  private async pageInDedupIds(ops: readonly Operation[], state: ShardState, now: number): Promise<void> {
    const dedupIds: string[] = [];
    if (state.sealedDedup.size > 0)
      for (const op of ops)
        if (op.kind === "enqueue")
          for (const msg of op.messages) if (typeof msg?.dedupId === "string") dedupIds.push(msg.dedupId);
    await this.head.dedupIds.pageInFor(state, dedupIds, now).catch((error) => this.head.refuseIfLost(error));
  }

  /** Warms the cold segments `ops` need (see {@link pageInFor}). */
  private async warmFor(ops: readonly Operation[], state: ShardState, now: number): Promise<void> {
    const everything = ops.some(
      (op) => op.kind === "deleteSubscription" || (op.kind === "purge" && op.deadLetters !== true),
    );
    if (everything) return this.head.warm(state, [...state.coldSegments]);
    const redriven = coldSegmentsOfDeadLetters(state, ops);
    if (redriven.length > 0) await this.head.warm(state, redriven);
    // The fronts of the claim orders claimed from: warming one may bring the next cold one to a front.
    const { subscriptions, demand } = this.claimDemand(ops);
    if (subscriptions.size === 0) return;
    let warmed = 0;
    for (let round = 0; round < MAX_WARM_ROUNDS; round++) {
      const front = coldFront(state, now, subscriptions);
      if (front.length === 0) break;
      for (const seg of front) warmed += seg.count - seg.gone.size;
      await this.head.warm(state, front);
    }
    // A front was cold, so the claims may run past it: warm the next ones (in
    // offset order, claim order for most queues) up to what they may take.
    for (let round = 0; warmed > 0 && warmed < demand && round < MAX_WARM_ROUNDS; round++) {
      const next = state.coldSegments[0];
      if (next === undefined) break;
      warmed += next.count - next.gone.size;
      await this.head.warm(state, [next]);
    }
  }

  /** The subscriptions the claims of `ops` and the standing claims with credit take from, and how many messages at most. */
  private claimDemand(ops: readonly Operation[]): { subscriptions: Set<string>; demand: number } {
    const subscriptions = new Set<string>();
    let demand = 0;
    for (const op of ops)
      if (op.kind === "claim" && typeof op.max === "number") {
        subscriptions.add(op.subscription);
        demand += op.max;
      }
    for (const claim of this.standing)
      if (claim.credit.available > 0) {
        subscriptions.add(claim.subscription);
        demand += claim.credit.available;
      }
    return { subscriptions, demand };
  }

  /**
   * Fills in the bodies of the messages this commit claimed from paged-out
   * segments. If that fails (the store, or a lost segment), the claims that
   * rode in the commit fail with the error instead (their leases run out
   * and the messages are delivered again); returns that error.
   */
  private async fillClaimedBodies(applied: AppliedBatch, fills: readonly StandingFill[]): Promise<unknown> {
    const state = this.head.state;
    if (state === undefined) return undefined;
    const lists: ClaimedMessage[][] = [];
    for (const outcome of applied.outcomes)
      if (outcome.ok && outcome.result.kind === "claim")
        lists.push(outcome.result.messages as ClaimedMessage[]);
    for (const fill of fills) lists.push(fill.messages as ClaimedMessage[]);
    if (!lists.some((list) => list.some((c) => c.bodyIn !== undefined))) return undefined;
    try {
      for (const list of lists) await this.head.pager.fillClaims(list, state.segments);
      return undefined;
    } catch (error) {
      this.head.refuseIfLost(error);
      const failure = asCasqError(error, this.queue, this.shard);
      applied.outcomes.forEach((outcome, i) => {
        if (outcome.ok && outcome.result.kind === "claim")
          applied.outcomes[i] = { ok: false, error: failure };
      });
      return failure;
    }
  }

  /**
   * Work a commit leaves for later ones, once its answers went out (they are
   * sent from the microtasks that settling the batch queued): the head's
   * writes ahead and the read-ahead of claims. Skipped when another commit
   * started first (its own end schedules them again) or the shard stops.
   */
  private afterAnswers(): void {
    this.answersOut ??= nextTurn().then(() => {
      this.answersOut = undefined;
      if (this.committing || this.stopped) return;
      this.head.writeAhead();
      try {
        this.readAhead();
      } catch (error) {
        this.head.refuseIfLost(error); // as a read ahead that fails later is handled
      }
    });
  }

  /** Starts paging in, in the background, the segments the next claims will read. */
  private readAhead(): void {
    const state = this.head.state;
    if (state === undefined || this.head.mode !== "leading") return;
    const { front, caughtUp } =
      state.segments.size === 0 ? { front: [], caughtUp: true } : claimPositions(state, this.now());
    this.head.pager.readAhead(front, (seg) => segmentAfter(state, seg), caughtUp);
  }

  /** Applies the standing claims that something is runnable for, within their shared credit. */
  private fillStanding(working: ShardState, now: number): StandingFill[] {
    const fills: StandingFill[] = [];
    for (const claim of this.standing) {
      const max = claim.credit.available;
      if (max <= 0 || !hasRunnable(working, claim.subscription, now)) continue;
      const op: Operation = {
        kind: "claim",
        subscription: claim.subscription,
        workerId: claim.workerId,
        max,
        credited: true,
        ...(claim.leaseTtlMs === undefined ? {} : { leaseTtlMs: claim.leaseTtlMs }),
      };
      let result: OperationResult;
      try {
        result = applyOperation(working, op, now);
      } catch {
        continue; // e.g. the subscription was deleted in this batch: the consumer's own claim will say so
      }
      if (result.kind !== "claim" || result.messages.length === 0) continue;
      claim.credit.available -= result.messages.length;
      fills.push({ claim, messages: result.messages, applied: { op, result } });
    }
    return fills;
  }

  private settle(batch: BatchItem[], outcomes: Outcome[]): void {
    let index = 0;
    const state = this.head.state as ShardState;
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

  /** Arms one timer for the next thing due: a delayed message, a lease expiry, or lease renewal. */
  private armTimer(): void {
    this.timer?.abort(TIMER_STOPPED);
    this.timer = undefined;
    const state = this.head.state;
    if (this.head.mode !== "leading" || this.stopped || !state?.broker) return;
    const now = this.now();
    const renewAt = state.broker.leaseUntil - this.options.leaseMs / 2;
    const due = Math.min(
      renewAt,
      nextWakeAt(state, now) ?? Number.POSITIVE_INFINITY,
      nextHousekeepingAt(state) ?? Number.POSITIVE_INFINITY,
      this.standingAtColdFront(state, now) ? now : Number.POSITIVE_INFINITY, // warm it (again)
    );
    const controller = new AbortController();
    this.timer = controller;
    // A floor, and backoff while the store keeps failing, keep the timer from busy-looping.
    const floor = backoffCap(Math.max(this.timerFailures, this.warmFailures) + 1, TIMER_BACKOFF);
    const delay = Math.max(floor, due - now);
    this.clock.sleep(delay, controller.signal).then(
      () => {
        if (this.timer !== controller || this.head.mode !== "leading" || this.stopped) return;
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

  /** True when a standing claim with credit waits on a cold segment at its subscription's front. */
  private standingAtColdFront(state: ShardState, now: number): boolean {
    if (state.coldSegments.length === 0) return false;
    for (const claim of this.standing)
      if (claim.credit.available > 0 && coldFrontOf(state, claim.subscription, now) !== undefined)
        return true;
    return false;
  }

  private commitInfo(
    batch: BatchItem[],
    started: number,
    casAttempts: number,
    outcome: "ok" | "no_write",
    bytes: number,
    applied: AppliedBatch,
  ): CommitInfo {
    const opsByKind: Record<string, number> = {};
    for (const item of batch) {
      const kind = item.kind === "op" ? item.op.kind : "read";
      opsByKind[kind] = (opsByKind[kind] ?? 0) + 1;
    }
    const standing = applied.fills.map((fill) => fill.applied);
    if (standing.length > 0) opsByKind.claim = (opsByKind.claim ?? 0) + standing.length;
    return {
      queue: this.queue,
      shard: this.shard,
      epoch: this.head.state?.broker?.epoch ?? 0,
      operations: batch.length + standing.length,
      opsByKind,
      casAttempts,
      outcome,
      documentBytes: bytes,
      durationMs: this.now() - started,
      appliedAt: applied.now,
      applied: [...appliedOperations(applied.outcomes), ...standing],
      ...(applied.expire && { expired: applied.expire }),
    };
  }
}

const MIN_TIMER_MS = 10;
/** The timer's floor: MIN_TIMER_MS, doubling per failed timer run while the store keeps failing, up to 2 s. */
const TIMER_BACKOFF = { immediateRetries: 0, baseDelayMs: MIN_TIMER_MS, maxDelayMs: 2000 } as const;

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

/** The batch's operations that succeeded, each as applied with its result. */
function appliedOperations(outcomes: readonly Outcome[]): { op: Operation; result: OperationResult }[] {
  return outcomes.flatMap((outcome) => (outcome.ok ? [{ op: outcome.op, result: outcome.result }] : []));
}

/** What a credited claim answers when its credit is used up by the time it applies. */
const NOTHING_CLAIMED: OperationResult = { kind: "claim", messages: [], changed: false };

/**
 * The operation as it applies now: a credited claim claims what its credit
 * holds (undefined when that is nothing); any other operation as submitted.
 */
function effectiveOp(item: Extract<BatchItem, { kind: "op" }>): Operation | undefined {
  if (item.credit === undefined || item.op.kind !== "claim") return item.op;
  const max = Math.floor(item.credit.available);
  return max >= 1 ? { ...item.op, max, credited: true } : undefined;
}

/** An ack or a nack (but a release): held while nothing else is buffered (see ShardLeader.holdSettles). */
function holdable(item: BatchItem): boolean {
  if (item.kind !== "op") return false;
  return item.op.kind === "ack" || (item.op.kind === "nack" && item.op.release !== true);
}

/**
 * A heartbeat, or a claim that would find nothing now: committed at once
 * while settles are held, as they need no write of theirs (acks make nothing
 * runnable, and held nacks are not written yet).
 */
function passesHold(item: BatchItem, state: ShardState, now: number): boolean {
  if (item.kind !== "op") return false;
  if (item.op.kind === "heartbeat") return true;
  if (item.op.kind !== "claim") return false;
  return effectiveOp(item) === undefined || !hasRunnable(state, item.op.subscription, now);
}
