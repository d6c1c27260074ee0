/**
 * The leader's lookup of sealed dedup ids: every live entry of the dedup
 * segments the head indexes, found by dedup id (model-internal).
 *
 * The entries themselves stay in their segments' {@link DedupChunk}s; this
 * index holds, per live entry, only where it is (chunk, position): an
 * open-addressing hash table of two Int32Arrays (8 bytes a slot), linear
 * probing, at most 70% full, so ~11-23 bytes per entry. A slot's hash is not
 * stored: the chunk computes it from its copy of the id when it is needed
 * (moving entries on a delete, growing the table). A lookup compares the id
 * it is asked for with the chunk's own copy of each entry of its probe run,
 * so a hash collision is never taken for a duplicate: the answer is exactly
 * that of a map of the ids.
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
import { type DedupChunk, dedupHash, isUuid } from "./dedup-chunk.ts";
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
  /** The chunks by number (a slot of the table names its chunk by number); numbers are reused once free. */
  readonly #chunks: (DedupChunk | undefined)[] = [];
  readonly #free: number[] = [];
  #live = 0;
  /** Per chunk, how many of its entries (in expiry order) the expiry step has passed. */
  readonly #cursor = new Map<number, number>();
  readonly #due = new BinaryHeap<ChunkDue>((a, b) => (a.at !== b.at ? a.at < b.at : a.no < b.no));
  #size = 0;
  #mask = MIN_CAPACITY - 1;
  #chunk = new Int32Array(MIN_CAPACITY).fill(EMPTY);
  #pos = new Int32Array(MIN_CAPACITY);

  /** Live entries. */
  get size(): number {
    return this.#size;
  }

  /** Chunks the index refers to (or may still expire entries of). */
  get chunks(): number {
    return this.#live;
  }

  /** Bytes of the hash table itself (the chunks aside): 8 a slot. */
  get tableBytes(): number {
    return this.#chunk.byteLength + this.#pos.byteLength;
  }

  /**
   * Makes `chunk`'s entries indexable with {@link put}; returns its number
   * (valid until its last entry expired; -1 for an empty chunk). None is indexed yet.
   */
  addChunk(chunk: DedupChunk): number {
    if (chunk.length === 0) return EMPTY;
    const no = this.#free.pop() ?? this.#chunks.length;
    this.#chunks[no] = chunk;
    this.#live += 1;
    this.#cursor.set(no, 0);
    this.#due.push({ at: chunk.expiresAtAt(chunk.byExpiry(0)), no });
    return no;
  }

  /** Indexes entry `pos` of chunk `no`. Its dedup id must not be indexed already. */
  put(no: number, pos: number): void {
    const chunk = no >= 0 ? this.#chunks[no] : undefined;
    if (chunk === undefined || pos < 0 || pos >= chunk.length)
      throw new Error(`no entry ${pos} in chunk ${no}`);
    if ((this.#size + 1) / (this.#mask + 1) > MAX_LOAD) this.#resize(2 * (this.#mask + 1));
    let i = chunk.hashAt(pos) & this.#mask;
    while (this.#chunk[i] !== EMPTY) i = (i + 1) & this.#mask;
    this.#chunk[i] = no;
    this.#pos[i] = pos;
    this.#size += 1;
  }

  /** The live sealed entry of `dedupId`, if any. */
  get(dedupId: string): DedupEntry | undefined {
    const slot = this.#find(dedupId);
    if (slot === EMPTY) return undefined;
    return (this.#chunks[this.#chunk[slot] as number] as DedupChunk).entryAt(this.#pos[slot] as number);
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
      const chunk = this.#chunks[top.no] as DedupChunk;
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
        this.#chunks[top.no] = undefined;
        this.#free.push(top.no);
        this.#live -= 1;
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
      if (no !== EMPTY) yield (this.#chunks[no] as DedupChunk).entryAt(this.#pos[i] as number);
    }
  }

  /** The slot holding `dedupId`, or EMPTY. */
  #find(dedupId: string): number {
    const hash = dedupHash(dedupId);
    const uuid = isUuid(dedupId);
    const mask = this.#mask;
    for (let i = hash & mask; ; i = (i + 1) & mask) {
      const no = this.#chunk[i] as number;
      if (no === EMPTY) return EMPTY;
      if ((this.#chunks[no] as DedupChunk).hasDedupId(this.#pos[i] as number, dedupId, uuid)) return i;
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
      const home = this.#hashOf(j) & mask;
      // The entry at j stays when its home lies cyclically in (i, j].
      const stays = i <= j ? i < home && home <= j : i < home || home <= j;
      if (stays) continue;
      this.#chunk[i] = this.#chunk[j] as number;
      this.#pos[i] = this.#pos[j] as number;
      i = j;
    }
    this.#chunk[i] = EMPTY;
    this.#size -= 1;
  }

  /** The hash of the entry in (non-empty) slot `i`, from its chunk. */
  #hashOf(i: number): number {
    return (this.#chunks[this.#chunk[i] as number] as DedupChunk).hashAt(this.#pos[i] as number);
  }

  #resize(capacity: number): void {
    const [chunks, positions] = [this.#chunk, this.#pos];
    this.#mask = capacity - 1;
    this.#chunk = new Int32Array(capacity).fill(EMPTY);
    this.#pos = new Int32Array(capacity);
    // Entry by entry, one chunk at a time (one map lookup a chunk, not a slot).
    let no = EMPTY;
    let chunk: DedupChunk | undefined;
    for (let s = 0; s < chunks.length; s++) {
      const at = chunks[s] as number;
      if (at === EMPTY) continue;
      if (at !== no) {
        no = at;
        chunk = this.#chunks[at] as DedupChunk;
      }
      const pos = positions[s] as number;
      let i = (chunk as DedupChunk).hashAt(pos) & this.#mask;
      while (this.#chunk[i] !== EMPTY) i = (i + 1) & this.#mask;
      this.#chunk[i] = at;
      this.#pos[i] = pos;
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
