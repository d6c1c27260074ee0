/**
 * The entries of one sealed dedup segment, held compactly in memory
 * (model-internal).
 *
 * A leader remembers every live dedup id of the window, and with a dedup id
 * on every job (the TypeScript SDK's default) that is one id per job of the
 * backlog. As one object per entry (`DedupEntry`: two strings, two numbers,
 * a map entry and an expiry-heap entry) an id costs ~300 bytes of heap; a
 * chunk stores a dedup segment's entries as columns instead: every dedup id
 * and message id of the segment in one flat string (one byte per character
 * for ASCII ids), their end positions, and the offsets and expiry times in
 * typed arrays — about 16 bytes plus the ids' characters per entry, and no
 * object for the garbage collector to trace.
 *
 * A chunk is immutable and holds every entry the segment holds (ascending
 * offsets), so it can stand for the segment's contents wherever the entries
 * were used: the state's lookup (`sealed-dedup.ts` indexes it), the
 * broker's cache of loaded dedup segments, and rebuilding a state from its
 * head. Entries are materialised as `DedupEntry` objects only when asked for
 * (a duplicate found, a v1 encode, a test).
 */

/** A remembered dedup id (defined here, re-exported by `shard-records.ts`, so that the two need no import cycle). */
export interface DedupEntry {
  readonly dedupId: string;
  readonly id: string;
  readonly offset: number;
  readonly expiresAt: number;
}

/** What a dedup segment's entries may be handed over as: a chunk, or the parsed entries. */
export type DedupEntries = DedupChunk | readonly DedupEntry[];

/** One dedup segment's entries as columns (see module header). */
export class DedupChunk {
  /** Number of entries. */
  readonly length: number;
  /** Latest `expiresAt` among the entries (0 when empty). */
  readonly maxExpiresAt: number;
  /** Every entry's dedup id then message id, concatenated. */
  readonly #text: string;
  /** End (in `#text`) of entry i's dedup id at 2i, of its message id at 2i+1. */
  readonly #ends: Uint32Array;
  readonly #offsets: Float64Array;
  readonly #expiresAt: Float64Array;
  /** Positions in expiry order ((expiresAt, dedupId) ascending); undefined when that is position order. */
  readonly #byExpiry: Uint32Array | undefined;

  private constructor(entries: readonly DedupEntry[]) {
    const n = entries.length;
    this.length = n;
    this.#ends = new Uint32Array(2 * n);
    this.#offsets = new Float64Array(n);
    this.#expiresAt = new Float64Array(n);
    const parts: string[] = [];
    let end = 0;
    let max = 0;
    let sorted = true;
    for (let i = 0; i < n; i++) {
      const e = entries[i] as DedupEntry;
      parts.push(e.dedupId, e.id);
      end += e.dedupId.length;
      this.#ends[2 * i] = end;
      end += e.id.length;
      this.#ends[2 * i + 1] = end;
      this.#offsets[i] = e.offset;
      this.#expiresAt[i] = e.expiresAt;
      if (e.expiresAt > max) max = e.expiresAt;
      if (i > 0 && expiresBefore(e, entries[i - 1] as DedupEntry)) sorted = false;
    }
    this.#text = parts.join("");
    this.maxExpiresAt = max;
    if (sorted) this.#byExpiry = undefined;
    else {
      const order = Array.from({ length: n }, (_, i) => i);
      order.sort((a, b) => (expiresBefore(entries[a] as DedupEntry, entries[b] as DedupEntry) ? -1 : 1));
      this.#byExpiry = Uint32Array.from(order);
    }
  }

  /** A chunk of `entries` (ascending offsets, as a dedup segment holds them). O(n). */
  static from(entries: DedupEntries): DedupChunk {
    return entries instanceof DedupChunk ? entries : new DedupChunk(entries);
  }

  #start(i: number): number {
    return i === 0 ? 0 : (this.#ends[2 * i - 1] as number);
  }

  /** Entry i's dedup id. */
  dedupIdAt(i: number): string {
    return this.#text.slice(this.#start(i), this.#ends[2 * i]);
  }

  /** True when entry i's dedup id is `dedupId` (no allocation). */
  hasDedupId(i: number, dedupId: string): boolean {
    const start = this.#start(i);
    return (this.#ends[2 * i] as number) - start === dedupId.length && this.#text.startsWith(dedupId, start);
  }

  /** The hash ({@link dedupHash}) of entry i's dedup id (no allocation). */
  hashAt(i: number): number {
    return hashRange(this.#text, this.#start(i), this.#ends[2 * i] as number);
  }

  /** Entry i's message offset. */
  offsetAt(i: number): number {
    return this.#offsets[i] as number;
  }

  /** Entry i's `expiresAt`. */
  expiresAtAt(i: number): number {
    return this.#expiresAt[i] as number;
  }

  /** Entry i as an object. */
  entryAt(i: number): DedupEntry {
    return {
      dedupId: this.dedupIdAt(i),
      id: this.#text.slice(this.#ends[2 * i], this.#ends[2 * i + 1]),
      offset: this.#offsets[i] as number,
      expiresAt: this.#expiresAt[i] as number,
    };
  }

  /** The position of the k-th entry in expiry order ((expiresAt, dedupId) ascending). */
  byExpiry(k: number): number {
    return this.#byExpiry === undefined ? k : (this.#byExpiry[k] as number);
  }

  /** Every entry as an object, ascending offsets. O(n). */
  entries(): DedupEntry[] {
    return Array.from({ length: this.length }, (_, i) => this.entryAt(i));
  }
}

/** The order the expiry step forgets entries in: `expiresAt`, then dedup id. */
function expiresBefore(a: DedupEntry, b: DedupEntry): boolean {
  return a.expiresAt !== b.expiresAt ? a.expiresAt < b.expiresAt : a.dedupId < b.dedupId;
}

/** A 32-bit hash of a dedup id (FNV-1a over its UTF-16 code units). */
export function dedupHash(dedupId: string): number {
  return hashRange(dedupId, 0, dedupId.length);
}

function hashRange(s: string, start: number, end: number): number {
  let h = 0x811c9dc5;
  for (let i = start; i < end; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  // A final mix, so that ids differing only at the end spread over the table too.
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  return h >>> 0;
}
