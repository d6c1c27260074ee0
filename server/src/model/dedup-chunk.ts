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
 * A chunk holds every entry the segment holds (ascending offsets), so it
 * can stand for the segment's contents wherever the entries were used: the
 * state's lookup (`sealed-dedup.ts` indexes it), the broker's cache of
 * loaded dedup segments, and rebuilding a state from its head. Entries are
 * materialised as `DedupEntry` objects only when asked for (a duplicate
 * found, a v1 encode, a test).
 *
 * The ids themselves (about 33 bytes an entry packed, more as text) can be
 * dropped from memory and restored from the segment object
 * ({@link DedupChunk.dropIds}, {@link DedupChunk.restoreIds}; the broker's
 * `dedup-id-pager.ts` decides when). What stays is 12-16 bytes an entry:
 * two independent 32-bit hashes of the dedup id, its offset and expiry (as
 * 16-bit differences when they fit). The first hash places the entry in the
 * lookup's table; an id whose two hashes both match an entry is compared
 * with the entry's id, for which the ids must be in memory. Two different
 * ids share both hashes with a chance of 1 in 2^64, so a lookup needs the
 * ids of a chunk almost only when the chunk does hold the id: for a
 * duplicate.
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

/** The ids of a chunk's entries, in one of two layouts (see {@link DedupChunk}). */
interface ChunkIds {
  /**
   * When every dedup id is a canonical UUID and every message id a
   * broker-made one: {@link PACKED_BYTES} bytes per entry (the UUID's 16
   * bytes, then the message id's 26 base-32 digits in 17 bytes).
   */
  readonly packed: Uint8Array | undefined;
  /** Else every entry's dedup id then message id, concatenated... */
  readonly text: string;
  /** ...and the end (in `text`) of entry i's dedup id at 2i, of its message id at 2i+1. */
  readonly ends: Uint32Array | undefined;
}

/** Thrown when an entry's ids are needed while the chunk's ids are not in memory (see {@link DedupChunk.dropIds}). */
export class DedupIdsPagedOut extends Error {
  override readonly name = "DedupIdsPagedOut";
}

/** One dedup segment's entries as columns (see module header). */
export class DedupChunk {
  /** Number of entries. */
  readonly length: number;
  /** Latest `expiresAt` among the entries (0 when empty). */
  readonly maxExpiresAt: number;
  /** True when the ids are packed (the common case: SDK dedup ids, broker message ids). */
  readonly packed: boolean;
  /** The ids, or undefined while they are paged out. */
  #ids: ChunkIds | undefined;
  /** {@link dedupHash} of each entry's dedup id. */
  readonly #hashes: Uint32Array;
  /** {@link dedupPrint} of each entry's dedup id. */
  readonly #prints: Uint32Array;
  /** Offsets, as differences from the first (when they fit 16 or 32 bits) or as they are. */
  readonly #offsets: Column;
  readonly #offsetBase: number;
  /** Expiry times, as differences from the earliest (when they fit 16 or 32 bits) or as they are. */
  readonly #expiresAt: Column;
  readonly #expiresBase: number;
  /** Positions in expiry order ((expiresAt, dedupId) ascending); undefined when that is position order. */
  readonly #byExpiry: Uint32Array | undefined;

  private constructor(entries: readonly DedupEntry[]) {
    const n = entries.length;
    this.length = n;
    let max = 0;
    let min = Number.POSITIVE_INFINITY;
    let sorted = true;
    let packable = true;
    this.#hashes = new Uint32Array(n);
    this.#prints = new Uint32Array(n);
    for (let i = 0; i < n; i++) {
      const e = entries[i] as DedupEntry;
      if (e.expiresAt > max) max = e.expiresAt;
      if (e.expiresAt < min) min = e.expiresAt;
      if (i > 0 && expiresBefore(e, entries[i - 1] as DedupEntry)) sorted = false;
      if (packable && !(isUuid(e.dedupId) && isMessageId(e.id))) packable = false;
      this.#hashes[i] = dedupHash(e.dedupId);
      this.#prints[i] = dedupPrint(e.dedupId);
    }
    this.maxExpiresAt = max;
    this.packed = packable;
    this.#ids = packable ? packIds(entries) : textIds(entries);
    const offsetBase = n > 0 ? (entries[0] as DedupEntry).offset : 0;
    const lastOffset = n > 0 ? (entries[n - 1] as DedupEntry).offset : 0;
    [this.#offsets, this.#offsetBase] = column(
      entries,
      (e) => e.offset,
      offsetBase,
      isWhole(entries, (e) => e.offset) ? lastOffset - offsetBase : Number.POSITIVE_INFINITY,
    );
    [this.#expiresAt, this.#expiresBase] = column(
      entries,
      (e) => e.expiresAt,
      n > 0 ? min : 0,
      isWhole(entries, (e) => e.expiresAt) ? max - min : Number.POSITIVE_INFINITY,
    );
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

  /** True while the ids are in memory (see {@link dropIds}). */
  get resident(): boolean {
    return this.#ids !== undefined;
  }

  /** Bytes the ids take in memory while resident (what {@link dropIds} frees; about). */
  get idBytes(): number {
    const ids = this.#ids;
    if (ids === undefined) return 0;
    if (ids.packed !== undefined) return ids.packed.byteLength;
    return ids.text.length + (ids.ends?.byteLength ?? 0); // one byte a character for Latin-1 ids, V8's usual
  }

  /** Frees the ids (the rest stays); {@link restoreIds} brings them back. */
  dropIds(): void {
    this.#ids = undefined;
  }

  /**
   * Takes back the ids from `loaded`, a chunk made from the same dedup
   * segment read again. False (nothing changed) when it does not hold the
   * same entries: the object is not the one this chunk was made from.
   */
  restoreIds(loaded: DedupChunk): boolean {
    if (this.#ids !== undefined) return true;
    if (loaded.length !== this.length || loaded.#ids === undefined) return false;
    for (let i = 0; i < this.length; i++)
      if (
        loaded.#hashes[i] !== this.#hashes[i] ||
        loaded.#prints[i] !== this.#prints[i] ||
        loaded.offsetAt(i) !== this.offsetAt(i) ||
        loaded.expiresAtAt(i) !== this.expiresAtAt(i)
      )
        return false;
    this.#ids = loaded.#ids;
    return true;
  }

  #idsOrThrow(): ChunkIds {
    const ids = this.#ids;
    if (ids === undefined) throw new DedupIdsPagedOut("the dedup ids of this chunk are not in memory");
    return ids;
  }

  /** Entry i's dedup id. Throws {@link DedupIdsPagedOut} while the ids are out. */
  dedupIdAt(i: number): string {
    const ids = this.#idsOrThrow();
    if (ids.packed !== undefined) return unpackUuid(ids.packed, i * PACKED_BYTES);
    return ids.text.slice(start(ids, i), (ids.ends as Uint32Array)[2 * i]);
  }

  /**
   * True when entry i's dedup id is `dedupId` (no allocation). `uuid` is
   * `isUuid(dedupId)`, for a caller that compares one id with many entries.
   * Throws {@link DedupIdsPagedOut} while the ids are out.
   */
  hasDedupId(i: number, dedupId: string, uuid: boolean = isUuid(dedupId)): boolean {
    const ids = this.#idsOrThrow();
    if (ids.packed !== undefined) return uuid && uuidEquals(dedupId, ids.packed, i * PACKED_BYTES);
    const from = start(ids, i);
    return (
      ((ids.ends as Uint32Array)[2 * i] as number) - from === dedupId.length &&
      ids.text.startsWith(dedupId, from)
    );
  }

  /** The hash ({@link dedupHash}) of entry i's dedup id. */
  hashAt(i: number): number {
    return this.#hashes[i] as number;
  }

  /** The second hash ({@link dedupPrint}) of entry i's dedup id. */
  printAt(i: number): number {
    return this.#prints[i] as number;
  }

  /** Entry i's message offset. */
  offsetAt(i: number): number {
    return this.#offsetBase + (this.#offsets[i] as number);
  }

  /** Entry i's `expiresAt`. */
  expiresAtAt(i: number): number {
    return this.#expiresBase + (this.#expiresAt[i] as number);
  }

  /** Entry i as an object. Throws {@link DedupIdsPagedOut} while the ids are out. */
  entryAt(i: number): DedupEntry {
    const ids = this.#idsOrThrow();
    const ends = ids.ends as Uint32Array;
    return {
      dedupId: this.dedupIdAt(i),
      id:
        ids.packed !== undefined
          ? unpackMessageId(ids.packed, i * PACKED_BYTES + UUID_BYTES)
          : ids.text.slice(ends[2 * i], ends[2 * i + 1]),
      offset: this.offsetAt(i),
      expiresAt: this.expiresAtAt(i),
    };
  }

  /** The position of the k-th entry in expiry order ((expiresAt, dedupId) ascending). */
  byExpiry(k: number): number {
    return this.#byExpiry === undefined ? k : (this.#byExpiry[k] as number);
  }

  /** Every entry as an object, ascending offsets. O(n). Throws {@link DedupIdsPagedOut} while the ids are out. */
  entries(): DedupEntry[] {
    return Array.from({ length: this.length }, (_, i) => this.entryAt(i));
  }
}

/** Where entry i's dedup id starts in unpacked ids. */
function start(ids: ChunkIds, i: number): number {
  return i === 0 ? 0 : ((ids.ends as Uint32Array)[2 * i - 1] as number);
}

function packIds(entries: readonly DedupEntry[]): ChunkIds {
  const packed = new Uint8Array(entries.length * PACKED_BYTES);
  entries.forEach((e, i) => {
    packUuid(e.dedupId, packed, i * PACKED_BYTES);
    packMessageId(e.id, packed, i * PACKED_BYTES + UUID_BYTES);
  });
  return { packed, text: "", ends: undefined };
}

function textIds(entries: readonly DedupEntry[]): ChunkIds {
  const ends = new Uint32Array(2 * entries.length);
  const parts: string[] = [];
  let end = 0;
  entries.forEach((e, i) => {
    parts.push(e.dedupId, e.id);
    end += e.dedupId.length;
    ends[2 * i] = end;
    end += e.id.length;
    ends[2 * i + 1] = end;
  });
  return { packed: undefined, text: parts.join(""), ends };
}

const MAX_U32 = 0xffffffff;

/** A column of numbers (see {@link column}). */
type Column = Uint16Array | Uint32Array | Float64Array;

/**
 * A numeric column: differences from `base` in 16 bits when `range` (the
 * largest difference, whole numbers) fits them (a dedup segment's offsets
 * usually do, and its expiries when it covers a minute or less), else in 32
 * bits, else the values as they are.
 */
function column(
  entries: readonly DedupEntry[],
  value: (e: DedupEntry) => number,
  base: number,
  range: number,
): [Column, number] {
  const n = entries.length;
  const out =
    range <= 0xffff ? new Uint16Array(n) : range <= MAX_U32 ? new Uint32Array(n) : new Float64Array(n);
  const from = range <= MAX_U32 ? base : 0;
  for (let i = 0; i < n; i++) out[i] = value(entries[i] as DedupEntry) - from;
  return [out, from];
}

function isWhole(entries: readonly DedupEntry[], value: (e: DedupEntry) => number): boolean {
  for (const e of entries) if (!Number.isSafeInteger(value(e))) return false;
  return true;
}

// Packed ids ------------------------------------------------------------------------------

/** Bytes of a packed UUID. */
const UUID_BYTES = 16;
/** Bytes of a packed message id (26 base-32 digits, 130 bits). */
const MESSAGE_ID_BYTES = 17;
/** Bytes per entry of a packed chunk. */
const PACKED_BYTES = UUID_BYTES + MESSAGE_ID_BYTES;
/** The broker's message id digits (`broker/message-ids.ts`: Crockford base 32). */
const MESSAGE_ID_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
const MESSAGE_ID_DIGIT = new Int8Array(128).fill(-1);
for (let d = 0; d < 32; d++) MESSAGE_ID_DIGIT[MESSAGE_ID_ALPHABET.charCodeAt(d)] = d;
const HEX = "0123456789abcdef";
/** Where the hyphens of a canonical UUID are. */
const isHyphen = (i: number) => i === 8 || i === 13 || i === 18 || i === 23;

/** A lowercase hex digit's value, or -1. */
function hexValue(c: number): number {
  if (c >= 48 && c <= 57) return c - 48;
  if (c >= 97 && c <= 102) return c - 87;
  return -1;
}

/** True for a UUID in canonical form (`8-4-4-4-12` lowercase hex digits): exactly what packing restores. */
export function isUuid(s: string): boolean {
  if (s.length !== 36) return false;
  for (let i = 0; i < 36; i++) {
    const c = s.charCodeAt(i);
    if (isHyphen(i) ? c !== 45 : hexValue(c) < 0) return false;
  }
  return true;
}

/** True for 26 digits of the broker's message id alphabet. */
export function isMessageId(s: string): boolean {
  if (s.length !== 26) return false;
  for (let i = 0; i < 26; i++) {
    const c = s.charCodeAt(i);
    if (c >= 128 || (MESSAGE_ID_DIGIT[c] as number) < 0) return false;
  }
  return true;
}

function packUuid(s: string, out: Uint8Array, at: number): void {
  let o = at;
  for (let i = 0; i < 36; i++) {
    if (isHyphen(i)) continue;
    out[o++] = (hexValue(s.charCodeAt(i)) << 4) | hexValue(s.charCodeAt(i + 1));
    i += 1;
  }
}

function uuidEquals(s: string, bytes: Uint8Array, at: number): boolean {
  let o = at;
  for (let i = 0; i < 36; i++) {
    if (isHyphen(i)) continue;
    if (bytes[o++] !== ((hexValue(s.charCodeAt(i)) << 4) | hexValue(s.charCodeAt(i + 1)))) return false;
    i += 1;
  }
  return true;
}

function unpackUuid(bytes: Uint8Array, at: number): string {
  let s = "";
  for (let b = 0; b < UUID_BYTES; b++) {
    if (b === 4 || b === 6 || b === 8 || b === 10) s += "-";
    const v = bytes[at + b] as number;
    s += (HEX[v >> 4] as string) + (HEX[v & 15] as string);
  }
  return s;
}

/** 26 base-32 digits as a 130-bit big-endian number, in 17 bytes. */
function packMessageId(s: string, out: Uint8Array, at: number): void {
  let acc = 0;
  let bits = 6; // 136 - 130 leading zero bits, pending before the first digit
  let o = at;
  for (let i = 0; i < 26; i++) {
    acc = (acc << 5) | (MESSAGE_ID_DIGIT[s.charCodeAt(i)] as number);
    bits += 5;
    if (bits >= 8) {
      bits -= 8;
      out[o++] = (acc >> bits) & 0xff;
      acc &= (1 << bits) - 1;
    }
  }
}

function unpackMessageId(bytes: Uint8Array, at: number): string {
  let s = "";
  let acc = 0;
  let bits = -6; // the 6 leading zero bits are no digit
  for (let o = at; o < at + MESSAGE_ID_BYTES; o++) {
    acc = (acc << 8) | (bytes[o] as number);
    bits += 8;
    while (bits >= 5) {
      bits -= 5;
      s += MESSAGE_ID_ALPHABET[(acc >> bits) & 31] as string;
    }
    acc &= (1 << bits) - 1;
  }
  return s;
}

/** The order the expiry step forgets entries in: `expiresAt`, then dedup id. */
function expiresBefore(a: DedupEntry, b: DedupEntry): boolean {
  return a.expiresAt !== b.expiresAt ? a.expiresAt < b.expiresAt : a.dedupId < b.dedupId;
}

/** A 32-bit hash of a dedup id (FNV-1a over its UTF-16 code units, then mixed). */
export function dedupHash(dedupId: string): number {
  return finish(hashChars(FNV_SEED, dedupId, 0, dedupId.length));
}

/**
 * A second 32-bit hash of a dedup id, independent of {@link dedupHash}
 * (another seed, the code units in reverse order, another mix): the
 * fingerprint that tells, without the id, that an entry is almost surely not
 * the id looked for.
 */
export function dedupPrint(dedupId: string): number {
  let h = PRINT_SEED;
  for (let i = dedupId.length - 1; i >= 0; i--) h = Math.imul(h ^ dedupId.charCodeAt(i), 0x01000193);
  h ^= h >>> 15;
  h = Math.imul(h, 0x2c1b3c6d);
  h ^= h >>> 12;
  h = Math.imul(h, 0x297a2d39);
  h ^= h >>> 15;
  return h >>> 0;
}

const FNV_SEED = 0x811c9dc5;
const PRINT_SEED = 0x9e3779b9;

function fnvStep(h: number, c: number): number {
  return Math.imul(h ^ c, 0x01000193);
}

function hashChars(seed: number, s: string, start: number, end: number): number {
  let h = seed;
  for (let i = start; i < end; i++) h = fnvStep(h, s.charCodeAt(i));
  return h;
}

/** A final mix, so that ids differing only at the end spread over the table too. */
function finish(hash: number): number {
  let h = hash;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  return h >>> 0;
}
