/**
 * The leader's lookup of sealed dedup ids: every live entry of the dedup
 * segments the head indexes, found by dedup id (model-internal).
 *
 * The entries themselves stay in their segments' {@link DedupChunk}s; this
 * index holds, per live entry, its 32-bit hash and where it is (chunk,
 * position): an open-addressing hash table of three typed arrays, linear
 * probing, at most 70% full, so ~12-35 bytes per entry. A lookup compares
 * the id it is asked for with the chunk's own copy of each entry whose hash
 * matches, so a hash collision is never taken for a duplicate: the answer is
 * exactly that of a map of the ids.
 *
 * Expiry: a chunk's entries are forgotten in expiry order
 * ((expiresAt, dedup id), `DedupChunk.byExpiry`); one heap entry per chunk
 * says when its next entry expires, and a cursor per chunk how far the
 * expiry step got. An entry that had been replaced or forgotten by then is
 * skipped. A chunk leaves the index when the cursor passed its last entry
 * (nothing in the table refers to it then).
 *
 * Costs: O(1) expected per lookup, insert and delete; O(log c) per chunk
 * whose next expiry passed (c chunks), O(1) per entry expired.
 */
import { BinaryHeap } from "./binary-heap.ts";
import { type DedupChunk, dedupHash } from "./dedup-chunk.ts";
import type { DedupEntry } from "./shard-records.ts";

/** Slot marker: empty. */
const EMPTY = -1;
/** The table grows (doubles) beyond this share of full slots. */
const MAX_LOAD = 0.7;
const MIN_CAPACITY = 16;

interface ChunkDue {
  readonly at: number;
  readonly no: number;
}

/** Live sealed dedup entries, by dedup id (see module header). */
export class SealedDedup {
  readonly #chunks = new Map<number, DedupChunk>();
  /** Per chunk, how many of its entries (in expiry order) the expiry step has passed. */
  readonly #cursor = new Map<number, number>();
  readonly #due = new BinaryHeap<ChunkDue>((a, b) => (a.at !== b.at ? a.at < b.at : a.no < b.no));
  #nextChunk = 0;
  #size = 0;
  #mask = MIN_CAPACITY - 1;
  #hash = new Uint32Array(MIN_CAPACITY);
  #chunk = new Int32Array(MIN_CAPACITY).fill(EMPTY);
  #pos = new Int32Array(MIN_CAPACITY);

  /** Live entries. */
  get size(): number {
    return this.#size;
  }

  /** Chunks the index refers to (or may still expire entries of). */
  get chunks(): number {
    return this.#chunks.size;
  }

  /** Makes `chunk`'s entries indexable with {@link put}; returns its number. None is indexed yet. */
  addChunk(chunk: DedupChunk): number {
    const no = this.#nextChunk++;
    if (chunk.length === 0) return no;
    this.#chunks.set(no, chunk);
    this.#cursor.set(no, 0);
    this.#due.push({ at: chunk.expiresAtAt(chunk.byExpiry(0)), no });
    return no;
  }

  /** Indexes entry `pos` of chunk `no`. Its dedup id must not be indexed already. */
  put(no: number, pos: number): void {
    const chunk = this.#chunks.get(no);
    if (chunk === undefined || pos < 0 || pos >= chunk.length)
      throw new Error(`no entry ${pos} in chunk ${no}`);
    if ((this.#size + 1) / (this.#mask + 1) > MAX_LOAD) this.#resize(2 * (this.#mask + 1));
    const hash = chunk.hashAt(pos);
    let i = hash & this.#mask;
    while (this.#chunk[i] !== EMPTY) i = (i + 1) & this.#mask;
    this.#hash[i] = hash;
    this.#chunk[i] = no;
    this.#pos[i] = pos;
    this.#size += 1;
  }

  /** The live sealed entry of `dedupId`, if any. */
  get(dedupId: string): DedupEntry | undefined {
    const slot = this.#find(dedupId);
    if (slot === EMPTY) return undefined;
    return (this.#chunks.get(this.#chunk[slot] as number) as DedupChunk).entryAt(this.#pos[slot] as number);
  }

  /** Forgets the sealed entry of `dedupId`; false when there was none. */
  delete(dedupId: string): boolean {
    const slot = this.#find(dedupId);
    if (slot === EMPTY) return false;
    this.#remove(slot);
    return true;
  }

  /** Forgets every entry whose `expiresAt` is at or before `now`; returns how many live ones it forgot. */
  expire(now: number): number {
    let forgotten = 0;
    for (;;) {
      const top = this.#due.peek();
      if (top === undefined || top.at > now) return forgotten;
      this.#due.pop();
      const chunk = this.#chunks.get(top.no) as DedupChunk;
      let k = this.#cursor.get(top.no) as number;
      for (; k < chunk.length; k++) {
        const pos = chunk.byExpiry(k);
        if (chunk.expiresAtAt(pos) > now) break;
        const slot = this.#slotOf(chunk, top.no, pos);
        if (slot !== EMPTY) {
          this.#remove(slot);
          forgotten += 1;
        }
      }
      if (k < chunk.length) {
        this.#cursor.set(top.no, k);
        this.#due.push({ at: chunk.expiresAtAt(chunk.byExpiry(k)), no: top.no });
      } else {
        this.#cursor.delete(top.no);
        this.#chunks.delete(top.no);
      }
    }
  }

  /** When the next sealed entry expires (it may have been forgotten already); undefined: none. */
  nextExpiry(): number | undefined {
    return this.#due.peek()?.at;
  }

  /** Every live entry, in no particular order. O(table). */
  *values(): IterableIterator<DedupEntry> {
    for (let i = 0; i <= this.#mask; i++) {
      const no = this.#chunk[i] as number;
      if (no !== EMPTY) yield (this.#chunks.get(no) as DedupChunk).entryAt(this.#pos[i] as number);
    }
  }

  /** The slot holding `dedupId`, or EMPTY. */
  #find(dedupId: string): number {
    const hash = dedupHash(dedupId);
    const mask = this.#mask;
    for (let i = hash & mask; ; i = (i + 1) & mask) {
      const no = this.#chunk[i] as number;
      if (no === EMPTY) return EMPTY;
      if (
        this.#hash[i] === hash &&
        (this.#chunks.get(no) as DedupChunk).hasDedupId(this.#pos[i] as number, dedupId)
      )
        return i;
    }
  }

  /** The slot indexing entry `pos` of chunk `no`, or EMPTY (replaced or forgotten). */
  #slotOf(chunk: DedupChunk, no: number, pos: number): number {
    const mask = this.#mask;
    for (let i = chunk.hashAt(pos) & mask; ; i = (i + 1) & mask) {
      const at = this.#chunk[i] as number;
      if (at === EMPTY) return EMPTY;
      if (at === no && this.#pos[i] === pos) return i;
    }
  }

  /** Empties slot `i`, shifting back the entries of its probe run that may move (no tombstones). */
  #remove(slot: number): void {
    const mask = this.#mask;
    let i = slot;
    for (let j = (i + 1) & mask; this.#chunk[j] !== EMPTY; j = (j + 1) & mask) {
      const home = (this.#hash[j] as number) & mask;
      // The entry at j stays when its home lies cyclically in (i, j].
      const stays = i <= j ? i < home && home <= j : i < home || home <= j;
      if (stays) continue;
      this.#hash[i] = this.#hash[j] as number;
      this.#chunk[i] = this.#chunk[j] as number;
      this.#pos[i] = this.#pos[j] as number;
      i = j;
    }
    this.#chunk[i] = EMPTY;
    this.#size -= 1;
  }

  #resize(capacity: number): void {
    const [hashes, chunks, positions] = [this.#hash, this.#chunk, this.#pos];
    this.#mask = capacity - 1;
    this.#hash = new Uint32Array(capacity);
    this.#chunk = new Int32Array(capacity).fill(EMPTY);
    this.#pos = new Int32Array(capacity);
    for (let s = 0; s < chunks.length; s++) {
      const no = chunks[s] as number;
      if (no === EMPTY) continue;
      const hash = hashes[s] as number;
      let i = hash & this.#mask;
      while (this.#chunk[i] !== EMPTY) i = (i + 1) & this.#mask;
      this.#hash[i] = hash;
      this.#chunk[i] = no;
      this.#pos[i] = positions[s] as number;
    }
  }
}

/** Every remembered dedup id: the head's own entries, then the sealed ones (`state.dedup`). */
export class RememberedDedup {
  constructor(
    private readonly recent: ReadonlyMap<string, DedupEntry>,
    private readonly sealed: SealedDedup,
  ) {}

  /** The live entry of `dedupId` (possibly expired but not yet forgotten), wherever it is stored. */
  get(dedupId: string): DedupEntry | undefined {
    return this.recent.get(dedupId) ?? this.sealed.get(dedupId);
  }

  /** Remembered ids. */
  get size(): number {
    return this.recent.size + this.sealed.size;
  }

  /** Every remembered entry: the head's, ascending offsets, then the sealed ones in no particular order. */
  *values(): IterableIterator<DedupEntry> {
    yield* this.recent.values();
    yield* this.sealed.values();
  }
}
