/**
 * A document assembled from pieces — strings to encode as UTF-8 and byte
 * ranges to copy (e.g. from the previous encode of the same document) — into
 * ONE buffer of exactly its size (model-internal).
 *
 * Why: a head is a few hundred KB written on every commit. Joining its parts
 * into one string, encoding that and splicing copies together made several
 * head-sized strings and buffers of garbage per commit (large strings go to
 * large-object space, buffers are external memory: both are freed only by a
 * full collection once they outlive a scavenge, and a busy broker's RSS
 * carried ~100 MB of them). Pieces cost one allocation, the result.
 */

/** Pieces of a document, in order, and their total size in bytes. */
export class BytePieces {
  readonly #pieces: (string | Uint8Array)[] = [];
  #length = 0;

  /** Bytes so far (where the next piece starts). */
  get length(): number {
    return this.#length;
  }

  /** Appends `text` (as UTF-8); returns its size in bytes. */
  text(text: string): number {
    if (text.length === 0) return 0;
    const bytes = Buffer.byteLength(text);
    this.#pieces.push(text);
    this.#length += bytes;
    return bytes;
  }

  /** Appends a copy of `bytes` (read when {@link toBytes} runs: they must not change before). */
  bytes(bytes: Uint8Array): void {
    if (bytes.byteLength === 0) return;
    this.#pieces.push(bytes);
    this.#length += bytes.byteLength;
  }

  /** The document: every piece written into one new buffer of {@link length} bytes. */
  toBytes(): Uint8Array {
    // Unpooled and not zero-filled: every byte is written below.
    const out = Buffer.allocUnsafeSlow(this.#length);
    let at = 0;
    for (const piece of this.#pieces) {
      if (typeof piece === "string") at += out.write(piece, at);
      else {
        out.set(piece, at);
        at += piece.byteLength;
      }
    }
    if (at !== this.#length) throw new Error(`byte pieces: wrote ${at} of ${this.#length} bytes`);
    return new Uint8Array(out.buffer, out.byteOffset, out.byteLength); // a plain Uint8Array, as before
  }
}
