/**
 * Broker metrics, two halves:
 *
 * 1. {@link brokerMetricsObserver}: a {@link ShardObserver} the commit loop
 *    calls after every batch, failed CAS attempt and leadership change. It
 *    feeds the commit histograms, the commit / conflict / operation counters,
 *    the leadership counters and, from the results of the committed
 *    operations, lease expiries, nacks, repeated deliveries and claim-to-ack
 *    times. It only increments and sets numbers: it never blocks the commit
 *    loop.
 * 2. {@link createBrokerRefresher}: the scrape-time refresher. For every
 *    shard this broker has opened it samples the buffer (`pendingCount`),
 *    the leadership mode and epoch, and, for shards it leads, the committed
 *    document's stats via `leader.read(state => computeStats(state, now))`.
 *    A read joins the shard's next batch, so it can wait behind a slow write:
 *    each read is bounded by `readTimeoutMs`, and a shard whose read timed out
 *    keeps its last known stats for this scrape. Series of shards this broker
 *    no longer leads disappear (another broker reports them). It also removes
 *    the series the observer wrote: at once for shards this broker no longer
 *    has open (their queue was deleted), after {@link DEFAULT_STALE_SERIES_MS}
 *    for shards it stopped leading (see `removeGoneSeries`).
 *
 * Queue-state counters (`casq_enqueued_total`, `casq_redeliveries_total`,
 * `casq_dead_lettered_total`, ...) come from the monotonic counters stored in
 * the shard documents. They only grow while a broker leads a shard; when
 * leadership moves, the series moves to the new broker with the same values,
 * which Prometheus' `rate()` handles as a counter reset on this broker.
 */
import type { CommitInfo, ShardObserver } from "../broker/shard-observer.ts";
import type { ExpireResult, Operation, OperationResult } from "../model/operations.ts";
import type { BrokerRecord } from "../model/shard-records.ts";
import type { ShardState } from "../model/shard-state.ts";
import { computeStats, type ShardStats } from "../model/shard-stats.ts";
import type { CasqMetrics } from "./metrics.ts";
import { shardLabel } from "./metrics.ts";

/** A ShardObserver that updates the commit, conflict, operation, settlement and leadership families of `metrics`. */
export function brokerMetricsObserver(metrics: CasqMetrics): ShardObserver {
  const series = metrics.queueSeries;
  return {
    onCommit(info) {
      const labels = { queue: info.queue, shard: shardLabel(info.shard) };
      metrics.commitDuration.observe(
        series.track(metrics.commitDuration, labels),
        Math.max(0, info.durationMs) / 1000,
      );
      metrics.commitBatchOperations.observe(
        series.track(metrics.commitBatchOperations, labels),
        info.operations,
      );
      metrics.commits.inc(series.track(metrics.commits, { ...labels, outcome: info.outcome }));
      for (const [kind, count] of Object.entries(info.opsByKind))
        if (count > 0)
          metrics.operations.inc(series.track(metrics.operations, { queue: info.queue, kind }), count);
      if (info.outcome === "ok" && info.documentBytes > 0)
        metrics.documentBytes.set(series.track(metrics.documentBytes, labels), info.documentBytes);
      if (info.epoch > 0) metrics.shardEpoch.set(labels, info.epoch);
      if (info.expired) countExpiries(metrics, labels, info.expired);
      for (const { op, result } of info.applied ?? []) countSettlement(metrics, info, op, result);
    },
    onCasAttempt(info) {
      metrics.casConflicts.inc(
        series.track(metrics.casConflicts, {
          queue: info.queue,
          shard: shardLabel(info.shard),
          kind: info.outcome,
        }),
      );
    },
    onLeadership(event) {
      const labels = { queue: event.queue, shard: shardLabel(event.shard) };
      metrics.leadershipChanges.inc(
        series.track(metrics.leadershipChanges, { ...labels, event: event.event }),
      );
      metrics.shardLeader.set(labels, event.event === "acquired" ? 1 : 0);
      if (event.record) metrics.shardEpoch.set(labels, event.record.epoch);
      // The document's size is reported by the broker that leads it.
      if (event.event !== "acquired") series.removeShard(event.queue, labels.shard, metrics.documentBytes);
    },
  };
}

/** Lease expiries of one commit's housekeeping sweep. */
function countExpiries(
  metrics: CasqMetrics,
  labels: { queue: string; shard: string },
  expired: ExpireResult,
): void {
  const series = metrics.queueSeries;
  if (expired.redelivered > 0)
    metrics.leaseExpiries.inc(
      series.track(metrics.leaseExpiries, { ...labels, outcome: "redelivered" }),
      expired.redelivered,
    );
  // Expired leases that were not redelivered ran out of attempts.
  const dead = expired.leasesExpired - expired.redelivered;
  if (dead > 0)
    metrics.leaseExpiries.inc(
      series.track(metrics.leaseExpiries, { ...labels, outcome: "dead_lettered" }),
      dead,
    );
}

/** Repeated deliveries, nacks and claim-to-ack times of one committed operation. */
function countSettlement(
  metrics: CasqMetrics,
  info: CommitInfo,
  op: Operation,
  result: OperationResult,
): void {
  const series = metrics.queueSeries;
  if (result.kind === "claim") {
    for (const m of result.messages)
      if (m.attempt > 1)
        metrics.repeatDeliveries.inc(
          series.track(metrics.repeatDeliveries, { queue: info.queue, subscription: m.subscription }),
        );
  } else if (result.kind === "nack" && op.kind === "nack") {
    for (const r of result.results) {
      const outcome = op.release && r.outcome === "retry_scheduled" ? "released" : r.outcome;
      metrics.nacks.inc(
        series.track(metrics.nacks, { queue: info.queue, subscription: op.subscription, outcome }),
      );
    }
  } else if (result.kind === "ack" && op.kind === "ack" && info.appliedAt !== undefined) {
    // Tracked once per ack, not once per message: tracking builds a key of the labels (~4 µs).
    let labels: { queue: string; subscription: string } | undefined;
    for (const r of result.results)
      if (r.outcome === "acked" && r.claimedAt !== undefined) {
        labels ??= series.track(metrics.claimToAck, { queue: info.queue, subscription: op.subscription });
        metrics.claimToAck.observe(labels, Math.max(0, info.appliedAt - r.claimedAt) / 1000);
      }
  }
}

/**
 * How long a broker keeps reporting the counters and histograms of a shard it
 * no longer leads (5 minutes): long enough for any scrape interval to see
 * their last increments, short enough that sums over queues soon drop them.
 */
export const DEFAULT_STALE_SERIES_MS = 5 * 60_000;

/** What the refresher needs of a shard leader (a `ShardLeader` satisfies it). */
export interface LeaderView {
  readonly queue: string;
  readonly shard: number;
  readonly currentMode: string;
  readonly brokerRecord: BrokerRecord | undefined;
  readonly pendingCount: number;
  read<T>(read: (state: ShardState) => T): Promise<T>;
}

/** What the refresher needs of the broker (a `Broker` satisfies it). */
export interface BrokerView {
  openShards(): readonly LeaderView[];
  /** The page cache of segment bodies (optional: a view without one reports nothing for it). */
  segmentCacheStats?(): { readonly bytes: number; readonly evictions: number };
}

/** What the refresher needs of the Work stream registry (a `WorkRegistry` satisfies it). */
export interface WorkView {
  readonly activeWorkers: number;
  streamsBySubscription(): Map<string, number>;
}

/** Options of {@link createBrokerRefresher}. */
export interface BrokerRefresherOptions {
  readonly broker: BrokerView;
  readonly work?: WorkView;
  /** The time for ages (epoch ms). */
  readonly now: () => number;
  /** Longest wait for one shard's stats. Default 1000 ms. */
  readonly readTimeoutMs?: number;
  /** How long the counters of a shard this broker stopped leading stay. Default {@link DEFAULT_STALE_SERIES_MS}. */
  readonly staleSeriesMs?: number;
}

/** Sums per (queue, subscription) across shards. */
interface SubscriptionTotals {
  ready: number;
  inFlight: number;
  delayed: number;
  dead: number;
  oldestAgeMs: number;
  lag: number;
  enqueued: number;
  acked: number;
  delivered: number;
  redelivered: number;
  deadLettered: number;
}

/**
 * Returns the scrape-time refresher (install it with
 * `metrics.setRefresher(...)`); see the module header.
 */
export function createBrokerRefresher(
  metrics: CasqMetrics,
  options: BrokerRefresherOptions,
): () => Promise<void> {
  const readTimeoutMs = options.readTimeoutMs ?? 1_000;
  const staleSeriesMs = options.staleSeriesMs ?? DEFAULT_STALE_SERIES_MS;
  /** Per open shard (`queue/shard`) not led here: since when. */
  const notLeadingSince = new Map<string, number>();
  /** Last stats read per led shard (`queue/shard`), reused when a read times out. */
  const lastStats = new Map<string, ShardStats>();

  /** Evictions already counted into the counter. */
  let evictionsCounted = 0;

  return async () => {
    const cache = options.broker.segmentCacheStats?.();
    if (cache !== undefined) {
      metrics.segmentCacheBytes.set(cache.bytes);
      if (cache.evictions > evictionsCounted)
        metrics.segmentCacheEvictions.inc(cache.evictions - evictionsCounted);
      evictionsCounted = cache.evictions;
    }
    const leaders = options.broker.openShards();
    const now = options.now();
    const leading = leaders.filter((l) => l.currentMode === "leading");
    const fresh = await Promise.all(
      leading.map((leader) =>
        withTimeout(
          leader.read((state) => computeStats(state, now)),
          readTimeoutMs,
        ),
      ),
    );

    const seen = new Set<string>();
    for (const [i, leader] of leading.entries()) {
      const id = `${leader.queue}/${leader.shard}`;
      seen.add(id);
      const stats = fresh[i];
      if (stats !== undefined) lastStats.set(id, stats);
    }
    for (const id of [...lastStats.keys()]) if (!seen.has(id)) lastStats.delete(id);

    removeGoneSeries(metrics, leaders, now, notLeadingSince, staleSeriesMs);

    // Per-shard gauges: every shard this broker knows about.
    metrics.pendingOperations.reset();
    metrics.shardLeader.reset();
    metrics.shardEpoch.reset();
    for (const leader of leaders) {
      const labels = { queue: leader.queue, shard: shardLabel(leader.shard) };
      metrics.pendingOperations.set(labels, leader.pendingCount);
      metrics.shardLeader.set(labels, leader.currentMode === "leading" ? 1 : 0);
      const epoch = leader.brokerRecord?.epoch;
      if (epoch !== undefined) metrics.shardEpoch.set(labels, epoch);
    }

    // Memory of the shards this broker leads, per queue.
    metrics.sealedInMemory.reset();
    metrics.coldMessages.reset();
    const memory = new Map<string, { sealed: number; cold: number }>();
    for (const stats of lastStats.values()) {
      const m = memory.get(stats.queue) ?? { sealed: 0, cold: 0 };
      m.sealed += stats.sealedInMemory;
      m.cold += stats.coldMessages;
      memory.set(stats.queue, m);
    }
    for (const [queue, m] of memory) {
      metrics.sealedInMemory.set({ queue }, m.sealed);
      metrics.coldMessages.set({ queue }, m.cold);
    }

    // Per-subscription state, summed over the shards this broker leads.
    const totals = new Map<string, { queue: string; subscription: string; t: SubscriptionTotals }>();
    for (const stats of lastStats.values()) {
      for (const sub of stats.subscriptions) {
        const key = `${stats.queue}/${sub.name}`;
        let entry = totals.get(key);
        if (!entry) {
          entry = {
            queue: stats.queue,
            subscription: sub.name,
            t: {
              ready: 0,
              inFlight: 0,
              delayed: 0,
              dead: 0,
              oldestAgeMs: 0,
              lag: 0,
              enqueued: 0,
              acked: 0,
              delivered: 0,
              redelivered: 0,
              deadLettered: 0,
            },
          };
          totals.set(key, entry);
        }
        const t = entry.t;
        t.ready += sub.ready;
        t.inFlight += sub.inFlight;
        t.delayed += sub.delayed;
        t.dead += sub.dead;
        t.oldestAgeMs = Math.max(t.oldestAgeMs, sub.oldestUnackedAgeMs ?? 0);
        t.lag += sub.lag;
        t.enqueued += sub.counters.enqueued;
        t.acked += sub.counters.acked;
        t.delivered += sub.counters.delivered;
        t.redelivered += sub.counters.redelivered;
        t.deadLettered += sub.counters.deadLettered;
      }
    }
    const families = [
      metrics.queueDepth,
      metrics.queueInFlight,
      metrics.queueDelayed,
      metrics.queueDead,
      metrics.queueOldestAge,
      metrics.consumerLag,
      metrics.enqueued,
      metrics.acked,
      metrics.delivered,
      metrics.redeliveries,
      metrics.deadLettered,
    ];
    for (const family of families) family.reset();
    for (const { queue, subscription, t } of totals.values()) {
      const labels = { queue, subscription };
      metrics.queueDepth.set(labels, t.ready);
      metrics.queueInFlight.set(labels, t.inFlight);
      metrics.queueDelayed.set(labels, t.delayed);
      metrics.queueDead.set(labels, t.dead);
      metrics.queueOldestAge.set(labels, t.oldestAgeMs / 1000);
      metrics.consumerLag.set(labels, t.lag);
      metrics.enqueued.inc(labels, t.enqueued);
      metrics.acked.inc(labels, t.acked);
      metrics.delivered.inc(labels, t.delivered);
      metrics.redeliveries.inc(labels, t.redelivered);
      metrics.deadLettered.inc(labels, t.deadLettered);
    }

    // Workers.
    if (options.work) {
      metrics.workerStreamsOpen.reset();
      for (const [key, count] of options.work.streamsBySubscription()) {
        const slash = key.indexOf("/");
        metrics.workerStreamsOpen.set(
          { queue: key.slice(0, slash), subscription: key.slice(slash + 1) },
          count,
        );
      }
      metrics.workersActive.set(options.work.activeWorkers);
    }
  };
}

/**
 * Removes the per-queue series this broker should no longer report:
 * - of shards it no longer has open (a shard is dropped only when its queue is
 *   deleted through this broker), at once;
 * - of shards it has not led for `staleMs` (another broker leads them, or the
 *   queue was deleted through another broker): long enough for every scrape to
 *   have seen their last increments;
 * - of queues left with none of their shards open and recently led here;
 * - the document size of every shard it does not lead, at once.
 * `notLeadingSince` remembers, per open shard, since when it is not led here.
 */
function removeGoneSeries(
  metrics: CasqMetrics,
  leaders: readonly LeaderView[],
  now: number,
  notLeadingSince: Map<string, number>,
  staleMs: number,
): void {
  const series = metrics.queueSeries;
  const current = new Set<string>();
  const currentQueues = new Set<string>();
  const open = new Set<string>();
  for (const leader of leaders) {
    const id = `${leader.queue}/${shardLabel(leader.shard)}`;
    open.add(id);
    if (leader.currentMode === "leading") notLeadingSince.delete(id);
    else {
      series.removeShard(leader.queue, shardLabel(leader.shard), metrics.documentBytes);
      if (!notLeadingSince.has(id)) notLeadingSince.set(id, now);
    }
    if (now - (notLeadingSince.get(id) ?? now) < staleMs) {
      current.add(id);
      currentQueues.add(leader.queue);
    }
  }
  for (const id of [...notLeadingSince.keys()]) if (!open.has(id)) notLeadingSince.delete(id);
  for (const queue of series.queues()) {
    if (!currentQueues.has(queue)) {
      series.removeQueue(queue);
      continue;
    }
    for (const shard of series.shards(queue))
      if (!current.has(`${queue}/${shard}`)) series.removeShard(queue, shard);
  }
}

/** Resolves with the value, or undefined when it fails or takes longer than `ms`. */
async function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const result = await Promise.race([
    promise.catch(() => undefined),
    new Promise<undefined>((resolve) => {
      timer = setTimeout(() => resolve(undefined), ms);
    }),
  ]);
  clearTimeout(timer);
  return result;
}

/** One ShardObserver that forwards every callback to each of `observers`, in order. */
export function combineShardObservers(...observers: readonly (ShardObserver | undefined)[]): ShardObserver {
  const list = observers.filter((o): o is ShardObserver => o !== undefined);
  return {
    onCommit(info) {
      for (const o of list) o.onCommit?.(info);
    },
    onCasAttempt(info) {
      for (const o of list) o.onCasAttempt?.(info);
    },
    onLeadership(event) {
      for (const o of list) o.onLeadership?.(event);
    },
  };
}
