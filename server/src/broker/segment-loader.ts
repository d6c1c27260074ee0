/**
 * Reading the segments a v2 head references, for a leader loading its shard
 * and for read-only snapshots alike.
 *
 * Each segment is read once (`cache`), checked against the size and SHA-256
 * in the head's index and parsed. A referenced segment that is missing or
 * fails its checksum refuses the shard with `data_loss` — never skipped,
 * never overwritten — unless the head itself moved since it was read: a
 * leader may have retired and deleted that segment in between, so the
 * caller re-reads the head (`"moved"`).
 *
 * Index segments (the index entries of segments the head does not list
 * itself) are read first, all of them, with the same checks.
 * Dedup segments are read the same way, but only those whose latest
 * `expires_at` is after the reader's `now`: an expired one remembers
 * nothing, so a takeover reads just the dedup segments of one window.
 * Dead-letter segments are all read (every one the head indexes holds a
 * live dead letter), with the same checks.
 */

import { CasqError } from "../errors.ts";
import { DedupChunk } from "../model/dedup-chunk.ts";
import { sealedSegmentRefs } from "../model/index-segment-refs.ts";
import { segmentPrefix, sha256Hex } from "../model/segment-codec.ts";
import {
  parseDeadLetterSegmentDocument,
  parseDedupSegmentDocument,
  parseIndexSegmentDocument,
  parseSegmentDocument,
} from "../model/segment-parser.ts";
import type {
  DeadLetterSegmentRef,
  DedupSegmentRef,
  IndexSegmentRef,
  SegmentRef,
  ShardDocument,
} from "../model/shard-document-parser.ts";
import type { DeadLetterRecord, MessageMeta, MessageRecord } from "../model/shard-records.ts";
import type { ObjectStore, StoredObject } from "../store/object-store.ts";
import { isStoreError } from "../store/store-errors.ts";

const KIND_NAMES = {
  index: "index segment",
  messages: "segment",
  dedup: "dedup segment",
  dead: "dead-letter segment",
} as const;

/** Segment reads in flight at once while loading a head. */
const READ_PARALLELISM = 8;

/**
 * What a loader keeps of a message segment it read (default: the whole
 * records). A leader keeps the meta and offers the bodies to its page cache,
 * so a takeover does not hold every body of the shard at once.
 */
export type KeepMessages = (
  name: string,
  records: readonly MessageRecord[],
  bytes: number,
) => readonly MessageMeta[];

/** Where the dedup segments a head references go, and the time that tells which are still live. */
export interface DedupSegmentCache {
  readonly cache: Map<string, DedupChunk>;
  readonly now: number;
  /** Called with each chunk as it is read (the leader pages its ids out at once, beyond its budget). */
  readonly loaded?: (chunk: DedupChunk) => void;
}

/**
 * Loads into `indexes` every index segment `doc` (read at `headKey` with
 * etag `headEtag`) references and `indexes` lacks (the entries it lists),
 * then into `cache` every segment `doc` references, itself or through an
 * index segment, and `cache` lacks, and into `dedup.cache` every
 * dedup segment it references that is live at `dedup.now`, and into
 * `dead` every dead-letter segment it references (when given); of each
 * message segment, `cache` gets what `keep` returns. Message segments for
 * which `leaveCold` says so are not read (they will be cold, and are read
 * and checked when warmed: `model/cold-segments.ts`). Resolves
 * `"moved"` when a segment was gone because the head changed meanwhile.
 * Rejects with `data_loss` for a missing or corrupt segment of the current
 * head, `unavailable` when the store fails.
 */
export async function loadSegments(
  store: ObjectStore,
  headKey: string,
  headEtag: string,
  doc: ShardDocument,
  indexes: Map<string, readonly SegmentRef[]>,
  cache: Map<string, readonly MessageMeta[]>,
  dedup?: DedupSegmentCache,
  dead?: Map<string, readonly DeadLetterRecord[]>,
  keep: KeepMessages = (_name, records) => records,
  leaveCold: (ref: SegmentRef) => boolean = () => false,
): Promise<"ok" | "moved"> {
  const where = { queue: doc.queue, shard: doc.shard };
  type Wanted =
    | { readonly kind: "index"; readonly ref: IndexSegmentRef }
    | { readonly kind: "messages"; readonly ref: SegmentRef }
    | { readonly kind: "dedup"; readonly ref: DedupSegmentRef }
    | { readonly kind: "dead"; readonly ref: DeadLetterSegmentRef; readonly subscription: string };
  const prefix = segmentPrefix(doc.queue, doc.shard);
  const expect = { queue: doc.queue, shard: doc.shard };
  const readAll = async (wanted: readonly Wanted[]): Promise<"ok" | "moved"> => {
    for (let i = 0; i < wanted.length; i += READ_PARALLELISM) {
      const chunk = wanted.slice(i, i + READ_PARALLELISM);
      const loaded = await Promise.all(
        chunk.map(async (w) => ({ w, stored: await read(store, prefix + w.ref.name, where) })),
      );
      for (const { w, stored } of loaded) {
        const ref = w.ref;
        const problem =
          stored === undefined
            ? "is missing"
            : stored.body.byteLength !== ref.bytes || sha256Hex(stored.body) !== ref.sha256
              ? "fails its checksum"
              : undefined;
        if (problem !== undefined) {
          const head = await read(store, headKey, where);
          if (head?.etag !== headEtag) return "moved";
          throw new CasqError(
            "data_loss",
            `${KIND_NAMES[w.kind]} ${prefix}${ref.name}, referenced by the shard's head, ${problem}; refusing to load or overwrite the shard — restore the segment from a backup`,
            where,
          );
        }
        const body = (stored as StoredObject).body;
        if (w.kind === "index")
          indexes.set(ref.name, parseIndexSegmentDocument(body, { ...expect, ref: w.ref }));
        else if (w.kind === "messages")
          cache.set(
            ref.name,
            keep(ref.name, parseSegmentDocument(body, { ...expect, ref: w.ref }), body.byteLength),
          );
        else if (w.kind === "dedup") {
          const chunk = DedupChunk.from(parseDedupSegmentDocument(body, { ...expect, ref: w.ref }));
          dedup?.cache.set(ref.name, chunk);
          dedup?.loaded?.(chunk);
        } else
          dead?.set(
            ref.name,
            parseDeadLetterSegmentDocument(body, { ...expect, subscription: w.subscription, ref: w.ref }),
          );
      }
    }
    return "ok";
  };
  // Index segments first: they list the segments the head does not list itself.
  const indexed = await readAll(
    doc.indexSegments.filter((ref) => !indexes.has(ref.name)).map((ref) => ({ kind: "index", ref }) as const),
  );
  if (indexed === "moved") return "moved";
  const all = sealedSegmentRefs(
    doc,
    (ref) => indexes.get(ref.name),
    (what) => {
      throw new CasqError(
        "data_loss",
        `shard's head is inconsistent (${what}); refusing to load or overwrite it`,
        where,
      );
    },
  );
  const wanted: Wanted[] = all
    .filter((ref) => !cache.has(ref.name) && !leaveCold(ref))
    .map((ref) => ({ kind: "messages", ref }) as const);
  if (dedup !== undefined)
    for (const ref of doc.dedupSegments)
      if (ref.expiresAt > dedup.now && !dedup.cache.has(ref.name)) wanted.push({ kind: "dedup", ref });
  if (dead !== undefined)
    for (const sub of doc.subscriptions)
      for (const ref of sub.deadLetterSegments)
        if (!dead.has(ref.name)) wanted.push({ kind: "dead", ref, subscription: sub.name });
  return readAll(wanted);
}

/** A message segment read on demand by a leader: its records, or what is wrong with the object. */
export type SegmentRead =
  | { readonly records: readonly MessageRecord[]; readonly bytes: number }
  | { readonly problem: "is missing" | "fails its checksum" };

/**
 * Reads the message segment `ref` of queue `queue` shard `shard`, checked
 * against its size and SHA-256 (the leader's page-in of bodies: see
 * `segment-pager.ts`). Rejects with `unavailable` when the store fails, and
 * `data_loss` when the object parses wrong.
 */
export async function readMessageSegment(
  store: ObjectStore,
  queue: string,
  shard: number,
  ref: Pick<SegmentRef, "name" | "first" | "last" | "count" | "bytes" | "sha256">,
): Promise<SegmentRead> {
  const read = await readChecked(store, queue, shard, ref);
  if ("problem" in read) return read;
  return { records: parseSegmentDocument(read.body, { queue, shard, ref }), bytes: read.body.byteLength };
}

/** A dedup segment read on demand by a leader: its entries, or what is wrong with the object. */
export type DedupSegmentRead =
  | { readonly chunk: DedupChunk }
  | { readonly problem: "is missing" | "fails its checksum" };

/**
 * Reads the dedup segment `ref` of queue `queue` shard `shard`, checked
 * against its size and SHA-256 (the leader's page-in of dedup ids: see
 * `dedup-id-pager.ts`). Rejects with `unavailable` when the store fails, and
 * `data_loss` when the object parses wrong.
 */
export async function readDedupSegment(
  store: ObjectStore,
  queue: string,
  shard: number,
  ref: DedupSegmentRef,
): Promise<DedupSegmentRead> {
  const read = await readChecked(store, queue, shard, ref);
  if ("problem" in read) return read;
  return { chunk: DedupChunk.from(parseDedupSegmentDocument(read.body, { queue, shard, ref })) };
}

/** The bytes of the segment object `ref` names, or what is wrong with it (missing, or not the size and SHA-256 the head gives). */
async function readChecked(
  store: ObjectStore,
  queue: string,
  shard: number,
  ref: { readonly name: string; readonly bytes: number; readonly sha256: string },
): Promise<{ readonly body: Uint8Array } | { readonly problem: "is missing" | "fails its checksum" }> {
  const stored = await read(store, segmentPrefix(queue, shard) + ref.name, { queue, shard });
  if (stored === undefined) return { problem: "is missing" };
  if (stored.body.byteLength !== ref.bytes || sha256Hex(stored.body) !== ref.sha256)
    return { problem: "fails its checksum" };
  return { body: stored.body };
}

async function read(
  store: ObjectStore,
  key: string,
  where: { queue: string; shard: number },
): Promise<StoredObject | undefined> {
  try {
    return await store.get(key);
  } catch (error) {
    const message = isStoreError(error) ? error.message : String(error);
    throw new CasqError("unavailable", `object store: ${message}`, where, { cause: error });
  }
}
