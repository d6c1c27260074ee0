/**
 * The per-queue series a broker has written, so that they can be removed.
 *
 * prom-client keeps a series until it is removed by its exact label set, and
 * counters and histograms written by the commit observer are never reset at
 * scrape time. Without this index a deleted queue would keep its
 * `casq_commits_total`, `casq_document_bytes`, ... series until the process
 * restarts, and sums over queues would be wrong. Every write of a series
 * labelled with a queue goes through {@link QueueSeries.track}; the scrape-time
 * refresher calls {@link QueueSeries.removeShard} / {@link QueueSeries.removeQueue}
 * for shards and queues this broker no longer serves.
 */

/** A prom-client family (Counter, Gauge or Histogram) a series can be removed from. */
export interface RemovableFamily {
  remove(labels: Record<string, string>): void;
}

/** Labels of a per-queue series: always `queue`, `shard` when the family is per shard. */
export type QueueLabels = Readonly<Record<string, string>> & {
  readonly queue: string;
  readonly shard?: string;
};

/** Index of the label sets written per queue and family (see the module header). */
export class QueueSeries {
  /** queue -> family -> label-set key -> labels. */
  private readonly byQueue = new Map<string, Map<RemovableFamily, Map<string, QueueLabels>>>();

  /** Records that `family` has a series with `labels`; returns `labels` for chaining into the write. */
  track<L extends QueueLabels>(family: RemovableFamily, labels: L): L {
    let families = this.byQueue.get(labels.queue);
    if (!families) {
      families = new Map();
      this.byQueue.set(labels.queue, families);
    }
    let sets = families.get(family);
    if (!sets) {
      sets = new Map();
      families.set(family, sets);
    }
    const key = labelKey(labels);
    if (!sets.has(key)) sets.set(key, labels);
    return labels;
  }

  /** Queues with at least one tracked series. */
  queues(): string[] {
    return [...this.byQueue.keys()];
  }

  /** Shards (as label values) of `queue` with at least one tracked per-shard series. */
  shards(queue: string): string[] {
    const shards = new Set<string>();
    for (const sets of this.byQueue.get(queue)?.values() ?? [])
      for (const labels of sets.values()) if (labels.shard !== undefined) shards.add(labels.shard);
    return [...shards];
  }

  /** Removes the series of one shard of `queue` in `family` (or in every family). */
  removeShard(queue: string, shard: string, family?: RemovableFamily): void {
    this.removeWhere(queue, (labels) => labels.shard === shard, family);
  }

  /** Removes every tracked series of `queue`. */
  removeQueue(queue: string): void {
    this.removeWhere(queue, () => true);
    this.byQueue.delete(queue);
  }

  private removeWhere(queue: string, match: (labels: QueueLabels) => boolean, only?: RemovableFamily): void {
    const families = this.byQueue.get(queue);
    if (!families) return;
    for (const [family, sets] of families) {
      if (only !== undefined && family !== only) continue;
      for (const [key, labels] of sets) {
        if (!match(labels)) continue;
        family.remove({ ...labels });
        sets.delete(key);
      }
      if (sets.size === 0) families.delete(family);
    }
    if (families.size === 0) this.byQueue.delete(queue);
  }
}

/** A key that is equal for equal label sets, whatever the order of their keys. */
function labelKey(labels: Readonly<Record<string, string>>): string {
  return JSON.stringify(
    Object.keys(labels)
      .sort()
      .map((k) => [k, labels[k]]),
  );
}
