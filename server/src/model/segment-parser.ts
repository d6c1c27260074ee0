/**
 * The strict parsers of the immutable objects a v2 head indexes: segments
 * (`"casq.segment.v1"`, sealed messages), index segments (`"casq.segindex.v1"`,
 * index entries of sealed segments), dedup segments (`"casq.dedup.v1"`)
 * and dead-letter segments (`"casq.deadletters.v1"`), written by
 * `segment-codec.ts`. Each object's checksum is verified by the caller; the
 * parser checks its fields and that it is the object the head's index entry
 * describes (shard, count, offsets), and refuses anything else with
 * `CasqError("data_loss")`.
 */
import { CasqError } from "../errors.ts";
import {
  DEAD_LETTER_SEGMENT_FORMAT,
  DEDUP_SEGMENT_FORMAT,
  INDEX_SEGMENT_FORMAT,
  SEGMENT_FORMAT,
} from "./document-formats.ts";
import { deadLetter, dedupEntry, message } from "./record-parser.ts";
import {
  type DeadLetterSegmentRef,
  type DedupSegmentRef,
  type IndexSegmentRef,
  type SegmentRef,
  segmentRef,
} from "./shard-document-parser.ts";
import type { DeadLetterRecord, DedupEntry, MessageRecord } from "./shard-records.ts";
import { array, Corrupt, decodeJson, fail, object } from "./strict-json.ts";

const json = JSON.stringify;

/**
 * Parses a segment object's bytes (its checksum already verified by the
 * caller) and checks it against the head's index entry. Throws
 * `CasqError("data_loss")` when it is not the segment the head describes.
 */
export function parseSegmentDocument(
  bytes: Uint8Array,
  expect: {
    readonly queue: string;
    readonly shard: number;
    readonly ref: Pick<SegmentRef, "name" | "first" | "last" | "count">;
  },
): MessageRecord[] {
  const where = `segment ${expect.ref.name} of queue ${expect.queue} shard ${expect.shard}`;
  try {
    let root: unknown;
    try {
      root = decodeJson(bytes);
    } catch {
      fail("segment", "not valid UTF-8 JSON");
    }
    const o = object(root, "segment", ["format", "queue", "shard", "messages"]);
    if (o.format !== SEGMENT_FORMAT)
      fail("segment.format", `expected ${SEGMENT_FORMAT}, got ${json(o.format)}`);
    if (o.queue !== expect.queue || o.shard !== expect.shard) fail("segment", "belongs to another shard");
    const records = array(o.messages, "segment.messages").map(
      (v, i) => message(v, `segment.messages[${i}]`, false).msg,
    );
    const ref = expect.ref;
    if (records.length !== ref.count)
      fail("segment.messages", `holds ${records.length} messages, the head says ${ref.count}`);
    let previous = -1;
    for (const r of records) {
      if (r.offset <= previous) fail("segment.messages", "offsets are not strictly ascending");
      previous = r.offset;
    }
    if (records[0]?.offset !== ref.first || previous !== ref.last)
      fail("segment.messages", "offsets do not match the head's first/last");
    return records;
  } catch (error) {
    if (!(error instanceof Corrupt)) throw error;
    throw new CasqError(
      "data_loss",
      `${where} is corrupt at ${error.message}; refusing to load or overwrite the shard — restore the segment from a backup`,
      { queue: expect.queue, shard: expect.shard },
      { cause: error },
    );
  }
}

/**
 * Parses an index segment object's bytes (its checksum already verified by
 * the caller) and checks it against the head's entry: the index entries of
 * `ref.count` segments, strictly ascending and not overlapping, from
 * `ref.first` to `ref.last`. Throws `CasqError("data_loss")` otherwise.
 */
export function parseIndexSegmentDocument(
  bytes: Uint8Array,
  expect: { readonly queue: string; readonly shard: number; readonly ref: IndexSegmentRef },
): SegmentRef[] {
  const where = `index segment ${expect.ref.name} of queue ${expect.queue} shard ${expect.shard}`;
  try {
    let root: unknown;
    try {
      root = decodeJson(bytes);
    } catch {
      fail("index_segment", "not valid UTF-8 JSON");
    }
    const o = object(root, "index_segment", ["format", "queue", "shard", "segments"]);
    if (o.format !== INDEX_SEGMENT_FORMAT)
      fail("index_segment.format", `expected ${INDEX_SEGMENT_FORMAT}, got ${json(o.format)}`);
    if (o.queue !== expect.queue || o.shard !== expect.shard)
      fail("index_segment", "belongs to another shard");
    const refs = array(o.segments, "index_segment.segments").map((v, i) =>
      segmentRef(v, `index_segment.segments[${i}]`),
    );
    const ref = expect.ref;
    if (refs.length !== ref.count)
      fail("index_segment.segments", `lists ${refs.length} segments, the head says ${ref.count}`);
    let end = -1;
    for (const r of refs) {
      if (r.first <= end) fail("index_segment.segments", "segments are not ascending and disjoint");
      end = r.last;
    }
    if (refs[0]?.first !== ref.first || end !== ref.last)
      fail("index_segment.segments", "offsets do not match the head's first/last");
    return refs;
  } catch (error) {
    if (!(error instanceof Corrupt)) throw error;
    throw new CasqError(
      "data_loss",
      `${where} is corrupt at ${error.message}; refusing to load or overwrite the shard — restore the segment from a backup`,
      { queue: expect.queue, shard: expect.shard },
      { cause: error },
    );
  }
}

/**
 * Parses a dedup segment object's bytes (its checksum already verified by
 * the caller) and checks it against the head's index entry. Throws
 * `CasqError("data_loss")` when it is not the dedup segment the head describes.
 */
export function parseDedupSegmentDocument(
  bytes: Uint8Array,
  expect: { readonly queue: string; readonly shard: number; readonly ref: DedupSegmentRef },
): DedupEntry[] {
  const where = `dedup segment ${expect.ref.name} of queue ${expect.queue} shard ${expect.shard}`;
  try {
    let root: unknown;
    try {
      root = decodeJson(bytes);
    } catch {
      fail("dedup_segment", "not valid UTF-8 JSON");
    }
    const o = object(root, "dedup_segment", ["format", "queue", "shard", "entries"]);
    if (o.format !== DEDUP_SEGMENT_FORMAT)
      fail("dedup_segment.format", `expected ${DEDUP_SEGMENT_FORMAT}, got ${json(o.format)}`);
    if (o.queue !== expect.queue || o.shard !== expect.shard)
      fail("dedup_segment", "belongs to another shard");
    const entries = array(o.entries, "dedup_segment.entries").map((v, i) =>
      dedupEntry(v, `dedup_segment.entries[${i}]`),
    );
    const ref = expect.ref;
    if (entries.length !== ref.count)
      fail("dedup_segment.entries", `holds ${entries.length} entries, the head says ${ref.count}`);
    let previous = -1;
    let latest = 0;
    for (const e of entries) {
      if (e.offset <= previous) fail("dedup_segment.entries", "offsets are not strictly ascending");
      previous = e.offset;
      latest = Math.max(latest, e.expiresAt);
    }
    if (entries[0]?.offset !== ref.first || previous !== ref.last)
      fail("dedup_segment.entries", "offsets do not match the head's first/last");
    if (latest !== ref.expiresAt)
      fail("dedup_segment.entries", "latest expires_at does not match the head's");
    return entries;
  } catch (error) {
    if (!(error instanceof Corrupt)) throw error;
    throw new CasqError(
      "data_loss",
      `${where} is corrupt at ${error.message}; refusing to load or overwrite the shard — restore the segment from a backup`,
      { queue: expect.queue, shard: expect.shard },
      { cause: error },
    );
  }
}

/**
 * Parses a dead-letter segment object's bytes (its checksum already
 * verified by the caller) and checks it against the head's index entry
 * under `subscription`. Throws `CasqError("data_loss")` when it is not the
 * dead-letter segment the head describes.
 */
export function parseDeadLetterSegmentDocument(
  bytes: Uint8Array,
  expect: {
    readonly queue: string;
    readonly shard: number;
    readonly subscription: string;
    readonly ref: DeadLetterSegmentRef;
  },
): DeadLetterRecord[] {
  const where = `dead-letter segment ${expect.ref.name} of queue ${expect.queue} shard ${expect.shard}`;
  try {
    let root: unknown;
    try {
      root = decodeJson(bytes);
    } catch {
      fail("dead_letter_segment", "not valid UTF-8 JSON");
    }
    const o = object(root, "dead_letter_segment", [
      "format",
      "queue",
      "shard",
      "subscription",
      "dead_letters",
    ]);
    if (o.format !== DEAD_LETTER_SEGMENT_FORMAT)
      fail("dead_letter_segment.format", `expected ${DEAD_LETTER_SEGMENT_FORMAT}, got ${json(o.format)}`);
    if (o.queue !== expect.queue || o.shard !== expect.shard)
      fail("dead_letter_segment", "belongs to another shard");
    if (o.subscription !== expect.subscription)
      fail(
        "dead_letter_segment.subscription",
        `belongs to ${json(o.subscription)}, the head indexes it under ${json(expect.subscription)}`,
      );
    const letters = array(o.dead_letters, "dead_letter_segment.dead_letters").map((v, i) =>
      deadLetter(v, `dead_letter_segment.dead_letters[${i}]`),
    );
    const ref = expect.ref;
    if (letters.length !== ref.count)
      fail(
        "dead_letter_segment.dead_letters",
        `holds ${letters.length} dead letters, the head says ${ref.count}`,
      );
    const offsets = new Set<number>();
    let first = Number.POSITIVE_INFINITY;
    let last = Number.NEGATIVE_INFINITY;
    for (const dl of letters) {
      const offset = dl.message.offset;
      if (offsets.has(offset)) fail("dead_letter_segment.dead_letters", `offset ${offset} appears twice`);
      offsets.add(offset);
      first = Math.min(first, offset);
      last = Math.max(last, offset);
    }
    if (first !== ref.first || last !== ref.last)
      fail("dead_letter_segment.dead_letters", "offsets do not match the head's first/last");
    return letters;
  } catch (error) {
    if (!(error instanceof Corrupt)) throw error;
    throw new CasqError(
      "data_loss",
      `${where} is corrupt at ${error.message}; refusing to load or overwrite the shard — restore the segment from a backup`,
      { queue: expect.queue, shard: expect.shard },
      { cause: error },
    );
  }
}
