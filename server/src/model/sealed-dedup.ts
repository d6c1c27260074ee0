/**
 * The leader's lookup of sealed dedup ids: every live entry of the dedup
 * segments the head indexes, found by dedup id (model-internal).
 *
 * The entries themselves stay in their segments' {@link DedupChunk}s; this
 * index holds, per entry, only where it is (chunk, position), packed into
 * one 32-bit slot of an open-addressing hash table (linear probing, at most
 * 70% full), and beside it the entry's hash (the chunk's stored hash of
 * it): 8 bytes a slot, so ~12-23 bytes per entry. A probe compares the
 * hash held beside each slot of its run, so a lookup of a new id (the
 * common case) reads only the table's own memory; it compares the second
 * hash and then the id itself only where the first matches, so a hash
 * collision is never taken for a duplicate: the answer is exactly that of a
 * map of the ids.
 *
 * An id may be indexed more than once: an entry replaced by a newer one
 * with the same id (allowed only once it expired) stays until the expiry
 * step forgets it, and a lookup answers the entry with the highest offset.
 * So nothing here needs the ids but a lookup: a chunk's ids may be paged out
 * (`DedupChunk.dropIds`), and a lookup that meets an entry of such a chunk
 * whose hashes match throws {@link DedupIdsPagedOut}; the broker reads
 * back, before a batch applies, the chunks its lookups will need
 * ({@link SealedDedup.candidates}). An expired entry is never a
 * candidate: it cannot make an enqueue a duplicate.
 *
 * Expiry: a chunk's entries are forgotten in expiry order
 * ((expiresAt, dedup id), `DedupChunk.byExpiry`); one heap entry per chunk
 * says when its next entry expires, and a cursor per chunk how far the
 * expiry step got. A chunk leaves the index when the cursor passed its last
 * entry (nothing in the table refers to it then).
 *
 * Costs: O(1) expected per lookup and insert; O(log c) per chunk whose next
 * expiry passed (c chunks), O(1) per entry expired.
 */
import { BinaryHeap } from "./binary-heap.ts";
import { type DedupChunk, DedupIdsPagedOut, dedupHash, dedupPrint, isUuid } from "./dedup-chunk.ts";
import type { DedupEntry } from "./shard-records.ts";

/** Slot marker: empty. */
const EMPTY = -1;
/** The table grows (doubles) beyond this share of full slots. */
const MAX_LOAD = 0.7;
const MIN_CAPACITY = 16;
/** Bits of a slot for the position in its chunk at first (the rest name the chunk); more when a chunk needs them. */
const MIN_POS_BITS = 12;

/** A chunk a lookup would compare ids with, and the name of its dedup segment. */
export interface DedupCandidate {
  readonly chunk: DedupChunk;
  readonly name: string;
}

/** No candidate (one shared empty list). */
const NO_CANDIDATES: readonly DedupCandidate[] = Object.freeze([]);

interface ChunkDue {
  readonly at: number;
  readonly no: number;
}

/** Live sealed dedup entries, by dedup id (see module header). */
export class SealedDedup {
  /** The chunks by number (a slot names its chunk by number); numbers are reused once free. */
  readonly #chunks: (DedupChunk | undefined)[] = [];
  /** The name of each chunk's dedup segment, by number. */
  readonly #names: (string | undefined)[] = [];
  readonly #free: number[] = [];
  #live = 0;
  /** Per chunk, how many of its entries (in expiry order) the expiry step has passed. */
  readonly #cursor = new Map<number, number>();
  readonly #due = new BinaryHeap<ChunkDue>((a, b) => (a.at !== b.at ? a.at < b.at : a.no < b.no));
  #size = 0;
  #mask = MIN_CAPACITY - 1;
  /**
   * Slot i at `2i`: `(chunk number << posBits) | position`, or EMPTY; at
   * `2i + 1` that entry's hash (as a signed 32-bit integer). Side by side,
   * so that a probe reads one cache line.
   */
  #table = emptyTable(MIN_CAPACITY);
  #posBits = MIN_POS_BITS;

  /** Indexed entries (an id replaced but not yet expired counts until it is). */
  get size(): number {
    return this.#size;
  }

  /** Chunks the index refers to (or may still expire entries of). */
  get chunks(): number {
    return this.#live;
  }

  /** Bytes of the hash table itself (the chunks aside): 8 a slot. */
  get tableBytes(): number {
    return this.#table.byteLength;
  }

  /**
   * Makes `chunk` (the entries of the dedup segment `name`) indexable with
   * {@link put}; returns its number (valid until its last entry expired;
   * -1 for an empty chunk). None is indexed yet.
   */
  addChunk(chunk: DedupChunk, name: string): number {
    if (chunk.length === 0) return EMPTY;
    const posBits = Math.max(this.#posBits, bitsFor(chunk.length));
    const no = this.#free.at(-1) ?? this.#chunks.length;
    if (no >= 1 << (31 - posBits))
      throw new Error(`too many dedup chunks (${no + 1}) for ${posBits}-bit positions`);
    this.#free.pop();
    this.#chunks[no] = chunk;
    this.#names[no] = name;
    this.#live += 1;
    this.#cursor.set(no, 0);
    this.#due.push({ at: chunk.expiresAtAt(chunk.byExpiry(0)), no });
    if (posBits !== this.#posBits) this.#resize(this.#mask + 1, posBits);
    return no;
  }

  /** Indexes entry `pos` of chunk `no` (an older entry of its dedup id may stay indexed: lookups answer the newest). */
  put(no: number, pos: number): void {
    const chunk = no >= 0 ? this.#chunks[no] : undefined;
    if (chunk === undefined || pos < 0 || pos >= chunk.length)
      throw new Error(`no entry ${pos} in chunk ${no}`);
    if ((this.#size + 1) / (this.#mask + 1) > MAX_LOAD) this.#resize(2 * (this.#mask + 1), this.#posBits);
    const hash = chunk.hashAt(pos);
    let i = hash & this.#mask;
    while (this.#table[2 * i] !== EMPTY) i = (i + 1) & this.#mask;
    this.#table[2 * i] = (no << this.#posBits) | pos;
    this.#table[2 * i + 1] = hash;
    this.#size += 1;
  }

  /**
   * The live sealed entry of `dedupId` (the one with the highest offset), if
   * any; with `now`, only an entry that has not expired by then. Throws
   * {@link DedupIdsPagedOut} when an entry that may be it is in a chunk
   * whose ids are not in memory (see {@link candidates}).
   */
  get(dedupId: string, now = Number.NEGATIVE_INFINITY): DedupEntry | undefined {
    const slots = this.#matchingSlots(dedupId, now);
    if (slots === undefined) return undefined; // the common case: a new id, nothing allocated
    const uuid = isUuid(dedupId);
    let best: { chunk: DedupChunk; pos: number } | undefined;
    for (const slot of slots) {
      const chunk = this.#chunkOf(slot);
      const pos = this.#posOf(slot);
      if (!chunk.resident)
        throw new DedupIdsPagedOut(`the ids of dedup segment ${this.#nameOf(slot)} are not in memory`);
      if (!chunk.hasDedupId(pos, dedupId, uuid)) continue;
      if (best === undefined || chunk.offsetAt(pos) > best.chunk.offsetAt(best.pos)) best = { chunk, pos };
    }
    return best?.chunk.entryAt(best.pos);
  }

  /**
   * The chunks (and their dedup segments' names) whose ids {@link get}
   * would compare with `dedupId` at `now`: those holding an unexpired entry
   * whose two hashes match it (almost always none for a new id).
   */
  candidates(dedupId: string, now: number): readonly DedupCandidate[] {
    const slots = this.#matchingSlots(dedupId, now);
    if (slots === undefined) return NO_CANDIDATES; // the common case: a new id, nothing allocated
    const out: DedupCandidate[] = [];
    for (const slot of slots) {
      const chunk = this.#chunkOf(slot);
      if (!out.some((c) => c.chunk === chunk)) out.push({ chunk, name: this.#nameOf(slot) });
    }
    return out;
  }

  /** The slots of `dedupId`'s probe run whose two hashes match it and that have not expired by `now`; undefined: none. */
  #matchingSlots(dedupId: string, now: number): number[] | undefined {
    const hash = dedupHash(dedupId);
    const signed = hash | 0;
    const table = this.#table;
    let print: number | undefined;
    let found: number[] | undefined;
    for (let i = hash & this.#mask; table[2 * i] !== EMPTY; i = (i + 1) & this.#mask) {
      if (table[2 * i + 1] !== signed) continue;
      const slot = table[2 * i] as number;
      const chunk = this.#chunkOf(slot);
      const pos = this.#posOf(slot);
      print ??= dedupPrint(dedupId);
      if (chunk.printAt(pos) !== print || chunk.expiresAtAt(pos) <= now) continue;
      if (found === undefined) found = [slot];
      else found.push(slot);
    }
    return found;
  }

  /** Forgets every entry whose `expiresAt` is at or before `now`; returns how many it forgot. */
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
        this.#names[top.no] = undefined;
        this.#free.push(top.no);
        this.#live -= 1;
      }
    }
  }

  /** When the next sealed entry expires (it may have been forgotten already); undefined: none. */
  nextExpiry(): number | undefined {
    return this.#due.peek()?.at;
  }

  /**
   * Every indexed entry, in no particular order (a replaced one too, until
   * it expires). O(table). Throws {@link DedupIdsPagedOut} when a chunk's
   * ids are not in memory.
   */
  *values(): IterableIterator<DedupEntry> {
    for (let i = 0; i <= this.#mask; i++) {
      const slot = this.#table[2 * i] as number;
      if (slot !== EMPTY) yield this.#chunkOf(slot).entryAt(this.#posOf(slot));
    }
  }

  #chunkOf(slot: number): DedupChunk {
    return this.#chunks[slot >>> this.#posBits] as DedupChunk;
  }

  #nameOf(slot: number): string {
    return this.#names[slot >>> this.#posBits] as string;
  }

  #posOf(slot: number): number {
    return slot & ((1 << this.#posBits) - 1);
  }

  /** The table index holding entry `pos` of chunk `no`, or EMPTY (forgotten). */
  #slotOf(chunk: DedupChunk, no: number, pos: number): number {
    const want = (no << this.#posBits) | pos;
    for (let i = chunk.hashAt(pos) & this.#mask; ; i = (i + 1) & this.#mask) {
      const at = this.#table[2 * i] as number;
      if (at === EMPTY) return EMPTY;
      if (at === want) return i;
    }
  }

  /** Empties table index `index`, shifting back the entries of its probe run that may move (no tombstones). */
  #remove(index: number): void {
    const mask = this.#mask;
    const table = this.#table;
    let i = index;
    for (let j = (i + 1) & mask; table[2 * j] !== EMPTY; j = (j + 1) & mask) {
      const home = (table[2 * j + 1] as number) & mask;
      // The entry at j stays when its home lies cyclically in (i, j].
      const stays = i <= j ? i < home && home <= j : i < home || home <= j;
      if (stays) continue;
      table[2 * i] = table[2 * j] as number;
      table[2 * i + 1] = table[2 * j + 1] as number;
      i = j;
    }
    table[2 * i] = EMPTY;
    this.#size -= 1;
  }

  /** Rebuilds the table with `capacity` slots and `posBits` bits of position a slot. */
  #resize(capacity: number, posBits: number): void {
    const old = this.#table;
    const oldBits = this.#posBits;
    const oldMask = (1 << oldBits) - 1;
    this.#mask = capacity - 1;
    this.#posBits = posBits;
    const table = emptyTable(capacity);
    this.#table = table;
    for (let s = 0; s < old.length; s += 2) {
      const slot = old[s] as number;
      if (slot === EMPTY) continue;
      const hash = old[s + 1] as number;
      let i = hash & this.#mask;
      while (table[2 * i] !== EMPTY) i = (i + 1) & this.#mask;
      table[2 * i] = ((slot >>> oldBits) << posBits) | (slot & oldMask);
      table[2 * i + 1] = hash;
    }
  }
}

/** A table of `capacity` empty slots (see `SealedDedup.#table`). */
function emptyTable(capacity: number): Int32Array {
  const table = new Int32Array(2 * capacity);
  for (let i = 0; i < table.length; i += 2) table[i] = EMPTY;
  return table;
}

/** Bits that hold positions 0..length-1 (at least {@link MIN_POS_BITS}). */
function bitsFor(length: number): number {
  let bits = MIN_POS_BITS;
  while (1 << bits < length && bits < 30) bits += 1;
  return bits;
}

/** Every remembered dedup id: the head's own entries, then the sealed ones (`state.dedup`). */
export class RememberedDedup {
  constructor(
    private readonly recent: ReadonlyMap<string, DedupEntry>,
    private readonly sealed: SealedDedup,
  ) {}

  /**
   * The live entry of `dedupId`, wherever it is stored: the head's (possibly
   * expired but not yet forgotten), else the newest sealed one that has not
   * expired by `now`. Throws `DedupIdsPagedOut` as `SealedDedup.get`.
   */
  get(dedupId: string, now?: number): DedupEntry | undefined {
    return this.recent.get(dedupId) ?? this.sealed.get(dedupId, now);
  }

  /** The sealed chunks a {@link get} of `dedupId` at `now` compares ids with (see `SealedDedup.candidates`); none when the head holds it. */
  candidates(dedupId: string, now: number): readonly DedupCandidate[] {
    return this.recent.has(dedupId) ? NO_CANDIDATES : this.sealed.candidates(dedupId, now);
  }

  /** Remembered ids (a sealed entry replaced but not yet expired counts until it is). */
  get size(): number {
    return this.recent.size + this.sealed.size;
  }

  /**
   * Every remembered entry, each id once: the head's, ascending offsets,
   * then the sealed ones in no particular order. O(ids), and a map of the
   * sealed ones (a v1 encode, a test). Throws `DedupIdsPagedOut` when a
   * chunk's ids are not in memory.
   */
  *values(): IterableIterator<DedupEntry> {
    yield* this.recent.values();
    const newest = new Map<string, DedupEntry>();
    for (const e of this.sealed.values()) {
      if (this.recent.has(e.dedupId)) continue;
      const other = newest.get(e.dedupId);
      if (other === undefined || other.offset < e.offset) newest.set(e.dedupId, e);
    }
    yield* newest.values();
  }
}
