/**
 * The Prometheus metrics of one casq broker: its own prom-client
 * {@link Registry} (never the global one, so several servers in one process,
 * and tests, do not share series) and every metric family, all prefixed
 * `casq_`.
 *
 * How the numbers get here:
 * - store calls are counted by a StoreObserver (`store-metrics.ts`) attached
 *   through `InstrumentedStore`;
 * - commits, CAS attempts and leadership changes by a ShardObserver
 *   (`broker-metrics.ts`);
 * - unary RPCs by a Connect interceptor (`rpc-metrics.ts`);
 * - queue state (depth, in flight, oldest age, ...) is not pushed: it is read
 *   at scrape time from the shards this broker leads by a refresher installed
 *   with {@link CasqMetrics.setRefresher}, bounded by a timeout so a scrape
 *   never hangs on a slow store.
 *
 * Label cardinality is bounded by design: labels are queue, shard,
 * subscription, store operation, outcome kinds, operation kinds and RPC
 * method names. Message ids, keys and store keys never become labels.
 */
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from "prom-client";
import { QueueSeries } from "./queue-series.ts";

/** Prefix of every casq metric name. */
export const METRIC_PREFIX = "casq_";

/** Latency buckets (seconds) for store calls, commits and RPCs: 1 ms .. 10 s. */
export const LATENCY_BUCKETS: readonly number[] = [
  0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
];

/** Buckets (seconds) for the time a job is held, claim to ack: 10 ms .. 1 h. */
export const JOB_DURATION_BUCKETS: readonly number[] = [
  0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
];

/** Buckets for the number of operations in one group-commit batch. */
export const BATCH_SIZE_BUCKETS: readonly number[] = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500];

/** Options of {@link createCasqMetrics}. */
export interface CasqMetricsOptions {
  /** Registry to register into. Default: a new one. */
  readonly registry?: Registry;
  /** Also collect prom-client's process metrics (CPU, memory, event loop, GC) as `casq_*`. Default true. */
  readonly defaultMetrics?: boolean;
}

/** Refreshes the scrape-time gauges; see {@link CasqMetrics.setRefresher}. */
export type MetricsRefresher = () => Promise<void>;

/** Every metric family of a broker, plus its registry. */
export class CasqMetrics {
  /** The registry all families below are registered in. */
  readonly registry: Registry;
  /** The per-queue series written outside the scrape-time refresh, so they can be removed with their queue. */
  readonly queueSeries = new QueueSeries();

  // --- object store (one sample per call the InstrumentedStore sees) ---
  /** Store calls by operation and outcome (`ok`, `not_found`, `precondition_failed`, ...). */
  readonly storeOperations: Counter<"op" | "outcome">;
  /** Store call latency by operation. */
  readonly storeOperationDuration: Histogram<"op">;
  /** Bytes sent to (`out`) and received from (`in`) the store. */
  readonly storeBytes: Counter<"op" | "direction">;

  // --- group commit ---
  /** Time of one batch from its start to the landed write (or the no-write decision). */
  readonly commitDuration: Histogram<"queue" | "shard">;
  /** Operations (and reads) per batch. */
  readonly commitBatchOperations: Histogram<"queue" | "shard">;
  /** Finished batches by outcome: `ok` (written) or `no_write`. */
  readonly commits: Counter<"queue" | "shard" | "outcome">;
  /** Failed CAS attempts by the store error kind that ended them. */
  readonly casConflicts: Counter<"queue" | "shard" | "kind">;
  /** Operations committed, by kind (enqueue, claim, ack, nack, heartbeat, ..., read). */
  readonly operations: Counter<"queue" | "kind">;
  /** Operations waiting in a shard's buffer for the next write. */
  readonly pendingOperations: Gauge<"queue" | "shard">;
  /** Size of the last written document. */
  readonly documentBytes: Gauge<"queue" | "shard">;
  /** Bytes of sealed messages' bodies held in the broker's page cache (sampled at scrape time). */
  readonly segmentCacheBytes: Gauge;
  readonly sealedInMemory: Gauge<"queue">;
  readonly coldMessages: Gauge<"queue">;
  /** Segments dropped from the page cache to stay within its budget. */
  readonly segmentCacheEvictions: Counter;

  // --- RPCs ---
  /** Finished unary RPCs by method and gRPC code. */
  readonly rpcRequests: Counter<"method" | "code">;
  /** Unary RPC latency: request in to response out (for writes: until durable). */
  readonly rpcDuration: Histogram<"method">;

  // --- queue state (refreshed at scrape time from led shards) ---
  /** Messages claimable now. */
  readonly queueDepth: Gauge<"queue" | "subscription">;
  /** Messages leased to workers. */
  readonly queueInFlight: Gauge<"queue" | "subscription">;
  /** Messages waiting for run_at or backoff. */
  readonly queueDelayed: Gauge<"queue" | "subscription">;
  /** Dead letters kept. */
  readonly queueDead: Gauge<"queue" | "subscription">;
  /** Age of the oldest unsettled message. */
  readonly queueOldestAge: Gauge<"queue" | "subscription">;
  /** Monotonic document counter: enqueued messages per subscription. */
  readonly enqueued: Counter<"queue" | "subscription">;
  /** Monotonic document counter: acks per subscription. */
  readonly acked: Counter<"queue" | "subscription">;
  /** Monotonic document counter: deliveries per subscription. */
  readonly delivered: Counter<"queue" | "subscription">;
  /** Monotonic document counter: redeliveries (lease expiries + nacks). */
  readonly redeliveries: Counter<"queue" | "subscription">;
  /** Monotonic document counter: messages moved to the dead-letter list. */
  readonly deadLettered: Counter<"queue" | "subscription">;
  /** Offset lag: messages from the lowest unsettled offset to the end of the log, summed over led shards. */
  readonly consumerLag: Gauge<"queue" | "subscription">;

  // --- deliveries and settlements (from the results of committed batches) ---
  /** Leases that ran out (timeouts), by what became of the message: `redelivered` or `dead_lettered`. */
  readonly leaseExpiries: Counter<"queue" | "shard" | "outcome">;
  /** Nacked receipts by outcome: `retry_scheduled`, `released`, `dead_lettered`, `lease_lost`. */
  readonly nacks: Counter<"queue" | "subscription" | "outcome">;
  /** Deliveries of a message that was delivered before (attempt > 1): repeated executions. */
  readonly repeatDeliveries: Counter<"queue" | "subscription">;
  /** Time from a claim to the ack that settled it. */
  readonly claimToAck: Histogram<"queue" | "subscription">;

  // --- workers ---
  /** Open Work streams, per queue and subscription. */
  readonly workerStreamsOpen: Gauge<"queue" | "subscription">;
  /** Distinct worker ids with an open stream. */
  readonly workersActive: Gauge;

  // --- leadership ---
  /** 1 while this broker leads the shard, else 0. */
  readonly shardLeader: Gauge<"queue" | "shard">;
  /** Epoch of the shard's broker record as this broker last saw it. */
  readonly shardEpoch: Gauge<"queue" | "shard">;
  /** Leadership changes seen by this broker. */
  readonly leadershipChanges: Counter<"queue" | "shard" | "event">;

  // --- the metrics endpoint itself ---
  /** Scrapes whose queue-state refresh did not finish in time (gauges may be stale or missing). */
  readonly scrapeRefreshTimeouts: Counter;

  private refresher: MetricsRefresher | undefined;

  constructor(options: CasqMetricsOptions = {}) {
    this.registry = options.registry ?? new Registry();
    const registers = [this.registry];
    const p = METRIC_PREFIX;
    const qs = ["queue", "shard"] as const;
    const qsub = ["queue", "subscription"] as const;

    this.storeOperations = new Counter({
      name: `${p}store_operations_total`,
      help: "Object store calls by operation and outcome (ok, not_found, precondition_failed, conflict, unavailable, ambiguous, invalid, error); every attempt counts",
      labelNames: ["op", "outcome"],
      registers,
    });
    this.storeOperationDuration = new Histogram({
      name: `${p}store_operation_duration_seconds`,
      help: "Latency of object store calls by operation",
      labelNames: ["op"],
      buckets: [...LATENCY_BUCKETS],
      registers,
    });
    this.storeBytes = new Counter({
      name: `${p}store_bytes_total`,
      help: "Bytes sent to (direction=out) and received from (direction=in) the object store",
      labelNames: ["op", "direction"],
      registers,
    });

    this.commitDuration = new Histogram({
      name: `${p}commit_duration_seconds`,
      help: "Duration of one group-commit batch, from taking it off the buffer to the landed CAS write (includes conflict retries; excludes time waiting in the buffer)",
      labelNames: qs,
      buckets: [...LATENCY_BUCKETS],
      registers,
    });
    this.commitBatchOperations = new Histogram({
      name: `${p}commit_batch_operations`,
      help: "Operations (including reads) per group-commit batch",
      labelNames: qs,
      buckets: [...BATCH_SIZE_BUCKETS],
      registers,
    });
    this.commits = new Counter({
      name: `${p}commits_total`,
      help: "Finished group-commit batches by outcome: ok (a CAS write landed) or no_write (nothing changed)",
      labelNames: [...qs, "outcome"],
      registers,
    });
    this.casConflicts = new Counter({
      name: `${p}cas_conflicts_total`,
      help: "Failed CAS writes of shard documents by the error kind that ended them (precondition_failed = lost race, conflict, ambiguous, unavailable, ...)",
      labelNames: [...qs, "kind"],
      registers,
    });
    this.operations = new Counter({
      name: `${p}operations_total`,
      help: "Operations in committed batches by kind (enqueue, claim, ack, nack, heartbeat, expire, read, ...)",
      labelNames: ["queue", "kind"],
      registers,
    });
    this.pendingOperations = new Gauge({
      name: `${p}pending_operations`,
      help: "Operations waiting in a shard's buffer for the next CAS write (sampled at scrape time)",
      labelNames: qs,
      registers,
    });
    this.documentBytes = new Gauge({
      name: `${p}document_bytes`,
      help: "Size in bytes of the last shard document this broker wrote",
      labelNames: qs,
      registers,
    });
    this.segmentCacheBytes = new Gauge({
      name: `${p}segment_cache_bytes`,
      help: "Bytes of sealed messages' bodies in the broker's page cache, all shards (budget: --segment-cache-mib)",
      registers,
    });
    this.sealedInMemory = new Gauge({
      name: `${p}sealed_messages_in_memory`,
      help: "Sealed messages the shards this broker leads hold in memory (budget per shard: --warm-sealed-messages)",
      labelNames: ["queue"],
      registers,
    });
    this.coldMessages = new Gauge({
      name: `${p}cold_messages`,
      help: "Messages of cold segments (only their index entry in memory, read back when claims reach them) in the shards this broker leads",
      labelNames: ["queue"],
      registers,
    });
    this.segmentCacheEvictions = new Counter({
      name: `${p}segment_cache_evictions_total`,
      help: "Segments dropped from the page cache of sealed messages' bodies to stay within its budget",
      registers,
    });

    this.rpcRequests = new Counter({
      name: `${p}rpc_requests_total`,
      help: "Finished unary casq.v1 RPCs by method and gRPC status code",
      labelNames: ["method", "code"],
      registers,
    });
    this.rpcDuration = new Histogram({
      name: `${p}rpc_duration_seconds`,
      help: "Latency of unary casq.v1 RPCs from request to response; for Enqueue/Ack/Nack that is request to durable commit",
      labelNames: ["method"],
      buckets: [...LATENCY_BUCKETS],
      registers,
    });

    const gauge = (name: string, help: string) =>
      new Gauge({ name: `${p}${name}`, help, labelNames: qsub, registers });
    const counter = (name: string, help: string) =>
      new Counter({ name: `${p}${name}`, help, labelNames: qsub, registers });
    this.queueDepth = gauge(
      "queue_depth",
      "Messages claimable now (ready), per subscription, on shards this broker leads",
    );
    this.queueInFlight = gauge("queue_in_flight", "Messages leased to workers, per subscription");
    this.queueDelayed = gauge(
      "queue_delayed",
      "Messages waiting for run_at or nack backoff, per subscription",
    );
    this.queueDead = gauge("queue_dead", "Dead letters kept, per subscription");
    this.queueOldestAge = gauge(
      "queue_oldest_message_age_seconds",
      "Age of the oldest message a subscription has not settled (0 when none)",
    );
    this.enqueued = counter(
      "enqueued_total",
      "Messages enqueued for a subscription (from the shard documents' counters)",
    );
    this.acked = counter(
      "acked_total",
      "Messages acked by a subscription (from the shard documents' counters)",
    );
    this.delivered = counter(
      "delivered_total",
      "Deliveries (claims) to a subscription's workers (from the shard documents' counters)",
    );
    this.redeliveries = counter(
      "redeliveries_total",
      "Failed deliveries given another try: lease expiries and nacks (from the shard documents' counters)",
    );
    this.deadLettered = counter(
      "dead_lettered_total",
      "Messages moved to the dead-letter list (from the shard documents' counters)",
    );

    this.consumerLag = gauge(
      "consumer_lag_messages",
      "Offset lag of a subscription: messages from the lowest offset it has not settled to the end of the log, summed over the shards this broker leads",
    );
    this.leaseExpiries = new Counter({
      name: `${p}lease_expiries_total`,
      help: "Leases that ran out without ack, nack or heartbeat (timeouts), by outcome: redelivered (claimable again) or dead_lettered (no attempts left); nacks are not counted here",
      labelNames: [...qs, "outcome"],
      registers,
    });
    this.nacks = new Counter({
      name: `${p}nacks_total`,
      help: "Nacked deliveries by outcome: retry_scheduled, released (handed back unprocessed), dead_lettered, lease_lost",
      labelNames: [...qsub, "outcome"],
      registers,
    });
    this.repeatDeliveries = counter(
      "repeat_deliveries_total",
      "Deliveries of a message that was delivered before (attempt > 1): repeated executions after a lease expiry, nack or release",
    );
    this.claimToAck = new Histogram({
      name: `${p}claim_to_ack_seconds`,
      help: "Time from a claim to the ack that settled that delivery (how long jobs take, including time in the worker's prefetch buffer)",
      labelNames: qsub,
      buckets: [...JOB_DURATION_BUCKETS],
      registers,
    });

    this.workerStreamsOpen = gauge("worker_streams_open", "Open Work streams, per queue and subscription");
    this.workersActive = new Gauge({
      name: `${p}workers_active`,
      help: "Distinct worker ids with an open Work stream on this broker",
      registers,
    });

    this.shardLeader = new Gauge({
      name: `${p}shard_leader`,
      help: "1 while this broker leads the shard, 0 when it knows the shard but does not lead it",
      labelNames: qs,
      registers,
    });
    this.shardEpoch = new Gauge({
      name: `${p}shard_epoch`,
      help: "Leadership epoch of the shard as this broker last saw it (bumped by every takeover)",
      labelNames: qs,
      registers,
    });
    this.leadershipChanges = new Counter({
      name: `${p}leadership_changes_total`,
      help: "Leadership changes seen by this broker: acquired (took the shard), lost (another broker took it), refused (unreadable document)",
      labelNames: [...qs, "event"],
      registers,
    });
    this.scrapeRefreshTimeouts = new Counter({
      name: `${p}metrics_refresh_timeouts_total`,
      help: "Scrapes whose queue-state refresh did not finish in time (queue gauges may be stale)",
      registers,
    });

    if (options.defaultMetrics ?? true) collectDefaultMetrics({ register: this.registry, prefix: p });
  }

  /** Installs the function that refreshes the scrape-time gauges (queue state, workers, pending ops). */
  setRefresher(refresher: MetricsRefresher | undefined): void {
    this.refresher = refresher;
  }

  /**
   * Refreshes the scrape-time gauges (waiting at most `timeoutMs`; a refresh
   * that takes longer keeps running and is counted in
   * `casq_metrics_refresh_timeouts_total`), then renders the registry in the
   * Prometheus text format.
   */
  async scrape(timeoutMs = 2_000): Promise<string> {
    if (this.refresher) {
      let timer: NodeJS.Timeout | undefined;
      const done = await Promise.race([
        this.refresher().then(
          () => true,
          () => true,
        ),
        new Promise<boolean>((resolve) => {
          timer = setTimeout(() => resolve(false), timeoutMs);
        }),
      ]);
      clearTimeout(timer);
      if (!done) this.scrapeRefreshTimeouts.inc();
    }
    return this.registry.metrics();
  }

  /** Content type of {@link scrape}'s text. */
  get contentType(): string {
    return this.registry.contentType;
  }
}

/** Shard label value. */
export function shardLabel(shard: number): string {
  return String(shard);
}
