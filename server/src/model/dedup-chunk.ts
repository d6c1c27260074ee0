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
  /**
   * The ids, packed: when every dedup id is a canonical UUID and every
   * message id a broker-made one, {@link PACKED_BYTES} bytes per entry (the
   * UUID's 16 bytes, then the message id's 26 base-32 digits in 17 bytes);
   * else undefined and the ids are in `#text`.
   */
  readonly #packed: Uint8Array | undefined;
  /** Unpacked: every entry's dedup id then message id, concatenated. */
  readonly #text: string;
  /** Unpacked: end (in `#text`) of entry i's dedup id at 2i, of its message id at 2i+1. */
  readonly #ends: Uint32Array | undefined;
  /** Offsets, as differences from the first (when they fit 32 bits) or as they are. */
  readonly #offsets: Uint32Array | Float64Array;
  readonly #offsetBase: number;
  /** Expiry times, as differences from the earliest (when they fit 32 bits) or as they are. */
  readonly #expiresAt: Uint32Array | Float64Array;
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
    for (let i = 0; i < n; i++) {
      const e = entries[i] as DedupEntry;
      if (e.expiresAt > max) max = e.expiresAt;
      if (e.expiresAt < min) min = e.expiresAt;
      if (i > 0 && expiresBefore(e, entries[i - 1] as DedupEntry)) sorted = false;
      if (packable && !(isUuid(e.dedupId) && isMessageId(e.id))) packable = false;
    }
    this.maxExpiresAt = max;
    if (packable) {
      const packed = new Uint8Array(n * PACKED_BYTES);
      for (let i = 0; i < n; i++) {
        const e = entries[i] as DedupEntry;
        packUuid(e.dedupId, packed, i * PACKED_BYTES);
        packMessageId(e.id, packed, i * PACKED_BYTES + UUID_BYTES);
      }
      this.#packed = packed;
      this.#text = "";
      this.#ends = undefined;
    } else {
      const ends = new Uint32Array(2 * n);
      const parts: string[] = [];
      let end = 0;
      for (let i = 0; i < n; i++) {
        const e = entries[i] as DedupEntry;
        parts.push(e.dedupId, e.id);
        end += e.dedupId.length;
        ends[2 * i] = end;
        end += e.id.length;
        ends[2 * i + 1] = end;
      }
      this.#packed = undefined;
      this.#text = parts.join("");
      this.#ends = ends;
    }
    const offsetBase = n > 0 ? (entries[0] as DedupEntry).offset : 0;
    const lastOffset = n > 0 ? (entries[n - 1] as DedupEntry).offset : 0;
    [this.#offsets, this.#offsetBase] = column(
      entries,
      (e) => e.offset,
      offsetBase,
      lastOffset - offsetBase <= MAX_U32 && isWhole(entries, (e) => e.offset),
    );
    [this.#expiresAt, this.#expiresBase] = column(
      entries,
      (e) => e.expiresAt,
      n > 0 ? min : 0,
      max - min <= MAX_U32 && isWhole(entries, (e) => e.expiresAt),
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

  /** True when the ids are packed (the common case: SDK dedup ids, broker message ids). */
  get packed(): boolean {
    return this.#packed !== undefined;
  }

  #start(i: number): number {
    return i === 0 ? 0 : ((this.#ends as Uint32Array)[2 * i - 1] as number);
  }

  /** Entry i's dedup id. */
  dedupIdAt(i: number): string {
    if (this.#packed !== undefined) return unpackUuid(this.#packed, i * PACKED_BYTES);
    return this.#text.slice(this.#start(i), (this.#ends as Uint32Array)[2 * i]);
  }

  /**
   * True when entry i's dedup id is `dedupId` (no allocation). `uuid` is
   * `isUuid(dedupId)`, for a caller that compares one id with many entries.
   */
  hasDedupId(i: number, dedupId: string, uuid: boolean = isUuid(dedupId)): boolean {
    const packed = this.#packed;
    if (packed !== undefined) return uuid && uuidEquals(dedupId, packed, i * PACKED_BYTES);
    const start = this.#start(i);
    return (
      ((this.#ends as Uint32Array)[2 * i] as number) - start === dedupId.length &&
      this.#text.startsWith(dedupId, start)
    );
  }

  /** The hash ({@link dedupHash}) of entry i's dedup id (no allocation). */
  hashAt(i: number): number {
    if (this.#packed !== undefined) return hashUuidBytes(this.#packed, i * PACKED_BYTES);
    return finish(
      hashChars(FNV_SEED, this.#text, this.#start(i), (this.#ends as Uint32Array)[2 * i] as number),
    );
  }

  /** Entry i's message offset. */
  offsetAt(i: number): number {
    return this.#offsetBase + (this.#offsets[i] as number);
  }

  /** Entry i's `expiresAt`. */
  expiresAtAt(i: number): number {
    return this.#expiresBase + (this.#expiresAt[i] as number);
  }

  /** Entry i as an object. */
  entryAt(i: number): DedupEntry {
    const packed = this.#packed;
    const ends = this.#ends as Uint32Array;
    return {
      dedupId: this.dedupIdAt(i),
      id:
        packed !== undefined
          ? unpackMessageId(packed, i * PACKED_BYTES + UUID_BYTES)
          : this.#text.slice(ends[2 * i], ends[2 * i + 1]),
      offset: this.offsetAt(i),
      expiresAt: this.expiresAtAt(i),
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

const MAX_U32 = 0xffffffff;

/** A numeric column: 32-bit differences from `base` when `small`, else the values as they are. */
function column(
  entries: readonly DedupEntry[],
  value: (e: DedupEntry) => number,
  base: number,
  small: boolean,
): [Uint32Array | Float64Array, number] {
  const out = small ? new Uint32Array(entries.length) : new Float64Array(entries.length);
  const from = small ? base : 0;
  for (let i = 0; i < entries.length; i++) out[i] = value(entries[i] as DedupEntry) - from;
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

/** The string hash of the canonical UUID whose bytes are at `at`, computed on the bytes. */
function hashUuidBytes(bytes: Uint8Array, at: number): number {
  let h = FNV_SEED;
  for (let b = 0; b < UUID_BYTES; b++) {
    if (b === 4 || b === 6 || b === 8 || b === 10) h = fnvStep(h, 45);
    const v = bytes[at + b] as number;
    h = fnvStep(fnvStep(h, HEX.charCodeAt(v >> 4)), HEX.charCodeAt(v & 15));
  }
  return finish(h);
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

const FNV_SEED = 0x811c9dc5;

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
