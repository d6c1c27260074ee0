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
 * Order of work in a commit: {@link DedupIdPager.pageInFor} runs before
 * the batch applies (the leader's `prepare`) and pages out only ids the
 * batch does not need, so nothing drops them between the two. A read that
 * fails leaves the ids out: each enqueue that needs them answers
 * `unavailable` and stores nothing (`model/enqueue-operation.ts`); a
 * segment missing or corrupt refuses the shard (`data_loss`), as for
 * message segments, unless the head moved meanwhile (a deposed leader
 * meeting a segment its successor deleted: `unavailable`).
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

/** Dedup segments read back at once by one page-in. */
const READ_PARALLELISM = 4;

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
    /** True when the shard's head changed since it was loaded (a read that found a segment missing may be stale). */
    private readonly headMoved: () => Promise<boolean> = async () => false,
  ) {}

  /** Bytes of ids in memory now, and dedup segments read back since start (for tests and diagnostics). */
  get stats(): { readonly residentBytes: number; readonly chunks: number; readonly readBack: number } {
    return { residentBytes: this.#used, chunks: this.#resident.size, readBack: this.#readBack };
  }

  /** Takes in a chunk whose ids are in memory (just sealed, read with a head, or read back) as the most recently used. */
  admit(chunk: DedupChunk): void {
    if (!chunk.resident) return;
    this.forget(chunk);
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

  /** Drops the ids of the least recently used chunks (but those in `keep`) while more than the budget is in memory. */
  trim(keep: ReadonlySet<DedupChunk> = new Set()): void {
    for (const [chunk, bytes] of this.#resident) {
      if (this.#used <= this.budgetBytes) return;
      if (keep.has(chunk)) continue;
      chunk.dropIds();
      this.#resident.delete(chunk);
      this.#used -= bytes;
    }
  }

  /**
   * Before a batch applies: makes sure the ids that `state`'s lookups of
   * `dedupIds` at `now` compare with are in memory (see
   * `RememberedDedup.candidates`): those held count as used now, those
   * paged out are read back (a few at a time), then the ids beyond the
   * budget are dropped, never those this batch needs. A segment whose read
   * fails stays paged out (the enqueues that need it answer `unavailable`);
   * rejects with `unavailable` when one was missing because the head moved
   * (this leader is deposed and does not know yet), with `data_loss` when
   * one is missing or is not what the head says.
   */
  async pageInFor(state: ShardState, dedupIds: Iterable<string>, now: number): Promise<void> {
    const needed = new Map<DedupChunk, string>();
    for (const dedupId of dedupIds)
      for (const { chunk, name } of state.dedup.candidates(dedupId, now)) needed.set(chunk, name);
    const missing: [DedupChunk, string][] = [];
    for (const [chunk, name] of needed) {
      if (chunk.resident) this.admit(chunk);
      else missing.push([chunk, name]);
    }
    let lost: string | undefined;
    for (let i = 0; i < missing.length; i += READ_PARALLELISM) {
      const reads = missing.slice(i, i + READ_PARALLELISM).map(async ([chunk, name]) => {
        const seg = state.dedupSegments.get(name);
        if (seg === undefined) return;
        const read = await readDedupSegment(this.store, this.queue, this.shard, seg);
        if ("problem" in read) lost ??= `${name} ${read.problem}`;
        else if (!chunk.restoreIds(read.chunk)) lost ??= `${name} does not hold what the head says`;
        else {
          this.#readBack += 1;
          this.admit(chunk);
        }
      });
      // A read that failed (`unavailable`) leaves its segment out; the others go on.
      await Promise.allSettled(reads);
    }
    this.trim(new Set(needed.keys()));
    if (lost === undefined) return;
    if (await this.headMoved())
      throw new CasqError(
        "unavailable",
        `dedup segment ${lost} (the shard's head moved: this broker may no longer lead it); retry`,
        { queue: this.queue, shard: this.shard },
      );
    throw new CasqError(
      "data_loss",
      `dedup segment ${segmentPrefix(this.queue, this.shard)}${lost}, referenced by the shard's head; refusing the shard — restore the segment from a backup`,
      { queue: this.queue, shard: this.shard },
    );
  }
}
