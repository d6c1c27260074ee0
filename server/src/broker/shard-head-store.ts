/**
 * The CAS loop of one shard's head document: load, write, resolve lost races
 * and ambiguous writes, fence by epoch, take over.
 *
 * The protocol in plain words:
 *
 * 1. **Load.** Read the head and its etag (or, if it does not exist, plan to
 *    create it with put-if-absent). A head that does not parse, has an
 *    unknown format, names another queue or shard than its key, or
 *    references a segment (message, dedup or dead-letter segment) that is
 *    missing or fails its checksum is refused:
 *    every commit gets `data_loss` and nothing is ever written over it. So
 *    is a missing head that `documentExpected` says must exist (its data was
 *    lost): it is not recreated empty behind the operator's back. Observers
 *    hear of a refusal once per reason.
 * 2. **Fence.** A head whose broker record is someone else's live lease is
 *    not ours to write: the commit fails with a redirect to that broker. A
 *    broker takes a shard over (expired or released lease, or a new shard)
 *    only by a write that bumps the epoch (`leadership.ts`). A deposed broker
 *    learns it on its next write: the etag moved, the write fails with 412,
 *    and the re-read shows the new record.
 * 3. **Write.** The caller's `apply` mutates a working copy; if it changed
 *    anything (or the lease needs renewing) the head store stamps the broker
 *    record and a fresh write id, encodes it and writes
 *    `PUT If-Match: <etag>` (`If-None-Match: *` to create).
 * 4. **Lost race.** On 412/409 or an ambiguous write (timeout: it may or
 *    may not have landed) re-read. If one of this commit's write ids is in
 *    the head's write chain, that write landed and its value is the truth
 *    (`write-resolution.ts`); if that cannot be decided the commit fails as
 *    "outcome unknown" and is not applied again; if another broker now holds
 *    a live lease, redirect; otherwise re-apply to the fresh head and try
 *    again — the first few conflicts at once, then with backoff.
 * 5. A write that certainly did not happen (`unavailable`) restores the
 *    in-memory head from the last committed bytes.
 *
 * The shard leader (`shard-leader.ts`) sits on top: group commit, batching,
 * answering callers and timers. This module knows nothing of batches.
 */
import { type Backoff, backoffDelay } from "@casq/sdk/backoff.ts";
import { CasqError, isCasqError } from "../errors.ts";
import { coolable, coolableRefs, coolSegment, warmSegment } from "../model/cold-segments.ts";
import { deadLetterSealCandidates, sealDeadLetterSegment } from "../model/dead-letter-segments.ts";
import type { DedupChunk } from "../model/dedup-chunk.ts";
import { dedupSealCandidates, sealDedupSegment } from "../model/dedup-segments.ts";
import { encodedDedupEntry, encodedTailMessage } from "../model/head-encoder.ts";
import { sealedSegmentRefs, segmentRefOf } from "../model/index-segment-refs.ts";
import {
  INDEX_SEGMENT_SIZE,
  type IndexedEntry,
  indexCandidates,
  sealIndexSegment,
} from "../model/index-segments.ts";
import type { QueueConfig } from "../model/queue-config.ts";
import {
  deadLetterSegmentName,
  dedupSegmentName,
  encodeDeadLetterSegment,
  encodeDedupSegment,
  encodeIndexSegment,
  encodeSegment,
  indexSegmentName,
  segmentEpoch,
  segmentName,
  segmentPrefix,
  sha256Hex,
} from "../model/segment-codec.ts";
import { requireBody, sealCandidates, sealSegment, sealWrittenSegment } from "../model/segment-mechanics.ts";
import { parseShardDocument, type SegmentRef, type ShardDocument } from "../model/shard-document-parser.ts";
import type { SegmentState } from "../model/shard-records.ts";
import {
  type DeadLetterRecord,
  type DedupEntry,
  type MessageMeta,
  type MessageRecord,
  metaOf,
} from "../model/shard-records.ts";
import { type BrokerRecord, checkDocumentPlace, ShardState } from "../model/shard-state.ts";
import type { ObjectStore, PutCondition, StoredObject } from "../store/object-store.ts";
import { isStoreError } from "../store/store-errors.ts";
import type { Clock } from "../util/clock.ts";
import type { Random } from "../util/random.ts";
import { DedupIdPager } from "./dedup-id-pager.ts";
import { type BrokerIdentity, heldByOther, isOwnRecord, needsRenewal, takeoverRecord } from "./leadership.ts";
import { SegmentBodyCache } from "./segment-body-cache.ts";
import { loadSegments } from "./segment-loader.ts";
import { SegmentPager } from "./segment-pager.ts";
import { shardKey } from "./shard-key.ts";
import type { ShardObserver } from "./shard-observer.ts";
import { resolveWrites, type WriteAttempt } from "./write-resolution.ts";
import { type WrittenAhead, writeAhead } from "./written-ahead.ts";

/** How long a shard refused because its head is missing answers so without re-reading (ms). */
export const MISSING_HEAD_RECHECK_MS = 1000;

/** Where the head store stands with its shard. */
export type HeadMode = "unloaded" | "leading" | "following" | "refused";

/** Tuning of the CAS loop. */
export interface HeadStoreOptions {
  /** Leadership lease written into the head. */
  readonly leaseMs: number;
  /** Conflicts retried at once before backing off. */
  readonly immediateConflictRetries: number;
  /** Give up (answering `unavailable`) after this many lost races. */
  readonly maxConflictRetries: number;
  /** Backoff between conflict retries after the immediate ones. */
  readonly conflictBackoff: Backoff;
  /**
   * Once the head's tail of newest messages holds this many bytes, they are
   * written into a segment in the background, and the first commit after
   * that write moves them there (see {@link ShardHeadStore.prepareSegment});
   * a tail twice this size is sealed in the commit itself. The head's dedup
   * ids are written ahead into a dedup segment the same way, past a budget
   * of at most this size (see {@link ShardHeadStore.dedupBudget}); its dead
   * letters are sealed into dead-letter segments in the commit that finds
   * them beyond this size.
   */
  readonly tailBytes: number;
  /**
   * Sealed messages kept in memory (as meta) beyond which the newest sealed
   * segments nothing has touched go cold (`model/cold-segments.ts`): only
   * their index entry stays, and they are read back when claims reach them.
   */
  readonly warmSealedMessages: number;
  /** Bytes of sealed dedup ids kept in memory beyond those a batch needs (see `dedup-id-pager.ts`). */
  readonly residentDedupIdBytes: number;
  /**
   * Segments per index segment: once the head lists more than twice as many
   * segment entries, the entries of this many (those claims reach last) are
   * written ahead into an index segment (`model/index-segments.ts`, see
   * {@link ShardHeadStore.prepareIndex}). Default 64.
   */
  readonly indexSegmentSize?: number | undefined;
}

/**
 * A segment of tail messages written ahead of the head write that will
 * reference it (see {@link ShardHeadStore.prepareSegment}); its contents are
 * the whole records written, ascending offsets.
 */
type PreparedSegment = WrittenAhead<readonly MessageRecord[]>;

/**
 * A dedup segment of the head's dedup ids written ahead of the head write
 * that will reference it (see {@link ShardHeadStore.prepareDedup}); its
 * contents are the entries written, ascending offsets.
 */
type PreparedDedup = WrittenAhead<readonly DedupEntry[]>;

/**
 * The index entries of segments written ahead, in an index segment, of the
 * head write that will reference it (see {@link ShardHeadStore.prepareIndex}).
 */
type PreparedIndex = WrittenAhead<readonly IndexedEntry[]>;

/**
 * The head's own dedup ids are sealed into a dedup segment once they pass a
 * budget between this (bytes: a dedup segment PUT per ~130 ids of 36
 * characters at most) and the tail budget; see {@link ShardHeadStore.dedupBudget}.
 */
const MIN_DEDUP_BUDGET = 16 * 1024;
/** About the bytes of one dedup segment's entry in the head's index. */
const DEDUP_INDEX_ENTRY_BYTES = 230;

/** Untouched sealed segments looked at per commit for cooling, newest first. */
const COOLING_CANDIDATES = 4;

/** Everything a {@link ShardHeadStore} needs. */
export interface ShardHeadStoreParams {
  readonly store: ObjectStore;
  readonly queue: string;
  readonly shard: number;
  readonly identity: BrokerIdentity;
  readonly clock: Clock;
  readonly random: Random;
  readonly options: HeadStoreOptions;
  /** Config of the head when this broker creates it. */
  readonly initialConfig?: Partial<QueueConfig> | undefined;
  readonly observer?: ShardObserver | undefined;
  /** The broker's page cache of segment bodies (default: a cache of this shard's own, of the default size). */
  readonly bodyCache?: SegmentBodyCache | undefined;
  /**
   * Asked when the head does not exist: true when it should (the queue's
   * manifest says the shard was created), which refuses the shard instead of
   * creating it empty; an error it throws (e.g. `not_found`: the queue was
   * deleted) fails the commit and nothing is written. Default: a missing
   * head is a new shard.
   */
  readonly documentExpected?: (() => Promise<boolean>) | undefined;
}

/** What `apply` made of the working copy: the value to hand back, and whether it needs writing. */
export interface AppliedChange<T> {
  readonly value: T;
  readonly changed: boolean;
}

/** How a {@link ShardHeadStore.commit} ended. */
export type HeadCommitResult<T> =
  /** A write carrying `value` landed (possibly found on re-read after a lost answer). */
  | { readonly kind: "written"; readonly value: T; readonly casAttempts: number; readonly bytes: number }
  /** Nothing needed writing; `value` is the answer. */
  | { readonly kind: "no_write"; readonly value: T }
  /** Nothing was (knowingly) written; answer `error`. */
  | { readonly kind: "failed"; readonly error: CasqError };

/** Loads and CAS-writes one shard's head (see the module header). */
export class ShardHeadStore {
  /** The head's key in the store. */
  readonly key: string;

  private readonly store: ObjectStore;
  private readonly queue: string;
  private readonly shard: number;
  private readonly identity: BrokerIdentity;
  private readonly clock: Clock;
  private readonly random: Random;
  private readonly options: HeadStoreOptions;
  private readonly initialConfig: Partial<QueueConfig> | undefined;
  private readonly observer: ShardObserver | undefined;
  private readonly documentExpected: (() => Promise<boolean>) | undefined;

  private headMode: HeadMode = "unloaded";
  /** A commit landed whose write-ahead work ({@link writeAhead}) has not run yet. */
  private aheadDue = false;
  /** The refusal message last reported to observers while refused (so a refusal is reported once per reason). */
  private refusedFor: string | undefined;
  /** A refusal for a missing head and when it was decided: repeated without store reads for
   * {@link MISSING_HEAD_RECHECK_MS}, so a client looping on the shard does not cost two GETs a call. */
  private missingRefusal: { readonly error: CasqError; readonly at: number } | undefined;
  /** The committed head (mutated in place only inside {@link commit}). `undefined` = does not exist yet. */
  private committed: ShardState | undefined;
  /** Commits under way (see {@link committing}). */
  private commitsRunning = 0;
  private etag: string | undefined;
  /** Bytes of the committed version, to rebuild the state cheaply after a failed write. */
  private committedBytes: Uint8Array | undefined;
  /** The broker record seen in the store, kept while following to redirect without a read. */
  private seenRecord: BrokerRecord | undefined;
  /** When `seenRecord` was read. It is trusted for a tenth of a lease: long enough to spare
   * the store a read per redirected request, short enough to notice a graceful release soon. */
  private seenAt = Number.NEGATIVE_INFINITY;
  private writeCounter = 0;
  private segmentCounter = 0;
  /** The meta of the messages of the segments the committed head references (and of ones just sealed), by name. */
  private readonly segments = new Map<string, readonly MessageMeta[]>();
  /** The entries the index segments of the committed head list (and of ones just sealed), by name. */
  private readonly indexSegments = new Map<string, readonly SegmentRef[]>();
  /** Entries of the live dedup segments the committed head references (and of ones just sealed), by name. */
  private readonly dedupSegments = new Map<string, DedupChunk>();
  /** Dead letters of the dead-letter segments the committed head references (and of ones just sealed), by name. */
  private readonly deadLetterSegments = new Map<string, readonly DeadLetterRecord[]>();
  /** Segments warmed since the last cooling pass (which leaves them warm: they were wanted). */
  private readonly justWarmed = new Set<SegmentState>();
  /** Set when a referenced segment was found lost: the next load reads every segment, leaving none cold. */
  private checkEverySegment = false;
  /** Segment deletions in progress (garbage collection never delays a commit), and segments being written ahead. */
  private readonly collecting = new Set<Promise<void>>();
  /** The tail segment being written (or written) ahead of the commit that will reference it. */
  private prepared: PreparedSegment | undefined;
  /** The dedup segment being written (or written) ahead of the commit that will reference it. */
  private preparedDedup: PreparedDedup | undefined;
  /** The index segment being written (or written) ahead of the commit that will reference it. */
  private preparedIndex: PreparedIndex | undefined;

  /** Pages the bodies of this shard's sealed messages in and out (see `segment-pager.ts`). */
  readonly pager: SegmentPager;
  /** Pages the ids of this shard's sealed dedup entries in and out (see `dedup-id-pager.ts`). */
  readonly dedupIds: DedupIdPager;

  constructor(params: ShardHeadStoreParams) {
    this.store = params.store;
    this.queue = params.queue;
    this.shard = params.shard;
    this.key = shardKey(params.queue, params.shard);
    this.identity = params.identity;
    this.clock = params.clock;
    this.random = params.random;
    this.options = params.options;
    this.initialConfig = params.initialConfig;
    this.observer = params.observer;
    this.documentExpected = params.documentExpected;
    this.pager = new SegmentPager({
      store: params.store,
      queue: params.queue,
      shard: params.shard,
      cache: params.bodyCache ?? new SegmentBodyCache(),
      headMoved: this.headMoved,
    });
    this.dedupIds = new DedupIdPager(
      params.store,
      params.queue,
      params.shard,
      params.options.residentDedupIdBytes,
      this.headMoved,
    );
  }

  /** True when the head in the store is no longer the one last loaded or written (a pager's missing segment may be stale). */
  private readonly headMoved = async (): Promise<boolean> =>
    (await this.store.get(this.key))?.etag !== this.etag;

  /** Current mode. */
  get mode(): HeadMode {
    return this.headMode;
  }

  /** The committed state while loaded (the leader reads it between commits). */
  get state(): ShardState | undefined {
    return this.committed;
  }

  /** The broker record last seen in the store (ours while leading). */
  get brokerRecord(): BrokerRecord | undefined {
    return this.headMode === "leading" ? this.committed?.broker : this.seenRecord;
  }

  /**
   * Starts the background writes the last commit made due: a segment of the
   * tail past its budget, a dedup segment, an index segment (see
   * {@link prepareSegment}, {@link prepareDedup}, {@link prepareIndex}). Run by
   * the leader once that commit's answers are out, as encoding and hashing a
   * segment of a few hundred KiB would delay them; run by the next commit
   * at the latest. Only between commits: it reads the committed state.
   */
  writeAhead(): void {
    if (!this.aheadDue) return;
    this.aheadDue = false;
    const state = this.committed;
    if (state === undefined || this.headMode !== "leading") return;
    const now = this.now();
    try {
      this.prepareSegment(state, now);
      this.prepareDedup(state, now);
      this.prepareIndex(state, now);
    } catch {
      // A bug: nothing is written ahead, and the state is rebuilt from what was written (the
      // next commit seals inline if it must), as after index-only work that went wrong.
      this.restoreCommitted();
    }
  }

  /**
   * Applies `apply` to the current head and writes the result by CAS,
   * resolving lost races and ambiguous writes (module header, steps 2–5).
   * `apply` may run several times (once per attempt: the first on the
   * committed state itself, the others on the state re-read after a lost race
   * or rebuilt after a failed write); it must not have effects outside the
   * state it is given. Should it throw (a bug), the committed state is
   * rebuilt from what was written and the error goes on.
   * `release` writes `lease_until = 0` so that another broker takes over at once.
   * `prepare`, when given, runs before each `apply` on the state it will get
   * (e.g. to page in bodies the batch needs); it must not change the state.
   */
  async commit<T>(
    apply: (working: ShardState, now: number) => AppliedChange<T>,
    options: { release: boolean; prepare?: (state: ShardState, now: number) => Promise<void> },
  ): Promise<HeadCommitResult<T>> {
    this.commitsRunning += 1;
    try {
      return await this.commitAttempts(apply, options);
    } finally {
      this.commitsRunning -= 1;
    }
  }

  /**
   * Whether a commit is under way: {@link state} may then hold a batch
   * applied whose write has not landed, and that a failed write takes back.
   */
  get committing(): boolean {
    return this.commitsRunning > 0;
  }

  /** {@link commit}'s attempts. */
  private async commitAttempts<T>(
    apply: (working: ShardState, now: number) => AppliedChange<T>,
    options: { release: boolean; prepare?: (state: ShardState, now: number) => Promise<void> },
  ): Promise<HeadCommitResult<T>> {
    // The last commit's writes ahead, if its leader has not started them yet; none for a
    // release (the next leader seals: they would be orphans).
    if (options.release) this.aheadDue = false;
    else this.writeAhead();
    const attempts = new Map<string, WriteAttempt<T>>();
    let conflicts = 0;
    let justReloaded = false;
    for (;;) {
      if (!justReloaded && (this.headMode !== "leading" || this.committed === undefined)) {
        const problem = await this.ensureLoaded();
        if (problem) return { kind: "failed", error: problem };
      }
      justReloaded = false;
      if (options.prepare !== undefined && this.committed !== undefined) {
        await options.prepare(this.committed, this.now());
        if (this.committed === undefined) continue; // the preparation found the shard lost: load says so
      }
      const now = this.now();
      const existing = this.committed;
      if (existing && heldByOther(existing.broker, this.identity, now)) {
        this.headMode = "following";
        this.seenRecord = existing.broker;
        return { kind: "failed", error: this.redirect(existing.broker) };
      }

      const creating = existing === undefined;
      const working = existing ?? this.created(now);
      const previousRecord = working.broker;
      const takingOver = creating || !isOwnRecord(previousRecord, this.identity);
      const applied = this.restoringOnThrow(() => apply(working, now));
      let changed = creating || takingOver || options.release || applied.changed;
      if (!changed && previousRecord && needsRenewal(previousRecord, now, this.options.leaseMs))
        changed = true;

      if (!changed) {
        this.committed = working;
        this.headMode = "leading";
        return { kind: "no_write", value: applied.value };
      }

      working.broker = takingOver
        ? takeoverRecord(previousRecord, this.identity, now, this.options.leaseMs)
        : {
            ...(previousRecord as BrokerRecord),
            address: this.identity.address,
            leaseUntil: options.release ? 0 : now + this.options.leaseMs,
          };
      const sealed = await this.sealTail(working, now);
      const writeId = `${this.identity.id}.${++this.writeCounter}`;
      const basedOn = creating ? undefined : working.writeId;
      working.recordWrite(writeId);
      const bytes = this.restoringOnThrow(() => working.encode(), sealed);
      const attempt: WriteAttempt<T> = { value: applied.value, basedOn, ambiguous: false };
      attempts.set(writeId, attempt);
      const condition: PutCondition = creating ? { ifAbsent: true } : { ifMatch: this.etag as string };
      try {
        const put = await this.store.put(this.key, bytes, condition);
        this.committed = working;
        this.etag = put.etag;
        this.committedBytes = bytes;
        this.headMode = "leading";
        this.collect(working.takeRetiredSegments());
        try {
          this.coolBeyondBudget(working, now);
        } catch {
          this.restoreCommitted(); // index-only work went wrong: rebuild the state from what was written
        }
        // A released shard is the next leader's to seal: a segment written ahead now would be
        // an orphan (until an epoch after the next one sweeps it).
        this.aheadDue = this.committed !== undefined && !options.release;
        if (takingOver) this.sweepOrphans(working);
        if (takingOver)
          this.observer?.onLeadership?.({
            queue: this.queue,
            shard: this.shard,
            event: "acquired",
            record: working.broker,
          });
        return { kind: "written", value: applied.value, casAttempts: conflicts + 1, bytes: bytes.byteLength };
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
          // The segments it would have referenced never will be: delete them.
          this.collect(sealed);
          this.restoreCommitted();
          return {
            kind: "failed",
            error: this.givingUp(attempts, asCasqError(error, this.queue, this.shard)),
          };
        }
        const fresh = await this.reload();
        // No write of this commit may have landed, and the shard is now refused (or its
        // document was deleted with its queue): say so.
        if (
          (isCasqError(fresh, "data_loss") || isCasqError(fresh, "not_found")) &&
          ![...attempts.values()].some((a) => a.ambiguous)
        )
          return { kind: "failed", error: fresh };
        if (fresh instanceof CasqError) {
          const unknown = new CasqError(
            "unavailable",
            `shard ${this.queue}/${this.shard}: a write may or may not have landed and the store cannot be read to find out (${fresh.message}); retry — use dedup ids to make enqueue retries safe`,
            { queue: this.queue, shard: this.shard },
            { cause: fresh },
          );
          return { kind: "failed", error: unknown };
        }
        const verdict = resolveWrites(
          this.committed?.writeChain() ?? [],
          this.committed?.writeChainComplete() ?? true,
          attempts,
        );
        if (verdict.kind === "landed") {
          // The mode follows the head's broker record (reload set it): a rival may lead by now.
          // (Segments retired by the landed write are left to the next sweep.)
          return {
            kind: "written",
            value: verdict.value,
            casAttempts: conflicts + 1,
            bytes: bytes.byteLength,
          };
        }
        if (verdict.kind === "unknown") {
          return {
            kind: "failed",
            error: new CasqError(
              "unavailable",
              `shard ${this.queue}/${this.shard}: a write may or may not have landed and too many writes followed to find out; retry — use dedup ids to make enqueue retries safe`,
              { queue: this.queue, shard: this.shard },
            ),
          };
        }
        // Not landed (yet). A 412/409 attempt never will: its segments are referenced by no head,
        // now or later. An ambiguous one may still land after this re-read (a PUT the store
        // applies late), so its segments stay; if it never lands, the next takeover's sweep
        // deletes them as orphans of an earlier epoch.
        if (kind !== "ambiguous") this.collect(sealed);
        justReloaded = true;
        conflicts += 1;
        if (conflicts > this.options.maxConflictRetries) {
          return {
            kind: "failed",
            error: this.givingUp(
              attempts,
              new CasqError(
                "unavailable",
                `shard ${this.queue}/${this.shard} lost ${conflicts} write races in a row; is another process writing it? retry later`,
                { queue: this.queue, shard: this.shard },
              ),
            ),
          };
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

  /**
   * The error a commit gives up with: `error`, unless an earlier attempt's
   * write was ambiguous. Judged "not landed yet" (its base was still the
   * newest head), such a write may still land after the commit gives up, so
   * its callers must not be told it did not happen.
   */
  private givingUp<T>(attempts: ReadonlyMap<string, WriteAttempt<T>>, error: CasqError): CasqError {
    if (![...attempts.values()].some((a) => a.ambiguous)) return error;
    return new CasqError(
      "unavailable",
      `shard ${this.queue}/${this.shard}: an earlier write of this batch may or may not have landed, and then: ${error.message}; retry — use dedup ids to make enqueue retries safe`,
      { queue: this.queue, shard: this.shard },
      { cause: error },
    );
  }

  /**
   * Runs `step` of a commit on the working state; when it throws (a bug), the
   * state it may have half changed is rebuilt from what was written, so that
   * the next commit does not write it, and the segments sealed for this
   * attempt (`sealed`) are deleted, before the error goes on.
   */
  private restoringOnThrow<R>(step: () => R, sealed: readonly string[] = []): R {
    try {
      return step();
    } catch (error) {
      this.collect(sealed);
      this.restoreCommitted();
      throw error;
    }
  }

  /** A new shard's state (its bodies looked up in this shard's pager, like every state here). */
  private created(now: number): ShardState {
    const state = ShardState.create({
      queue: this.queue,
      shard: this.shard,
      config: this.initialConfig ?? {},
      now,
    });
    state.bodies = this.pager.lookup;
    return state;
  }

  /**
   * The time in whole milliseconds: the model (and the head) take integer
   * ms, while a clock may return fractions (e.g. a manual clock after a
   * jittered sleep).
   */
  private now(): number {
    return Math.floor(this.clock.now());
  }

  /** Loads the head if needed. Returns the error to fail the commit with, if any. */
  private async ensureLoaded(): Promise<CasqError | undefined> {
    const now = this.now();
    if (
      this.headMode === "refused" &&
      this.missingRefusal !== undefined &&
      now - this.missingRefusal.at < MISSING_HEAD_RECHECK_MS
    )
      return this.missingRefusal.error;
    if (
      this.headMode === "following" &&
      heldByOther(this.seenRecord, this.identity, now) &&
      now - this.seenAt < this.options.leaseMs / 10
    ) {
      return this.redirect(this.seenRecord);
    }
    const result = await this.reload();
    return result instanceof CasqError ? result : undefined;
  }

  /** Re-reads the head from the store into `committed`. */
  private async reload(): Promise<StoredObject | undefined | CasqError> {
    let stored: StoredObject | undefined;
    try {
      stored = await this.store.get(this.key);
    } catch (error) {
      this.committed = undefined;
      this.headMode = "unloaded";
      return asCasqError(error, this.queue, this.shard);
    }
    if (!stored) {
      this.committed = undefined;
      this.etag = undefined;
      this.committedBytes = undefined;
      let expected: boolean;
      try {
        expected = (await this.documentExpected?.()) ?? false;
      } catch (error) {
        this.headMode = "unloaded";
        return asCasqError(error, this.queue, this.shard);
      }
      if (!expected) {
        this.headMode = "unloaded";
        return undefined;
      }
      const refusal = this.refuse(
        new CasqError(
          "data_loss",
          `shard document ${this.key} is missing, but queue ${this.queue} was created with this shard: its messages were lost (deleted by hand, or by a store lifecycle rule?). It will not be recreated empty behind your back: restore it from a backup, or recreate it with \`casq repair ${this.queue} --shard ${this.shard}\`.`,
          { queue: this.queue, shard: this.shard },
        ),
      );
      this.missingRefusal = { error: refusal, at: this.now() };
      return refusal;
    }
    try {
      const doc = parseShardDocument(stored.body);
      const place = { queue: this.queue, shard: this.shard };
      checkDocumentPlace(doc, place); // before its segments: a misplaced head names another shard's
      const now = this.now();
      // Each dedup segment read pages out the ids beyond the budget at once: a takeover of a
      // shard with a busy window never holds all its ids.
      const dedup = {
        cache: this.dedupSegments,
        now,
        loaded: (chunk: DedupChunk) => {
          this.dedupIds.admit(chunk);
          this.dedupIds.trim();
        },
      };
      const loaded = await loadSegments(
        this.store,
        this.key,
        stored.etag,
        doc,
        this.indexSegments,
        this.segments,
        dedup,
        this.deadLetterSegments,
        this.keepMeta,
        this.leftColdAtLoad(doc),
      );
      if (loaded === "moved") return this.reload(); // the head changed while its segments were read
      this.committed = ShardState.fromDocument(doc, {
        expected: place,
        segments: this.lookup,
        indexSegments: this.lookupIndex,
        cold: true,
        dedupSegments: this.lookupDedup,
        deadLetterSegments: this.lookupDead,
        now,
      });
      this.committed.bodies = this.pager.lookup;
      this.checkEverySegment = false;
      this.pruneSegments(doc);
    } catch (error) {
      if (isCasqError(error, "unavailable")) {
        this.committed = undefined;
        this.headMode = "unloaded";
        return error;
      }
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
    this.seenRecord = this.committed.broker;
    this.seenAt = this.now();
    const wasLeading = this.headMode === "leading";
    if (isOwnRecord(this.committed.broker, this.identity)) {
      this.headMode = "leading";
    } else {
      this.headMode = "following";
      if (wasLeading)
        this.observer?.onLeadership?.({
          queue: this.queue,
          shard: this.shard,
          event: "lost",
          record: this.committed.broker,
        });
    }
    return stored;
  }

  /**
   * Refuses the shard when paging found a segment its head references
   * missing or corrupt (`data_loss`); other errors change nothing. The next
   * commit re-reads the head, and is refused while the segment stays bad.
   */
  refuseIfLost(error: unknown): void {
    if (!isCasqError(error, "data_loss") || this.committed === undefined) return;
    this.segments.clear(); // so that the next load reads (and checks) every segment again,
    this.indexSegments.clear(); // index segments included,
    this.checkEverySegment = true; // cold ones included,
    for (const name of [...this.dedupSegments.keys()]) this.forgetDedupChunk(name); // dedup segments too
    this.refuse(error);
  }

  /**
   * Refuses the shard: every commit gets `refusal` until a reload finds a
   * head it can use. Observers hear of it once per distinct reason, not on
   * every request that meets the refused shard again.
   */
  private refuse(refusal: CasqError): CasqError {
    this.missingRefusal = undefined;
    this.committed = undefined;
    this.etag = undefined;
    this.committedBytes = undefined;
    const repeated = this.headMode === "refused" && this.refusedFor === refusal.message;
    this.headMode = "refused";
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

  /** Of a message segment read at load: the meta stays, the bodies go to the page cache (room permitting). */
  private readonly keepMeta = (
    name: string,
    records: readonly MessageRecord[],
    bytes: number,
  ): readonly MessageMeta[] => {
    this.pager.offer(name, records, bytes);
    return records.map(metaOf);
  };

  /** The meta of a segment's messages the head references. */
  private readonly lookup = (ref: SegmentRef): readonly MessageMeta[] | undefined =>
    this.segments.get(ref.name);

  /** The entries an index segment the head references lists. */
  private readonly lookupIndex = (ref: { readonly name: string }): readonly SegmentRef[] | undefined =>
    this.indexSegments.get(ref.name);

  /** The cached entries of a dedup segment the head references (undefined: expired when loaded). */
  private readonly lookupDedup = (ref: { readonly name: string }): DedupChunk | undefined =>
    this.dedupSegments.get(ref.name);

  /** The cached dead letters of a dead-letter segment the head references. */
  private readonly lookupDead = (ref: { readonly name: string }): readonly DeadLetterRecord[] | undefined =>
    this.deadLetterSegments.get(ref.name);

  /**
   * Rebuilds the committed state from the last head written or read (after a
   * write that certainly failed changed the working copy). When the cached
   * segments cannot rebuild it, forgets it instead: the next commit reloads
   * from the store — never a half-applied state.
   */
  private restoreCommitted(): void {
    if (this.committedBytes) {
      try {
        this.committed = ShardState.decode(this.committedBytes, {
          segments: this.lookup,
          indexSegments: this.lookupIndex,
          cold: true,
          dedupSegments: this.lookupDedup,
          deadLetterSegments: this.lookupDead,
        });
        this.committed.bodies = this.pager.lookup;
      } catch {
        this.committed = undefined;
        this.etag = undefined;
        this.committedBytes = undefined;
        this.headMode = "unloaded";
      }
    } else {
      this.committed = undefined;
      this.headMode = "unloaded";
    }
  }

  /**
   * Which segments of `doc` a load leaves cold (read when claims reach them,
   * and checked then): untouched ones beyond the first
   * {@link HeadStoreOptions.warmSealedMessages} sealed messages in offset
   * order — none right after a lost segment was found.
   */
  private leftColdAtLoad(doc: ShardDocument): (ref: SegmentRef) => boolean {
    if (this.checkEverySegment) return () => false;
    let cold: Set<string> | undefined;
    // Decided at the first question, when the loader has read the index segments.
    const decide = (): Set<string> => {
      const mayBeCold = coolableRefs(doc);
      const out = new Set<string>();
      let warm = 0;
      for (const ref of this.allSegmentRefs(doc)) {
        const live = ref.count - ref.gone.length;
        if (!this.segments.has(ref.name) && warm + live > this.options.warmSealedMessages && mayBeCold(ref))
          out.add(ref.name);
        else warm += live;
      }
      return out;
    };
    return (ref) => {
      cold ??= decide();
      return cold.has(ref.name);
    };
  }

  /** Every segment's index entry of `doc`, its index segments' included (those must be cached). */
  private allSegmentRefs(doc: ShardDocument): readonly SegmentRef[] {
    return sealedSegmentRefs(doc, this.lookupIndex, (what) => {
      throw new CasqError("internal", `shard ${this.queue}/${this.shard}: ${what}`);
    });
  }

  /**
   * Warms cold segments of the committed state (reads them back, checked:
   * `data_loss` for a missing or corrupt one, unless the head moved). Call
   * between commits only (the leader does it before a batch).
   */
  async warm(state: ShardState, segments: readonly SegmentState[]): Promise<void> {
    const cold = segments.filter((seg) => seg.cold);
    if (cold.length === 0) return;
    const pages = await this.pager.pageIn(cold);
    if (this.committed !== state) return; // reloaded meanwhile: that state decides for itself
    const now = this.now();
    for (const seg of cold) {
      const records = pages.get(seg.name);
      if (records === undefined || !seg.cold) continue;
      const meta = records.map(metaOf);
      warmSegment(state, seg, meta, now);
      this.segments.set(seg.name, meta);
      this.justWarmed.add(seg);
    }
  }

  /**
   * After a commit landed: while more sealed messages are in memory than
   * {@link HeadStoreOptions.warmSealedMessages}, makes the newest untouched
   * sealed segments cold (a few candidates per commit; index-only).
   */
  private coolBeyondBudget(state: ShardState, now: number): void {
    const justWarmed = new Set(this.justWarmed);
    this.justWarmed.clear();
    let warm = state.messages.size - state.tail.size;
    if (warm <= this.options.warmSealedMessages) return;
    const newestFirst = [...state.segments.values()].reverse();
    let misses = 0;
    for (const seg of newestFirst) {
      if (warm <= this.options.warmSealedMessages || misses >= COOLING_CANDIDATES) return;
      if (seg.cold || justWarmed.has(seg)) continue; // not one warmed for this very batch
      if (!coolable(state, seg)) {
        misses += 1;
        continue;
      }
      warm -= seg.count - seg.gone.size;
      coolSegment(state, seg, now);
      this.segments.delete(seg.name);
    }
  }

  /**
   * Seals the oldest tail messages into segment objects while the tail is
   * over budget. Each segment is written put-if-absent under a unique name
   * BEFORE the head that references it; a segment write that fails leaves
   * its messages in the tail (the head just stays larger until the next
   * commit tries again). Then the same for the head's dedup ids, into one
   * dedup segment, and for its dead letters, into dead-letter segments.
   * Returns the names written, so that a head write that did
   * not land can delete them.
   */
  private async sealTail(working: ShardState, now: number): Promise<string[]> {
    const written: string[] = [];
    const epoch = working.broker?.epoch ?? 0;
    // A tail that outgrew the segment being written ahead waits for it (sealing
    // its messages again here would put one offset in two segments).
    if (this.prepared !== undefined && working.tailBytes > 2 * this.options.tailBytes)
      await this.prepared.written;
    const ahead = this.takePrepared(working, epoch);
    if (ahead !== undefined) written.push(ahead);
    for (;;) {
      // Normally the segment written ahead keeps the tail within twice the budget.
      const candidates =
        this.prepared === undefined ? sealCandidates(working, 2 * this.options.tailBytes) : [];
      if (candidates.length === 0) break;
      const records = candidates.map((m) => requireBody(m.msg)); // the tail holds whole records
      const name = segmentName(records[0]?.offset ?? 0, epoch, this.uniquePart());
      const bytes = encodeSegment(this.queue, this.shard, records, (r) => encodedTailMessage(working, r));
      try {
        await this.store.put(segmentPrefix(this.queue, this.shard) + name, bytes, { ifAbsent: true });
      } catch {
        break; // not sealed this time: the messages stay in the head
      }
      const seg = sealSegment(working, candidates, {
        name,
        bytes: bytes.byteLength,
        sha256: sha256Hex(bytes),
        createdAt: now,
      });
      this.segments.set(name, seg.records);
      this.pager.offerWritten(name, records, bytes.byteLength);
      written.push(name);
    }
    await this.sealDedup(working, now, epoch, written);
    await this.sealDeadLetters(working, now, epoch, written);
    const index = this.takePreparedIndex(working, epoch);
    if (index !== undefined) written.push(index);
    return written;
  }

  /**
   * After a head write landed, with the tail at its budget: writes every
   * tail message (but redriven ones, which stay in the head) into a segment
   * object in the background, put-if-absent, so that the commit that seals
   * them does not wait for that write — a commit then costs one head write
   * even when it seals. {@link takePrepared} puts it into the first commit
   * after the write succeeded. One at a time.
   */
  private prepareSegment(state: ShardState, now: number): void {
    if (this.prepared !== undefined || state.tailBytes < this.options.tailBytes) return;
    const candidates = sealCandidates(state, 0);
    if (candidates.length === 0) return;
    const records = candidates.map((m) => requireBody(m.msg)); // the tail holds whole records
    const epoch = state.broker?.epoch ?? 0;
    const name = segmentName(records[0]?.offset ?? 0, epoch, this.uniquePart());
    const bytes = encodeSegment(this.queue, this.shard, records, (r) => encodedTailMessage(state, r));
    this.prepared = this.startWriteAhead(name, epoch, bytes, records, now);
  }

  /** Starts writing a segment object ahead of the head that will reference it (see `written-ahead.ts`); shard close waits for it. */
  private startWriteAhead<T>(
    name: string,
    epoch: number,
    bytes: Uint8Array,
    contents: T,
    now: number,
  ): WrittenAhead<T> {
    const ahead = writeAhead(this.store, segmentPrefix(this.queue, this.shard) + name, bytes, {
      name,
      epoch,
      contents,
      createdAt: now,
    });
    this.collecting.add(ahead.written);
    void ahead.written.finally(() => this.collecting.delete(ahead.written));
    return ahead;
  }

  /**
   * Seals into `working` the segment written ahead, once its write succeeded
   * (its messages that left the tail meanwhile are `gone` in it); returns its
   * name, or undefined when there is none to take yet. A segment whose write
   * failed, that another epoch wrote, or whose messages all left is deleted:
   * no head references it.
   */
  private takePrepared(working: ShardState, epoch: number): string | undefined {
    const prepared = this.prepared;
    if (prepared === undefined || prepared.outcome === "writing") return undefined;
    this.prepared = undefined;
    const seg =
      prepared.outcome === "written" && prepared.epoch === epoch
        ? sealWrittenSegment(working, prepared.contents, {
            name: prepared.name,
            bytes: prepared.bytes,
            sha256: prepared.sha256,
            createdAt: prepared.createdAt,
          })
        : undefined;
    if (seg === undefined) {
      this.collect([prepared.name]);
      return undefined;
    }
    this.segments.set(prepared.name, seg.records);
    this.pager.offerWritten(prepared.name, prepared.contents, prepared.bytes);
    return prepared.name;
  }

  /**
   * The bytes of dedup ids the head carries before they are sealed. Every
   * commit writes them, while each dedup segment of the window adds an index
   * entry to every head: the head's ids average half the budget `B`, the
   * index holds `sealed / B` entries, so their sum is least at
   * `B = sqrt(2 × entry × sealed)` (`sealed`: the bytes of the live dedup
   * segments, about the window's ids). So a shard with few ids in its window
   * keeps few in its head (at 200 jobs/s, a 10 s burst: 16 KiB, not 256),
   * and one with a busy window seals larger dedup segments (5 min at
   * 200 jobs/s: ~60 KiB; at 2,000 jobs/s: ~190 KiB), within
   * [{@link MIN_DEDUP_BUDGET}, the tail budget].
   */
  private dedupBudget(state: ShardState): number {
    const cap = this.options.tailBytes;
    if (state.recentDedupBytes <= Math.min(cap, MIN_DEDUP_BUDGET)) return cap; // nothing to seal either way
    let sealed = 0;
    for (const seg of state.dedupSegments.values()) sealed += seg.bytes;
    const balanced = Math.sqrt(2 * DEDUP_INDEX_ENTRY_BYTES * sealed);
    return Math.min(cap, Math.max(MIN_DEDUP_BUDGET, balanced));
  }

  /**
   * Seals the head's dedup ids into one dedup segment once they pass the
   * budget (see {@link sealTail}): the one written ahead if it is there
   * (see {@link prepareDedup}); none while it is still being written, unless
   * the ids passed twice the budget (then this waits for it); else, past
   * twice the budget, one written now.
   */
  private async sealDedup(working: ShardState, now: number, epoch: number, written: string[]): Promise<void> {
    const budget = this.dedupBudget(working);
    if (this.preparedDedup !== undefined && working.recentDedupBytes > 2 * budget)
      await this.preparedDedup.written;
    const ahead = this.takePreparedDedup(working, epoch);
    if (ahead !== undefined) written.push(ahead);
    if (this.preparedDedup !== undefined) return;
    // Normally the segment written ahead keeps the ids within twice the budget.
    const entries = dedupSealCandidates(working, 2 * budget);
    if (entries.length === 0) return;
    const name = dedupSegmentName(entries[0]?.offset ?? 0, epoch, this.uniquePart());
    const bytes = encodeDedupSegment(this.queue, this.shard, entries, (e) => encodedDedupEntry(working, e));
    try {
      await this.store.put(segmentPrefix(this.queue, this.shard) + name, bytes, { ifAbsent: true });
    } catch {
      return; // not sealed this time: the ids stay in the head
    }
    const seg = sealDedupSegment(working, entries, {
      name,
      bytes: bytes.byteLength,
      sha256: sha256Hex(bytes),
      createdAt: now,
    });
    if (seg.chunk !== undefined) this.cacheDedupChunk(name, seg.chunk);
    written.push(name);
  }

  /**
   * After a head write landed, with its dedup ids past their budget: writes
   * them into a dedup segment in the background (put-if-absent), so that
   * the commit that seals them does not wait for that write, as
   * {@link prepareSegment} does for the tail. One at a time.
   */
  private prepareDedup(state: ShardState, now: number): void {
    if (this.preparedDedup !== undefined) return;
    const entries = dedupSealCandidates(state, this.dedupBudget(state));
    if (entries.length === 0) return;
    const epoch = state.broker?.epoch ?? 0;
    const name = dedupSegmentName(entries[0]?.offset ?? 0, epoch, this.uniquePart());
    const bytes = encodeDedupSegment(this.queue, this.shard, entries, (e) => encodedDedupEntry(state, e));
    this.preparedDedup = this.startWriteAhead(name, epoch, bytes, entries, now);
  }

  /**
   * Seals into `working` the dedup segment written ahead, once its write
   * succeeded; returns its name, or undefined when there is none to take
   * yet. It is taken only when every entry it holds is still one of the
   * head's own, unchanged (an entry that expired or was replaced since, or
   * the head reloaded after a lost race, would make it remember an id the
   * shard forgot). Otherwise, or when its write failed or another epoch
   * wrote it, it is deleted: no head references it, and the ids stay in the
   * head to be sealed again.
   */
  private takePreparedDedup(working: ShardState, epoch: number): string | undefined {
    const prepared = this.preparedDedup;
    if (prepared === undefined || prepared.outcome === "writing") return undefined;
    this.preparedDedup = undefined;
    const usable =
      prepared.outcome === "written" &&
      prepared.epoch === epoch &&
      prepared.contents.every((e) => working.recentDedup.get(e.dedupId) === e);
    if (!usable) {
      this.collect([prepared.name]);
      return undefined;
    }
    const seg = sealDedupSegment(working, prepared.contents, {
      name: prepared.name,
      bytes: prepared.bytes,
      sha256: prepared.sha256,
      createdAt: prepared.createdAt,
    });
    if (seg.chunk !== undefined) this.cacheDedupChunk(prepared.name, seg.chunk);
    return prepared.name;
  }

  /**
   * After a head write landed, with the head listing more than twice
   * {@link HeadStoreOptions.indexSegmentSize} segment entries: writes the
   * entries of that many of the segments claims reach last into an index
   * segment in the background (put-if-absent), which {@link takePreparedIndex}
   * puts into the first commit after the write succeeded. One at a time.
   */
  private prepareIndex(state: ShardState, now: number): void {
    if (this.preparedIndex !== undefined) return;
    const entries = indexCandidates(state, this.options.indexSegmentSize ?? INDEX_SEGMENT_SIZE);
    if (entries.length === 0) return;
    const epoch = state.broker?.epoch ?? 0;
    const name = indexSegmentName(entries[0]?.segment.first ?? 0, epoch, this.uniquePart());
    const bytes = encodeIndexSegment(
      this.queue,
      this.shard,
      entries.map((e) => e.json),
    );
    this.preparedIndex = this.startWriteAhead(name, epoch, bytes, entries, now);
  }

  /**
   * Puts into `working` the index segment written ahead, once its write
   * succeeded; returns its name, or undefined when there is none to take
   * yet. Taken only when each entry it holds is still the one the head
   * lists (a segment retired, touched or reloaded since makes it stale);
   * otherwise, or when its write failed or another epoch wrote it, it is
   * deleted: no head references it.
   */
  private takePreparedIndex(working: ShardState, epoch: number): string | undefined {
    const prepared = this.preparedIndex;
    if (prepared === undefined || prepared.outcome === "writing") return undefined;
    this.preparedIndex = undefined;
    const idx =
      prepared.outcome === "written" && prepared.epoch === epoch
        ? sealIndexSegment(working, prepared.contents, {
            name: prepared.name,
            bytes: prepared.bytes,
            sha256: prepared.sha256,
            createdAt: prepared.createdAt,
          })
        : undefined;
    if (idx === undefined) {
      this.collect([prepared.name]);
      return undefined;
    }
    this.indexSegments.set(
      prepared.name,
      prepared.contents.map((e) => segmentRefOf(e.segment)),
    );
    return prepared.name;
  }

  /** Keeps the entries of a dedup segment just sealed, its ids as the most recently used. */
  private cacheDedupChunk(name: string, chunk: DedupChunk): void {
    this.dedupSegments.set(name, chunk);
    this.dedupIds.admit(chunk);
  }

  /**
   * Seals the head's dead letters, one dead-letter segment per subscription
   * chosen, once they pass the budget (see {@link sealTail}). A failed write
   * leaves that subscription's dead letters in the head.
   */
  private async sealDeadLetters(
    working: ShardState,
    now: number,
    epoch: number,
    written: string[],
  ): Promise<void> {
    for (const { sub, letters } of deadLetterSealCandidates(working, this.options.tailBytes)) {
      let lowest = Number.POSITIVE_INFINITY;
      for (const dl of letters) lowest = Math.min(lowest, dl.message.offset);
      const name = deadLetterSegmentName(lowest, epoch, this.uniquePart());
      const bytes = encodeDeadLetterSegment(this.queue, this.shard, sub.name, letters);
      try {
        await this.store.put(segmentPrefix(this.queue, this.shard) + name, bytes, { ifAbsent: true });
      } catch {
        return; // not sealed this time: the dead letters stay in the head
      }
      const seg = sealDeadLetterSegment(working, sub, letters, {
        name,
        bytes: bytes.byteLength,
        sha256: sha256Hex(bytes),
        createdAt: now,
      });
      this.deadLetterSegments.set(name, seg.records);
      written.push(name);
    }
  }

  /** A segment name's unique part: a sequence per writer and a random part telling two writers of one epoch apart. */
  private uniquePart(): string {
    return `${(++this.segmentCounter).toString(36)}${Math.floor(this.random.next() * 36 ** 6).toString(36)}`;
  }

  /** Forgets cached segments, index, dedup and dead-letter segments the head `doc` no longer references. */
  private pruneSegments(doc: ShardDocument): void {
    const deadRefs = doc.subscriptions.flatMap((sub) => sub.deadLetterSegments);
    for (const [cache, list] of [
      [this.segments, this.allSegmentRefs(doc)],
      [this.indexSegments, doc.indexSegments],
      [this.dedupSegments, doc.dedupSegments],
      [this.deadLetterSegments, deadRefs],
    ] as const) {
      if (list.length === cache.size) continue;
      const keep = new Set(list.map((ref) => ref.name));
      for (const name of cache.keys())
        if (!keep.has(name)) {
          if (cache === this.dedupSegments) this.forgetDedupChunk(name);
          else cache.delete(name);
          this.pager.forget(name);
        }
    }
  }

  /** Drops the entries of a dedup segment the head no longer references (ids included). */
  private forgetDedupChunk(name: string): void {
    const chunk = this.dedupSegments.get(name);
    if (chunk === undefined) return;
    this.dedupSegments.delete(name);
    this.dedupIds.forget(chunk);
  }

  /**
   * Deletes segment objects no head will reference: retired by a head write
   * that landed, or written for a head write that did not. Runs in the
   * background; a failed delete leaves an orphan for {@link sweepOrphans}.
   */
  private collect(names: readonly string[]): void {
    if (names.length === 0) return;
    const prefix = segmentPrefix(this.queue, this.shard);
    for (const name of names) {
      this.pager.forget(name);
      this.segments.delete(name);
      this.indexSegments.delete(name);
      this.forgetDedupChunk(name);
      this.deadLetterSegments.delete(name);
    }
    const run = Promise.all(names.map((name) => this.store.delete(prefix + name).catch(() => {}))).then(
      () => {},
    );
    this.collecting.add(run);
    void run.finally(() => this.collecting.delete(run));
  }

  /**
   * After a takeover landed: deletes segment objects of EARLIER epochs that
   * the head does not reference — left by a crash between a segment write
   * and its head write, by a head write that failed, or by a retirement whose
   * delete was lost. Safe against a deposed leader: it can no longer land a
   * head (the takeover moved the etag), so an unreferenced segment of an
   * earlier epoch can never become referenced; segments of this epoch and
   * later are never touched here.
   */
  private sweepOrphans(head: ShardState): void {
    const epoch = head.broker?.epoch ?? 0;
    const referenced = new Set(head.segmentNames());
    const prefix = segmentPrefix(this.queue, this.shard);
    const run = this.store
      .list(prefix)
      .then((listed) => {
        const orphans = listed
          .map((entry) => entry.key.slice(prefix.length))
          .filter((name) => {
            const written = segmentEpoch(name);
            return written !== undefined && written < epoch && !referenced.has(name);
          });
        return Promise.all(orphans.map((name) => this.store.delete(prefix + name).catch(() => {})));
      })
      .then(
        () => {},
        () => {},
      );
    this.collecting.add(run);
    void run.finally(() => this.collecting.delete(run));
  }

  /** Waits for background segment deletions (tests, and a graceful stop). */
  async settled(): Promise<void> {
    while (this.collecting.size > 0) await Promise.all([...this.collecting]);
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
}

/** Turns a store or unknown error into a {@link CasqError}. */
export function asCasqError(error: unknown, queue: string, shard: number): CasqError {
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
