/**
 * Who leads each shard of a queue, as far as this broker can tell without
 * taking anything over: the answer to LookupShards and the routing part of
 * a Work stream.
 *
 * For a shard this broker has loaded, the shard leader knows the record (its
 * own while leading, the one it saw while following). For any other shard
 * the document's `broker` record is read from the store and remembered until
 * that record's lease runs out. Reads only: looking a shard up never writes.
 */
import type { Broker } from "../broker/broker.ts";
import { shardKey } from "../broker/shard-key.ts";
import { CasqError } from "../errors.ts";
import type { BrokerRecord } from "../model/shard-records.ts";
import type { ObjectStore, StoredObject } from "../store/object-store.ts";
import { isStoreError } from "../store/store-errors.ts";
import type { Clock } from "../util/clock.ts";

/** One shard and the broker recorded as its leader. */
export interface ShardRouteInfo {
  readonly shard: number;
  /** The recorded leader; undefined when none ever led it (or the document does not exist yet). */
  readonly record: BrokerRecord | undefined;
  /** True when the record's lease is live. */
  readonly live: boolean;
  /** True when the live leader is this broker. */
  readonly local: boolean;
}

/** Finds shard leaders (see the module header). */
export class ShardDirectory {
  private readonly broker: Broker;
  private readonly store: ObjectStore;
  private readonly clock: Clock;
  private readonly seen = new Map<string, { record: BrokerRecord | undefined; until: number }>();

  constructor(params: { broker: Broker; store: ObjectStore; clock: Clock }) {
    this.broker = params.broker;
    this.store = params.store;
    this.clock = params.clock;
  }

  /** The route of every shard of a queue with `shardCount` shards, in shard order. */
  routes(queue: string, shardCount: number, signal?: AbortSignal): Promise<ShardRouteInfo[]> {
    return Promise.all(Array.from({ length: shardCount }, (_, shard) => this.route(queue, shard, signal)));
  }

  /** The route of one shard. */
  async route(queue: string, shard: number, signal?: AbortSignal): Promise<ShardRouteInfo> {
    const record = await this.leaderRecord(queue, shard, signal);
    const now = this.clock.now();
    const live = record !== undefined && record.leaseUntil > now;
    return { shard, record, live, local: live && record?.id === this.broker.identity.id };
  }

  /** Forgets what was read about a queue's shards (e.g. after it was deleted). */
  forget(queue: string): void {
    for (const key of this.seen.keys()) if (key.startsWith(`${queue}/`)) this.seen.delete(key);
  }

  private async leaderRecord(
    queue: string,
    shard: number,
    signal?: AbortSignal,
  ): Promise<BrokerRecord | undefined> {
    const leader = this.broker.leader(queue, shard);
    const mode = leader.currentMode;
    const now = this.clock.now();
    if (mode === "leading") return leader.brokerRecord;
    // A follower's record is the one it saw last; once that lease has run out, look again.
    const followed = mode === "following" ? leader.brokerRecord : undefined;
    if (followed && followed.leaseUntil > now) return followed;
    const id = `${queue}/${shard}`;
    const cached = this.seen.get(id);
    if (cached && cached.until > now) return cached.record;
    const record = await this.readRecord(queue, shard, signal);
    if (record && record.leaseUntil > now) this.seen.set(id, { record, until: record.leaseUntil });
    else this.seen.delete(id);
    return record;
  }

  private async readRecord(
    queue: string,
    shard: number,
    signal?: AbortSignal,
  ): Promise<BrokerRecord | undefined> {
    const stored = await getShardObject(this.store, queue, shard, signal);
    if (stored === undefined) return undefined;
    return brokerRecordOf(stored.body);
  }
}

/**
 * The `broker` record of a stored shard document, or undefined when it has
 * none or it cannot be read (a document the broker refuses shows up as a
 * problem elsewhere; routing just has no leader for it).
 */
export function brokerRecordOf(body: Uint8Array): BrokerRecord | undefined {
  let doc: unknown;
  try {
    doc = JSON.parse(new TextDecoder().decode(body));
  } catch {
    return undefined;
  }
  const b = (doc as { broker?: unknown } | null)?.broker;
  if (typeof b !== "object" || b === null) return undefined;
  const { id, address, epoch, lease_until: leaseUntil } = b as Record<string, unknown>;
  if (typeof id !== "string" || typeof address !== "string" || typeof epoch !== "number") return undefined;
  if (typeof leaseUntil !== "number") return undefined;
  return { id, address, epoch, leaseUntil };
}

/** Reads one shard document's object from the store; a store failure becomes a retryable `unavailable`. */
export async function getShardObject(
  store: ObjectStore,
  queue: string,
  shard: number,
  signal?: AbortSignal,
): Promise<StoredObject | undefined> {
  try {
    return await store.get(shardKey(queue, shard), signal ? { signal } : undefined);
  } catch (error) {
    if (isStoreError(error))
      throw new CasqError(
        "unavailable",
        `object store: ${error.message}; retry`,
        { queue, shard },
        { cause: error },
      );
    throw error;
  }
}
