/**
 * The leader's paging of sealed dedup ids, per shard: which dedup segments'
 * chunks (`model/dedup-chunk.ts`) keep their ids in memory.
 *
 * A leader remembers every dedup id of the queue's window, which with a
 * dedup id on every job (the SDKs' default) is one per job of a backlog.
 * A sealed entry costs 16 bytes in memory without its ids (two hashes, an
 * offset, an expiry) and about 33 more with them; a lookup needs the ids of
 * a chunk only when both hashes of the id looked up match one of its
 * entries, that is, almost only for a duplicate. So the ids of the chunks
 * used least recently are dropped beyond a budget
 * ({@link DEFAULT_RESIDENT_DEDUP_ID_BYTES} a shard), and read back from
 * their dedup segment objects (checked against the size and SHA-256 the
 * head gives) before a batch whose enqueues need them applies.
 *
 * Order of work in a commit: {@link DedupIdPager.trim} and
 * {@link DedupIdPager.pageInFor} run before the batch applies (the leader's
 * `prepare`), so nothing drops the ids a batch needs between the two. A
 * read that fails leaves the ids out: each enqueue that needs them answers
 * `unavailable` and stores nothing (`model/enqueue-operation.ts`); a
 * segment missing or corrupt refuses the shard (`data_loss`), as for
 * message segments.
 */
import { CasqError } from "../errors.ts";
import type { DedupChunk } from "../model/dedup-chunk.ts";
import { segmentPrefix } from "../model/segment-codec.ts";
import type { ShardState } from "../model/shard-state.ts";
import type { ObjectStore } from "../store/object-store.ts";
import { readDedupSegment } from "./segment-loader.ts";

/**
 * Default ids kept in memory per shard: 2 MiB, about 60,000 packed ids (SDK
 * dedup ids are UUIDs; ~33 bytes each), the newest few seconds of a busy
 * shard, where an SDK's retry after a lost answer finds its id.
 */
export const DEFAULT_RESIDENT_DEDUP_ID_BYTES = 2 * 1024 * 1024;

/** One shard's resident dedup ids, least recently used first (see module header). */
export class DedupIdPager {
  /** Chunks with their ids in memory and the bytes those take; insertion order is recency order. */
  readonly #resident = new Map<DedupChunk, number>();
  #used = 0;
  #readBack = 0;

  constructor(
    private readonly store: ObjectStore,
    private readonly queue: string,
    private readonly shard: number,
    /** Bytes of ids kept beyond the chunks a batch needs. */
    readonly budgetBytes: number = DEFAULT_RESIDENT_DEDUP_ID_BYTES,
  ) {}

  /** Bytes of ids in memory now, and dedup segments read back since start (for tests and diagnostics). */
  get stats(): { readonly residentBytes: number; readonly chunks: number; readonly readBack: number } {
    return { residentBytes: this.#used, chunks: this.#resident.size, readBack: this.#readBack };
  }

  /** Takes in a chunk whose ids are in memory (just sealed, or read with a head) as the most recently used; one already held keeps its place. */
  admit(chunk: DedupChunk): void {
    if (!chunk.resident || this.#resident.has(chunk)) return;
    const bytes = chunk.idBytes;
    this.#resident.set(chunk, bytes);
    this.#used += bytes;
  }

  /** Stops tracking a chunk whose segment left the head (its ids go with it). */
  forget(chunk: DedupChunk): void {
    const bytes = this.#resident.get(chunk);
    if (bytes === undefined) return;
    this.#resident.delete(chunk);
    this.#used -= bytes;
  }

  /** Drops the ids of the least recently used chunks while more than the budget is in memory. */
  trim(): void {
    for (const [chunk, bytes] of this.#resident) {
      if (this.#used <= this.budgetBytes) return;
      chunk.dropIds();
      this.#resident.delete(chunk);
      this.#used -= bytes;
    }
  }

  /**
   * Reads back the ids that `state`'s lookups of `dedupIds` need (see
   * `RememberedDedup.pagedOut`). Rejects with `data_loss` when such a dedup
   * segment is missing or is not what the head says, `unavailable` when the
   * store fails.
   */
  async pageInFor(state: ShardState, dedupIds: Iterable<string>): Promise<void> {
    const names = new Set<string>();
    for (const dedupId of dedupIds) for (const name of state.dedup.pagedOut(dedupId)) names.add(name);
    for (const name of names) {
      const seg = state.dedupSegments.get(name);
      const chunk = seg?.chunk;
      if (seg === undefined || chunk === undefined || chunk.resident) continue;
      const read = await readDedupSegment(this.store, this.queue, this.shard, seg);
      const problem =
        "problem" in read
          ? read.problem
          : chunk.restoreIds(read.chunk)
            ? undefined
            : "does not hold what the head says";
      if (problem !== undefined)
        throw new CasqError(
          "data_loss",
          `dedup segment ${segmentPrefix(this.queue, this.shard)}${name}, referenced by the shard's head, ${problem}; refusing the shard — restore the segment from a backup`,
          { queue: this.queue, shard: this.shard },
        );
      this.#readBack += 1;
      this.admit(chunk);
    }
  }
}
