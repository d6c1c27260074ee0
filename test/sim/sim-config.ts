/**
 * The knobs of one simulated run, drawn from its seed: how many brokers,
 * shards, producers and workers, how long the chaos lasts, and how hostile
 * the store links are. Seeds differ not only in the order of events but in
 * the kind of world they simulate (calm or stormy links, with or without a
 * retrying store, one to three shards), so a few hundred seeds cover a lot
 * of ground.
 */
import { DEFAULT_RESIDENT_DEDUP_ID_BYTES } from "../../server/src/broker/dedup-id-pager.ts";
import { INDEX_SEGMENT_SIZE } from "../../server/src/model/index-segments.ts";
import type { QueueConfig } from "../../server/src/model/queue-config.ts";
import type { SimRandom } from "./sim-random.ts";

/** Fault rates of a broker's link to the store while faults are on (per call). */
export interface LinkFaultRates {
  readonly unavailable: number;
  readonly timeoutBeforeSend: number;
  /** Puts only (S3 409). */
  readonly conflict: number;
  /** Puts only: the write lands, the answer is lost. */
  readonly ambiguousApplied: number;
  /** Puts only: the request is lost, nothing lands. */
  readonly ambiguousNotApplied: number;
  /**
   * Puts and deletes: the caller hears "ambiguous", the request lands (or is
   * refused by its condition) up to 2 s later, after the caller's next
   * writes. Only in runs with {@link SimConfig.lateLanding}.
   */
  readonly ambiguousLate: number;
  /** A slow call (0.5-2.5 s). */
  readonly delay: number;
}

/** Everything that shapes one run. */
export interface SimConfig {
  readonly seed: number;
  readonly queue: string;
  /** The second subscription, created before anything is enqueued (fan-out). */
  readonly subscriptions: readonly string[];
  readonly shards: number;
  /** Broker slots (machines); each has its own link to the store. */
  readonly brokers: number;
  readonly producers: number;
  /** Workers per subscription. */
  readonly workersPerSubscription: number;
  /** Virtual ms of chaos (producers, faults, crashes); then a quiet drain. */
  readonly chaosMs: number;
  /** Longest virtual drain before the run is declared stuck. */
  readonly maxDrainMs: number;
  /** Mean virtual ms between two enqueues of one producer. */
  readonly enqueueGapMs: number;
  /** Wrap each link in a RetryingStore. */
  readonly retryingStore: boolean;
  readonly faults: LinkFaultRates;
  /** Mean virtual ms between two nemesis events (crash, stop, partition, storm). */
  readonly nemesisGapMs: number;
  /** Leadership lease (broker commit option). */
  readonly leadershipLeaseMs: number;
  /** Other commit-loop options: small batches, linger, or one CAS per operation. */
  readonly commit: {
    readonly maxBatch: number;
    readonly lingerMs: number;
    readonly groupCommit: boolean;
    /** Head tail budget: small values seal segments every few messages (segment writes, GC, takeovers reading segments). */
    readonly tailBytes: number;
  };
  /** Queue config written into the documents. */
  readonly queueConfig: Partial<QueueConfig> & { readonly leaseTtlMs: number; readonly maxAttempts: number };
  /** ManualClock settle turns after each timer (see `run-simulation.ts`). */
  readonly settleTurns: number;
  /**
   * Workers that are the real TypeScript SDK `Worker` over the brokers' real
   * service handlers (`sdk-worker.ts`): none, some beside the direct worker
   * actors, or only SDK workers.
   */
  readonly sdkWorkers: SdkWorkerMode;
  /**
   * Each broker's page cache of segment bodies (bytes): often a few KiB, so
   * sealed messages' bodies are evicted while claims, nacks and expiries run
   * and must be read back from their segments through the faulty link.
   */
  readonly segmentCacheBytes: number;
  /**
   * Sealed messages a leader keeps in memory per shard (commit option): often
   * a few dozen, so untouched segments go cold and are warmed back (read
   * through the faulty link) when claims reach them, redrives or purges need them.
   */
  readonly warmSealedMessages: number;
  /**
   * Whether the links land some ambiguous writes late
   * ({@link LinkFaultRates.ambiguousLate}): half the runs. Drawn last, so that
   * runs without it (and the regression seeds, which set it off) are the
   * worlds they were before it existed.
   */
  readonly lateLanding: boolean;
  /**
   * Bytes of sealed dedup ids a leader keeps in memory per shard (commit
   * option): in half the runs at most a few hundred, so that the
   * ids of most dedup segments are paged out and read back (through the
   * faulty link) when a producer's resend looks one up. Drawn after
   * {@link lateLanding}, for the same reason.
   */
  readonly residentDedupIdBytes: number;
  /**
   * Segments per index segment (commit option): in half the runs 1 or 2,
   * so that a backlog of a few dozen segments has its entries moved into
   * index segments (written through the faulty link, read back by every
   * takeover) and dissolved again as claims reach them. Drawn after
   * {@link residentDedupIdBytes}, for the same reason.
   */
  readonly indexSegmentSize: number;
}

/** Whether a run has SDK workers (see {@link SimConfig.sdkWorkers}). */
export type SdkWorkerMode = "off" | "beside" | "instead";

/** Optional overrides, e.g. for a focused test. */
export type SimConfigOverrides = Partial<Omit<SimConfig, "seed">>;

/** Draws a config for `seed` from `random` (the run's config stream). */
export function drawConfig(seed: number, random: SimRandom, overrides: SimConfigOverrides = {}): SimConfig {
  const stormy = random.chance(0.3);
  const scale = stormy ? 2.5 : random.uniform(0.3, 1.2);
  const faults: LinkFaultRates = {
    unavailable: 0.02 * scale,
    timeoutBeforeSend: 0.01 * scale,
    conflict: 0.01 * scale,
    ambiguousApplied: 0.02 * scale,
    ambiguousNotApplied: 0.015 * scale,
    ambiguousLate: 0.01 * scale,
    delay: 0.01 * scale,
  };
  const config: SimConfig = {
    seed,
    queue: "jobs",
    subscriptions: ["default", "audit"],
    shards: random.int(1, 3),
    brokers: random.chance(0.25) ? 3 : 2,
    producers: 2,
    workersPerSubscription: random.int(2, 3),
    chaosMs: random.int(30_000, 50_000),
    maxDrainMs: 180_000,
    enqueueGapMs: random.int(700, 1_400),
    retryingStore: random.chance(0.5),
    faults,
    nemesisGapMs: random.int(4_000, 9_000),
    leadershipLeaseMs: 3_000,
    commit: {
      maxBatch: random.chance(0.2) ? random.int(1, 4) : 1000,
      lingerMs: random.chance(0.2) ? random.int(1, 20) : 0,
      groupCommit: !random.chance(0.1),
      tailBytes: random.chance(0.6) ? random.int(300, 4_000) : 512 * 1024,
    },
    queueConfig: {
      leaseTtlMs: 3_000,
      maxAttempts: random.int(3, 5),
      backoff: { initialMs: 200, multiplier: 2, maxMs: 2_000, jitter: 0.2 },
      dedupWindowMs: random.chance(0.2) ? random.int(2_000, 10_000) : 120_000,
      retentionMs: random.chance(0.2) ? random.int(1_000, 10_000) : 0,
    },
    settleTurns: 3,
    // Drawn last, so that the draws above (and so the worlds of runs without SDK workers) stay as they were.
    sdkWorkers: random.weighted<SdkWorkerMode>({ off: 70, beside: 15, instead: 15 }),
    segmentCacheBytes: random.chance(0.5) ? random.int(1, 8_192) : 64 * 1024 * 1024,
    warmSealedMessages: random.chance(0.5) ? random.int(0, 40) : 20_000,
    lateLanding: random.chance(0.5),
    residentDedupIdBytes: random.chance(0.5) ? random.int(0, 600) : DEFAULT_RESIDENT_DEDUP_ID_BYTES,
    indexSegmentSize: random.chance(0.5) ? random.int(1, 2) : INDEX_SEGMENT_SIZE,
  };
  return { ...config, ...overrides };
}
