/**
 * An immutable object (a message segment or a dedup segment) written in the
 * background, put-if-absent, ahead of the head write that will reference it.
 *
 * A commit that seals inline writes the segment and then the head, two
 * store round trips in a row; written ahead, the segment's PUT runs while
 * the commits go on, and the first commit after it landed indexes it. What
 * it holds may have changed meanwhile (messages settled, a takeover): the
 * head store checks that when it takes the object, and deletes one it
 * cannot use (no head ever references it).
 */
import { sha256Hex } from "../model/segment-codec.ts";
import type { ObjectStore } from "../store/object-store.ts";

/** One object being written ahead (see the module header). */
export interface WrittenAhead<T> {
  /** Its name under the shard's segment prefix. */
  readonly name: string;
  /** The epoch it was written under: a later epoch's head does not take it. */
  readonly epoch: number;
  /** What was written (the records or entries, in the object's order). */
  readonly contents: T;
  readonly bytes: number;
  readonly sha256: string;
  readonly createdAt: number;
  /** Settles when the put-if-absent has ended, either way (never rejects). */
  readonly written: Promise<void>;
  outcome: "writing" | "written" | "failed";
}

/** Starts writing `bytes` at `key` put-if-absent; the returned record tracks the write. */
export function writeAhead<T>(
  store: ObjectStore,
  key: string,
  bytes: Uint8Array,
  object: { readonly name: string; readonly epoch: number; readonly contents: T; readonly createdAt: number },
): WrittenAhead<T> {
  let ahead!: WrittenAhead<T>;
  const written = store.put(key, bytes, { ifAbsent: true }).then(
    () => {
      ahead.outcome = "written";
    },
    () => {
      ahead.outcome = "failed";
    },
  );
  ahead = { ...object, bytes: bytes.byteLength, sha256: sha256Hex(bytes), written, outcome: "writing" };
  return ahead;
}
