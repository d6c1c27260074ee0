/**
 * Read-only access to one shard for the admin API, without taking it over.
 *
 * A shard this broker leads is read through its shard leader (live figures,
 * consistent with the last commit). Any other shard is read from the store
 * with its segments (`broker/shard-snapshot.ts`), so admin reads never move leadership and work while
 * another broker leads the shard. A document that cannot be decoded is
 * reported as a problem in words, not as a failed call.
 */
import type { Broker } from "../broker/broker.ts";
import { readShardSnapshot } from "../broker/shard-snapshot.ts";
import { isCasqError } from "../errors.ts";
import type { BrokerRecord } from "../model/shard-records.ts";
import type { ShardState } from "../model/shard-state.ts";
import type { ObjectStore } from "../store/object-store.ts";
import { brokerRecordOf, getShardObject } from "./shard-directory.ts";

/** What reading one shard found. */
export interface ShardRead<T> {
  readonly shard: number;
  /** The value computed from the document; undefined when there is no document or it cannot be read. */
  readonly value: T | undefined;
  /** True when the value comes from this broker's live copy. */
  readonly servedHere: boolean;
  /** The broker recorded in the document. */
  readonly record: BrokerRecord | undefined;
  /** Size of the stored document in bytes (0 when it does not exist). */
  readonly documentBytes: number;
  /** Etag of the stored document read (empty when read from the live copy or absent). */
  readonly etag: string;
  /** Why the document could not be read; empty when it could (or does not exist). */
  readonly problem: string;
  /** True when the shard has no document yet. */
  readonly missing: boolean;
}

/** Reads one shard (see the module header) and computes `read(state)` from it. */
export async function readShard<T>(
  broker: Broker,
  store: ObjectStore,
  queue: string,
  shard: number,
  read: (state: ShardState) => T,
): Promise<ShardRead<T>> {
  const leader = broker.leader(queue, shard);
  if (leader.currentMode === "leading") {
    try {
      const value = await leader.read(read);
      return {
        shard,
        value,
        servedHere: true,
        record: leader.brokerRecord,
        documentBytes: 0,
        etag: "",
        problem: "",
        missing: false,
      };
    } catch (error) {
      // Lost the shard meanwhile (redirect) or the store hiccuped: fall back to the stored copy.
      if (!isCasqError(error, "redirect") && !isCasqError(error, "unavailable")) throw error;
    }
  }
  const stored = await getShardObject(store, queue, shard);
  if (stored === undefined)
    return {
      shard,
      value: undefined,
      servedHere: false,
      record: undefined,
      documentBytes: 0,
      etag: "",
      problem: "",
      missing: true,
    };
  const base = {
    shard,
    servedHere: false,
    record: brokerRecordOf(stored.body),
    documentBytes: stored.body.byteLength,
    etag: stored.etag,
    missing: false,
  };
  let state: ShardState;
  try {
    state = await readShardSnapshot(store, queue, shard, stored);
  } catch (error) {
    return { ...base, value: undefined, problem: error instanceof Error ? error.message : String(error) };
  }
  return { ...base, value: read(state), problem: "" };
}
