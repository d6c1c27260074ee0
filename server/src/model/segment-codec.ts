/**
 * Segment objects (`"format": "casq.segment.v1"`): the immutable part of a v2
 * shard. A segment holds the contents of sealed messages, ascending offsets,
 * in the same message JSON as the head (no `targets`: a targeted message
 * always lives in the head). The head's index entry carries its size and
 * SHA-256, checked on every read; parsing is in `segment-parser.ts`.
 *
 * Dedup segments (`"format": "casq.dedup.v1"`) hold sealed dedup entries
 * (ascending message offsets) under the same prefix, named `….dedup.json`,
 * so that listing, the takeover sweep and deleting a queue treat both alike.
 * So do dead-letter segments (`"format": "casq.deadletters.v1"`, `….dead.json`):
 * sealed dead letters of one subscription, in the order they died. And index
 * segments (`"format": "casq.segindex.v1"`, `….index.json`): the head's index
 * entries of sealed segments nothing has touched (`index-segments.ts`).
 *
 * Key: `queues/<queue>/<shard>/seg/<first offset, 20 digits>-<epoch>-<sequence>.json`.
 * The epoch and the writer's sequence make every name unique, so a deposed
 * leader and its successor never write the same key; the first offset keeps
 * a listing in offset order.
 */
import { createHash } from "node:crypto";
import { BytePieces } from "./byte-pieces.ts";
import {
  DEAD_LETTER_SEGMENT_FORMAT,
  DEDUP_SEGMENT_FORMAT,
  INDEX_SEGMENT_FORMAT,
  SEGMENT_FORMAT,
} from "./document-formats.ts";
import { deadLetterJson, dedupEntryJson, writeMessageJson } from "./record-encoder.ts";
import type { DeadLetterRecord, DedupEntry, MessageRecord } from "./shard-records.ts";

// Each encoder writes its pieces straight into one buffer of the object's size (`byte-pieces.ts`):
// no segment-sized string of garbage (a segment is about as large as the head).

/**
 * A record's canonical JSON bytes already made (by the last head encode,
 * `head-encoder.ts`), or undefined: an encoder copies them instead of
 * encoding the record again.
 */
export type EncodedRecord<R> = (record: R) => Uint8Array | undefined;

/** The segment object bytes for `records` (ascending offsets); `encoded` gives those already made. */
export function encodeSegment(
  queue: string,
  shard: number,
  records: readonly MessageRecord[],
  encoded?: EncodedRecord<MessageRecord>,
): Uint8Array {
  const out = new BytePieces();
  out.text(`{"format":"${SEGMENT_FORMAT}","queue":${JSON.stringify(queue)},"shard":${shard},"messages":[`);
  records.forEach((r, i) => {
    if (i > 0) out.text(",");
    const made = encoded?.(r);
    if (made !== undefined) out.bytes(made);
    else writeMessageJson(out, r);
  });
  out.text("]}");
  return out.toBytes();
}

/** The dedup segment object bytes for `entries` (ascending offsets); `encoded` gives those already made. */
export function encodeDedupSegment(
  queue: string,
  shard: number,
  entries: readonly DedupEntry[],
  encoded?: EncodedRecord<DedupEntry>,
): Uint8Array {
  const out = new BytePieces();
  out.text(
    `{"format":"${DEDUP_SEGMENT_FORMAT}","queue":${JSON.stringify(queue)},"shard":${shard},"entries":[`,
  );
  entries.forEach((e, i) => {
    if (i > 0) out.text(",");
    const made = encoded?.(e);
    if (made !== undefined) out.bytes(made);
    else out.text(dedupEntryJson(e));
  });
  out.text("]}");
  return out.toBytes();
}

/** The dead-letter segment object bytes for `letters` of `subscription` (oldest first). */
export function encodeDeadLetterSegment(
  queue: string,
  shard: number,
  subscription: string,
  letters: readonly DeadLetterRecord[],
): Uint8Array {
  const out = new BytePieces();
  out.text(
    `{"format":"${DEAD_LETTER_SEGMENT_FORMAT}","queue":${JSON.stringify(queue)},"shard":${shard},"subscription":${JSON.stringify(subscription)},"dead_letters":[`,
  );
  letters.forEach((dl, i) => {
    out.text((i > 0 ? "," : "") + deadLetterJson(dl));
  });
  out.text("]}");
  return out.toBytes();
}

/** The index segment object bytes for `entries`, the head's index entries (JSON) of its segments, ascending offsets. */
export function encodeIndexSegment(queue: string, shard: number, entries: readonly string[]): Uint8Array {
  const out = new BytePieces();
  out.text(
    `{"format":"${INDEX_SEGMENT_FORMAT}","queue":${JSON.stringify(queue)},"shard":${shard},"segments":[`,
  );
  entries.forEach((e, i) => {
    out.text((i > 0 ? "," : "") + e);
  });
  out.text("]}");
  return out.toBytes();
}

/** Lowercase hex SHA-256 of `bytes`. */
export function sha256Hex(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

/** The object name of a segment whose first message is at `first`, written in `epoch`; `unique` (base 36) tells the writer's segments apart. */
export function segmentName(first: number, epoch: number, unique: string): string {
  return `${String(first).padStart(20, "0")}-${epoch}-${unique}.json`;
}

/** The object name of a dedup segment whose first entry is at offset `first` (see {@link segmentName}). */
export function dedupSegmentName(first: number, epoch: number, unique: string): string {
  return `${String(first).padStart(20, "0")}-${epoch}-${unique}.dedup.json`;
}

/** The object name of a dead-letter segment whose lowest offset is `first` (see {@link segmentName}). */
export function deadLetterSegmentName(first: number, epoch: number, unique: string): string {
  return `${String(first).padStart(20, "0")}-${epoch}-${unique}.dead.json`;
}

/** The object name of an index segment whose first segment starts at offset `first` (see {@link segmentName}). */
export function indexSegmentName(first: number, epoch: number, unique: string): string {
  return `${String(first).padStart(20, "0")}-${epoch}-${unique}.index.json`;
}

/** The key prefix under which a shard's segments (message, index, dedup and dead-letter segments) live. */
export function segmentPrefix(queue: string, shard: number): string {
  return `queues/${queue}/${shard}/seg/`;
}

/** Any segment's name (message, index, dedup or dead-letter): first offset, epoch, unique part. */
const ANY_SEGMENT_NAME = /^([0-9]{20})-([0-9]{1,15})-[0-9a-z]{1,32}(?:\.dedup|\.dead|\.index)?\.json$/;

/** The epoch a segment, index, dedup or dead-letter segment name was written in (undefined for a name that is none). */
export function segmentEpoch(name: string): number | undefined {
  const match = ANY_SEGMENT_NAME.exec(name);
  return match ? Number(match[2]) : undefined;
}

/** The first offset a segment, index, dedup or dead-letter segment name gives (undefined for a name that is none). */
export function segmentFirst(name: string): number | undefined {
  const match = ANY_SEGMENT_NAME.exec(name);
  return match ? Number(match[1]) : undefined;
}
