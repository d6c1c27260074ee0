/**
 * The broker's page cache of segment bodies: the whole records of sealed
 * message segments, for every shard this broker leads, within one memory
 * budget (`casq serve --segment-cache-mib`).
 *
 * A sealed message is held by its shard as meta only (`model/shard-records.ts`);
 * its payload, headers and trace context are read from its segment object
 * when a claim, a dead letter or a read needs them. This cache keeps the
 * segments read (or just written, while the backlog ahead of them fits: see
 * `SegmentPager.offerWritten`) most recently used, least recently used
 * evicted first, sized by each segment object's bytes (a close estimate of
 * the records' memory). Losing an entry costs one GET later, never data:
 * segments are immutable.
 *
 * Shared by the shard pagers (`segment-pager.ts`) of one broker; keys are the
 * segment's full store key, so shards never collide.
 */
import type { MessageRecord } from "../model/shard-records.ts";

/**
 * Default budget of {@link SegmentBodyCache} (and of `--segment-cache-mib`):
 * 32 MiB. Each shard's read-ahead holds up to 4 MiB (`segment-pager.ts`), so
 * this keeps the read-ahead of 8 busy shard subscriptions; a broker leading
 * more should be given ~4 MiB more for each. One shard at a 1M backlog
 * claimed as fast with 32 MiB as with 64 (no more GETs), and the broker's
 * resident memory was ~35 MiB lower (docs/operations.md, "Memory").
 */
export const DEFAULT_SEGMENT_CACHE_BYTES = 32 * 1024 * 1024;

interface Entry {
  /** Ascending offsets. */
  readonly records: readonly MessageRecord[];
  readonly bytes: number;
}

/** Counters of a {@link SegmentBodyCache}, for metrics and tests. */
export interface SegmentBodyCacheStats {
  readonly segments: number;
  readonly bytes: number;
  readonly budgetBytes: number;
  /** Segments dropped to stay within the budget, since start. */
  readonly evictions: number;
}

/** A least-recently-used cache of segment bodies within a byte budget (see module header). */
export class SegmentBodyCache {
  /** Insertion order is recency order: a hit moves its entry to the end. */
  private readonly entries = new Map<string, Entry>();
  private used = 0;
  private evictions = 0;

  /** @param budgetBytes Most bytes held (at least one segment is always kept while in use). */
  constructor(readonly budgetBytes: number = DEFAULT_SEGMENT_CACHE_BYTES) {}

  /** True when the segment at `key` is cached (does not count as a use). */
  has(key: string): boolean {
    return this.entries.has(key);
  }

  /** The whole record at `offset` of the segment at `key`, or undefined when that segment is not cached. */
  get(key: string, offset: number): MessageRecord | undefined {
    return findRecord(this.records(key), offset);
  }

  /** All records of the segment at `key` (ascending offsets), or undefined when it is not cached. */
  records(key: string): readonly MessageRecord[] | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    this.entries.delete(key);
    this.entries.set(key, entry);
    return entry.records;
  }

  /**
   * Caches `records` (ascending offsets) of the segment at `key`, whose
   * object has `bytes` bytes, evicting the least recently used segments
   * beyond the budget. With `onlyIfRoom`, caches only when that evicts
   * nothing (for segments merely written, which may not be needed soon).
   */
  put(key: string, records: readonly MessageRecord[], bytes: number, onlyIfRoom = false): void {
    if (this.entries.has(key)) return;
    if (onlyIfRoom && this.used + bytes > this.budgetBytes) return;
    this.entries.set(key, { records, bytes });
    this.used += bytes;
    for (const [oldest, entry] of this.entries) {
      if (this.used <= this.budgetBytes || oldest === key) break;
      this.entries.delete(oldest);
      this.used -= entry.bytes;
      this.evictions += 1;
    }
  }

  /** Forgets the segment at `key` (retired, or its shard no longer led here). */
  delete(key: string): void {
    const entry = this.entries.get(key);
    if (entry === undefined) return;
    this.entries.delete(key);
    this.used -= entry.bytes;
  }

  /** Current counters. */
  stats(): SegmentBodyCacheStats {
    return {
      segments: this.entries.size,
      bytes: this.used,
      budgetBytes: this.budgetBytes,
      evictions: this.evictions,
    };
  }
}

/** Binary search of `records` (ascending offsets) for `offset`. */
export function findRecord(
  records: readonly MessageRecord[] | undefined,
  offset: number,
): MessageRecord | undefined {
  if (records === undefined) return undefined;
  let lo = 0;
  let hi = records.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >>> 1;
    const r = records[mid] as MessageRecord;
    if (r.offset === offset) return r;
    if (r.offset < offset) lo = mid + 1;
    else hi = mid - 1;
  }
  return undefined;
}
