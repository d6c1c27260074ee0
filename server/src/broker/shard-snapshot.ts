/**
 * A read-only copy of a shard as stored, for admin reads of shards this
 * broker does not lead: the head plus, for a v2 head, the segments (message,
 * index, dedup and dead-letter segments) it references (the same loading and checks as a leader's, `segment-loader.ts`).
 * Reading never writes and never moves leadership.
 */
import type { DedupChunk } from "../model/dedup-chunk.ts";
import { parseShardDocument, type SegmentRef } from "../model/shard-document-parser.ts";
import type { DeadLetterRecord, MessageRecord } from "../model/shard-records.ts";
import { checkDocumentPlace, ShardState } from "../model/shard-state.ts";
import type { ObjectStore, StoredObject } from "../store/object-store.ts";
import { loadSegments } from "./segment-loader.ts";
import { shardKey } from "./shard-key.ts";

/**
 * Decodes `stored` (the head of `queue`/`shard` as just read) with its
 * segments. If the head moved while its segments were read, reads it again
 * (a few times). Rejects with `data_loss` for a head or segment that cannot
 * be read or a head that names another queue or shard, `unavailable` when
 * the store fails.
 */
export async function readShardSnapshot(
  store: ObjectStore,
  queue: string,
  shard: number,
  stored: StoredObject,
): Promise<ShardState> {
  const key = shardKey(queue, shard);
  let current: StoredObject | undefined = stored;
  const cache = new Map<string, readonly MessageRecord[]>();
  // Every dedup segment the head references (now 0): a read checks them all, as strictly as segments.
  const dedup = { cache: new Map<string, DedupChunk>(), now: 0 };
  const dead = new Map<string, readonly DeadLetterRecord[]>();
  const indexes = new Map<string, readonly SegmentRef[]>();
  const options = {
    expected: { queue, shard },
    segments: (ref: { name: string }) => cache.get(ref.name),
    indexSegments: (ref: { name: string }) => indexes.get(ref.name),
    dedupSegments: (ref: { name: string }) => dedup.cache.get(ref.name),
    deadLetterSegments: (ref: { name: string }) => dead.get(ref.name),
  };
  for (let attempt = 0; ; attempt++) {
    const doc = parseShardDocument(current.body);
    checkDocumentPlace(doc, options.expected);
    const loaded = await loadSegments(store, key, current.etag, doc, indexes, cache, dedup, dead);
    if (loaded === "ok" || attempt >= 3) return ShardState.fromDocument(doc, options);
    current = await store.get(key);
    if (current === undefined) return ShardState.fromDocument(doc, options); // fails: names what is missing
  }
}
