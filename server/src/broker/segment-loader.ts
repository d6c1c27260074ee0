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
 */
import { CasqError } from "../errors.ts";
import { parseSegmentDocument, type ShardDocument } from "../model/document-codec.ts";
import { segmentPrefix, sha256Hex } from "../model/segment-codec.ts";
import type { MessageRecord } from "../model/shard-records.ts";
import type { ObjectStore, StoredObject } from "../store/object-store.ts";
import { isStoreError } from "../store/store-errors.ts";

/** Segment reads in flight at once while loading a head. */
const READ_PARALLELISM = 8;

/**
 * Loads into `cache` every segment `doc` (read at `headKey` with etag
 * `headEtag`) references and `cache` lacks. Resolves `"moved"` when a segment
 * was gone because the head changed meanwhile. Rejects with `data_loss` for
 * a missing or corrupt segment of the current head, `unavailable` when the
 * store fails.
 */
export async function loadSegments(
  store: ObjectStore,
  headKey: string,
  headEtag: string,
  doc: ShardDocument,
  cache: Map<string, readonly MessageRecord[]>,
): Promise<"ok" | "moved"> {
  const where = { queue: doc.queue, shard: doc.shard };
  const prefix = segmentPrefix(doc.queue, doc.shard);
  const wanted = doc.segments.filter((ref) => !cache.has(ref.name));
  for (let i = 0; i < wanted.length; i += READ_PARALLELISM) {
    const chunk = wanted.slice(i, i + READ_PARALLELISM);
    const loaded = await Promise.all(
      chunk.map(async (ref) => ({ ref, stored: await read(store, prefix + ref.name, where) })),
    );
    for (const { ref, stored } of loaded) {
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
          `segment ${prefix}${ref.name}, referenced by the shard's head, ${problem}; refusing to load or overwrite the shard — restore the segment from a backup`,
          where,
        );
      }
      const body = (stored as StoredObject).body;
      cache.set(ref.name, parseSegmentDocument(body, { queue: doc.queue, shard: doc.shard, ref }));
    }
  }
  return "ok";
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
