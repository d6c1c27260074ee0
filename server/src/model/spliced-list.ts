/**
 * A JSON list of a document that is written again on every encode, most of
 * its entries unchanged since the last one: the bytes of those are copied
 * from the last encode's output, and only new or changed entries are encoded
 * (model-internal; the head encoder's tail, dedup ids and segment indexes).
 *
 * An entry is identified by up to two values compared by identity (records
 * never change in place: a changed one is a new object or string) and
 * ordered by an offset. Between two encodes a list typically grows at its
 * end (enqueues), loses entries at its front (a seal) or here and there (an
 * expired dedup id, a settled redriven message), or has one entry replaced
 * (a segment's `gone` set): each run of entries still in the last encode, in
 * its order, is one copy of bytes.
 *
 * Correctness rests on one rule: bytes are copied only for an entry whose
 * keys are identical to the one they were encoded from, in an output that
 * nothing has changed since (encoded documents are never written to). Any
 * order or duplicate at most costs reuse, never the bytes.
 */
import type { BytePieces } from "./byte-pieces.ts";

/** How a list's entries are told apart, ordered and encoded. */
export interface ListEntries<E> {
  /** Identity of an entry (compared with ===). */
  keyOf(entry: E): unknown;
  /** A second identity (e.g. a part that is replaced on its own), or undefined. */
  secondKeyOf(entry: E): unknown;
  /** Position in the list's order (ascending, as the list iterates). */
  offsetOf(entry: E): number;
  /** Appends the entry's canonical JSON to `out` (a large one in parts, see `record-encoder.ts`). */
  writeJson(out: BytePieces, entry: E): void;
}

/**
 * One encode's entries: their keys, offsets, and where each one's JSON ends
 * (bytes from the list's start). The arrays keep their length between
 * encodes (only `size` is reset): emptied and grown again, they would be
 * reallocated on every commit.
 */
class Columns {
  readonly keys: unknown[] = [];
  readonly secondKeys: unknown[] = [];
  readonly offsets: number[] = [];
  readonly ends: number[] = [];
  /** Entries held: the first `size` of each array. */
  size = 0;
  #endsSize = 0;

  add(key: unknown, secondKey: unknown, offset: number): void {
    const at = this.size++;
    this.keys[at] = key;
    this.secondKeys[at] = secondKey;
    this.offsets[at] = offset;
  }

  addEnd(end: number): void {
    this.ends[this.#endsSize++] = end;
  }

  clear(): void {
    // The keys are the entries themselves: not kept alive past their list.
    this.keys.fill(undefined, 0, this.size);
    this.secondKeys.fill(undefined, 0, this.size);
    this.size = 0;
    this.#endsSize = 0;
  }
}

const NO_BYTES = new Uint8Array(0);

/** A list's JSON (entries joined by commas, no brackets) as the last remembered encode wrote it. */
export class SplicedList<E> {
  readonly #entries: ListEntries<E>;
  /** The remembered encode's entries, their bytes at `#bytes[#start…]`. */
  #last = new Columns();
  #bytes: Uint8Array = NO_BYTES;
  #start = 0;
  /** The entries of the write not yet remembered (reused between encodes: no garbage). */
  #next = new Columns();
  #nextStart = 0;

  constructor(entries: ListEntries<E>) {
    this.#entries = entries;
  }

  /** Appends the list's JSON for `entries` to `out`, copying what the remembered encode has of it. */
  write(out: BytePieces, entries: Iterable<E>): void {
    const how = this.#entries;
    const last = this.#last;
    const next = this.#next;
    next.clear();
    this.#nextStart = out.length;
    const lastCount = last.size;
    let written = 0; // entries whose bytes are in `out`
    let at = 0; // bytes of the list in `out`
    let runFrom = -1; // a run of remembered entries [runFrom, runTo) to copy, pending
    let runTo = -1;
    const flush = () => {
      if (runFrom < 0) return;
      if (written > 0) at += out.text(",");
      const from = runFrom === 0 ? 0 : (last.ends[runFrom - 1] as number) + 1;
      const to = last.ends[runTo - 1] as number;
      out.bytes(this.#bytes.subarray(this.#start + from, this.#start + to));
      const shift = at - from;
      for (let i = runFrom; i < runTo; i++) next.addEnd(shift + (last.ends[i] as number));
      at += to - from;
      written += runTo - runFrom;
      runFrom = -1;
    };
    let j = 0;
    for (const entry of entries) {
      const key = how.keyOf(entry);
      const second = how.secondKeyOf(entry);
      const offset = how.offsetOf(entry);
      while (j < lastCount && (last.offsets[j] as number) < offset) j += 1;
      next.add(key, second, offset);
      if (j < lastCount && last.keys[j] === key && last.secondKeys[j] === second) {
        if (runTo !== j) flush();
        if (runFrom < 0) runFrom = j;
        runTo = j + 1;
        j += 1;
        continue;
      }
      flush();
      if (written > 0) at += out.text(",");
      const before = out.length;
      how.writeJson(out, entry);
      at += out.length - before;
      next.addEnd(at);
      written += 1;
    }
    flush();
  }

  /**
   * The JSON bytes the remembered encode wrote for the entry with these
   * keys at `offset`, or undefined when that encode did not hold it
   * unchanged. A view of that encode's output (never written to): other
   * objects made of the same entries copy it instead of encoding them again.
   */
  remembered(key: unknown, secondKey: unknown, offset: number): Uint8Array | undefined {
    const last = this.#last;
    const offsets = last.offsets;
    let lo = 0;
    let hi = last.size;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if ((offsets[mid] as number) < offset) lo = mid + 1;
      else hi = mid;
    }
    if (lo >= last.size || offsets[lo] !== offset) return undefined;
    if (last.keys[lo] !== key || last.secondKeys[lo] !== secondKey) return undefined;
    const from = lo === 0 ? 0 : (last.ends[lo - 1] as number) + 1; // past the comma
    const to = last.ends[lo] as number;
    return this.#bytes.subarray(this.#start + from, this.#start + to);
  }

  /**
   * After the output of the last {@link write} was made: that write is what
   * the next one copies from. (A write never remembered, e.g. an encode that
   * failed part-way, is forgotten by the next.)
   */
  remember(bytes: Uint8Array): void {
    const last = this.#last;
    this.#last = this.#next;
    this.#next = last;
    this.#bytes = bytes;
    this.#start = this.#nextStart;
  }
}
