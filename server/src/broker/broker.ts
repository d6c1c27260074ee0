/**
 * The broker: every queue shard this process serves, behind one API.
 *
 * It routes each request to the {@link ShardLeader} of the right shard
 * (creating leaders on first use), splits batches across shards, walks
 * shards for claims, and parks long-poll claims until a commit makes a
 * message runnable or the wait runs out. It holds no queue semantics of its
 * own: those live in the document model; durability and leadership live in
 * the shard leader.
 */
import { CasqError, isCasqError } from "../errors.ts";
import { checkNewMessage, checkRequestSize } from "../model/input-validation.ts";
import type { NewMessage, OperationResult, Receipt } from "../model/operations.ts";
import type { QueueConfig } from "../model/queue-config.ts";
import { validateName } from "../model/shard-state.ts";
import type { ObjectStore } from "../store/object-store.ts";
import type { Clock } from "../util/clock.ts";
import type { Random } from "../util/random.ts";
import type { BrokerIdentity } from "./leadership.ts";
import { newMessageId } from "./message-ids.ts";
import { expectKind } from "./operation-effects.ts";
import { missingShardVerdict, queueNotFound } from "./queue-catalog.ts";
import {
  DEFAULT_SEGMENT_CACHE_BYTES,
  SegmentBodyCache,
  type SegmentBodyCacheStats,
} from "./segment-body-cache.ts";
import { type Delivery, ShardClaimer } from "./shard-claims.ts";
import { type CommitOptions, ShardLeader } from "./shard-leader.ts";
import type { ShardObserver } from "./shard-observer.ts";
import { shardForKey } from "./shard-routing.ts";

export { expectKind };

/** What a {@link Broker} is made of. */
export interface BrokerParams {
  readonly store: ObjectStore;
  readonly identity: BrokerIdentity;
  readonly clock: Clock;
  readonly random: Random;
  readonly commit?: Partial<CommitOptions>;
  /** Shard count of a queue. Default: 1 for every queue. */
  readonly shardsFor?: (queue: string) => number;
  /** Config of documents this broker creates. */
  readonly initialConfig?: Partial<QueueConfig>;
  readonly observer?: ShardObserver;
  /**
   * Whether a shard whose document is missing should have one (then it is
   * refused with `data_loss`, not recreated empty); an error it throws fails
   * the request and nothing is written. Default: the queue's manifest in the
   * store decides ({@link missingShardVerdict}): create only while the queue
   * is `creating`, `not_found` without a manifest or while `deleting`.
   * Engines that run without manifests (simulation, benchmarks) pass
   * {@link NO_MANIFESTS}.
   */
  readonly documentExpected?: (queue: string, shard: number) => Promise<boolean>;
  /**
   * Bytes of sealed messages' bodies (payloads, headers, trace contexts) this
   * broker keeps in memory, all shards together; the rest are read from their
   * segments when needed (`segment-body-cache.ts`). Default 32 MiB.
   */
  readonly segmentCacheBytes?: number;
}

/**
 * The `documentExpected` of an engine that runs without queue manifests (the
 * simulation, benchmarks): a missing shard document is a new shard, created
 * empty by its first write.
 */
export const NO_MANIFESTS = async (): Promise<boolean> => false;

/** What a claim returns (defined beside the claimer, which makes them). */
export type { Delivery } from "./shard-claims.ts";

/** A message to enqueue; the broker assigns the id. */
export type EnqueueInput = Omit<NewMessage, "id">;

/**
 * `input` with its message id, as an object of one fixed shape: every field
 * present (undefined when unset), in one order. Why: `{ ...input, id }` of
 * inputs with different fields made objects whose property reads in the
 * model's per-message checks went through V8's slow path (~5 µs a message
 * against ~0.3, measured). The mapped type makes a field added to
 * `NewMessage` a compile error here until it is copied.
 */
export function withMessageId(input: EnqueueInput, id: string): NewMessage {
  const message: { [K in keyof Required<NewMessage>]: NewMessage[K] } = {
    id,
    payload: input.payload,
    headers: input.headers,
    key: input.key,
    priority: input.priority,
    runAt: input.runAt,
    delayMs: input.delayMs,
    maxAttempts: input.maxAttempts,
    dedupId: input.dedupId,
    traceContext: input.traceContext,
  };
  return message;
}

/** Where one enqueued message went. */
export interface EnqueueOutcome {
  readonly id: string;
  readonly shard: number;
  readonly offset: number;
  /** True when a dedup id matched an earlier message: nothing new was enqueued, `id` is the original. */
  readonly duplicate: boolean;
}

/** A receipt together with the shard it belongs to: identifies one delivery of one message. */
export interface ShardReceipt extends Receipt {
  readonly shard: number;
}

/**
 * Tells where a shard is led when that is another broker with a live lease:
 * its advertised address, else undefined (this broker leads it or may take it
 * over). Looks only; never takes anything over.
 */
export type RemoteLeaderLookup = (shard: number) => Promise<string | undefined>;

/** Options of a claim. */
export interface ClaimOptions {
  readonly subscription: string;
  readonly workerId: string;
  readonly max: number;
  /** Long poll: wait up to this long for a message when none is ready. Default 0. */
  readonly waitMs?: number;
  /** Lease TTL of these deliveries; default the queue's. */
  readonly leaseTtlMs?: number;
  readonly signal?: AbortSignal;
}

/** Routes queue operations to shard leaders. */
export class Broker {
  readonly identity: BrokerIdentity;
  /** The one cross-shard claim walker (also used by the Claim RPC and Work streams). */
  readonly claims: ShardClaimer;
  private readonly params: BrokerParams;
  private readonly leaders = new Map<string, ShardLeader>();
  /** Bodies of sealed messages in memory, all shards together (see {@link BrokerParams.segmentCacheBytes}). */
  private readonly bodyCache: SegmentBodyCache;
  private readonly roundRobin = new Map<string, number>();
  private stopped = false;

  constructor(params: BrokerParams) {
    this.params = params;
    this.identity = params.identity;
    this.claims = new ShardClaimer(this, params.clock);
    this.bodyCache = new SegmentBodyCache(params.segmentCacheBytes ?? DEFAULT_SEGMENT_CACHE_BYTES);
  }

  /** Counters of the page cache of segment bodies (for metrics and tests). */
  segmentCacheStats(): SegmentBodyCacheStats {
    return this.bodyCache.stats();
  }

  /** Number of shards of `queue`. */
  shardCount(queue: string): number {
    const count = this.params.shardsFor?.(queue) ?? 1;
    if (!Number.isInteger(count) || count < 1)
      throw new CasqError("internal", `queue ${queue} has ${count} shards`);
    return count;
  }

  /** The leader object of one shard (created on first use; it loads lazily). */
  leader(queue: string, shard: number): ShardLeader {
    validateName("queue", queue);
    if (this.stopped)
      throw new CasqError("unavailable", "this broker is shutting down; retry against another broker");
    const id = `${queue}/${shard}`;
    let leader = this.leaders.get(id);
    if (!leader) {
      leader = new ShardLeader({
        store: this.params.store,
        queue,
        shard,
        identity: this.params.identity,
        clock: this.params.clock,
        random: this.params.random,
        ...(this.params.commit ? { options: this.params.commit } : {}),
        ...(this.params.initialConfig ? { initialConfig: this.params.initialConfig } : {}),
        ...(this.params.observer ? { observer: this.params.observer } : {}),
        documentExpected: () =>
          this.params.documentExpected?.(queue, shard) ?? this.manifestSaysExpected(queue, shard),
        bodyCache: this.bodyCache,
      });
      this.leaders.set(id, leader);
    }
    return leader;
  }

  /**
   * The default `documentExpected`: what the queue's manifest says of a
   * missing shard document ({@link missingShardVerdict}). Created only while
   * the queue is `creating`; `data_loss` when it is `ready`; `not_found`
   * (nothing written) when the queue has no manifest or is being deleted.
   */
  private async manifestSaysExpected(queue: string, shard: number): Promise<boolean> {
    const verdict = await missingShardVerdict(this.params.store, queue, shard);
    if (verdict === "absent") throw queueNotFound(queue);
    return verdict === "lost";
  }

  /** Every shard leader this broker has opened. */
  openShards(): ShardLeader[] {
    return [...this.leaders.values()];
  }

  /**
   * Stops and forgets the leader of one shard without releasing its lease
   * (the caller is about to delete the document, and an idle renewal must not
   * re-create it). The next request for the shard opens a fresh leader.
   */
  async dropShard(queue: string, shard: number): Promise<void> {
    const id = `${queue}/${shard}`;
    const leader = this.leaders.get(id);
    if (!leader) return;
    await leader.stop({ release: false });
    if (this.leaders.get(id) === leader) this.leaders.delete(id);
  }

  /**
   * Enqueues a batch. Resolves once every message is durable. Messages for
   * different shards are written by different CAS writes: each shard's part
   * is all-or-nothing, the batch as a whole is not. The messages with
   * neither key nor dedup id all go to one shard (round-robin from request
   * to request), so a batch of only those is all-or-nothing (but a message the
   * queue's config refuses fails the batch before any part is written, see
   * {@link checkWhole}; a shard too full fails its part only). With `remoteLeaderOf`, a
   * batch whose shards are led by several brokers is refused before anything
   * is written (`batch_redirect`, see {@link refuseSplitBatch}).
   */
  async enqueue(
    queue: string,
    messages: EnqueueInput[],
    signal?: AbortSignal,
    remoteLeaderOf?: RemoteLeaderLookup,
  ): Promise<EnqueueOutcome[]> {
    validateName("queue", queue);
    if (messages.length === 0) return [];
    const shards = this.shardCount(queue);
    const byShard = new Map<number, { index: number; message: NewMessage }[]>();
    // Every message of the request with neither key nor dedup id goes to one shard, so that a
    // request of only such messages is stored all or none (SDKs merge such calls relying on it).
    let unroutedShard: number | undefined;
    for (const [index, input] of messages.entries()) {
      // A keyed message follows its key; an unkeyed one with a dedup id follows
      // the dedup id, so a retry meets the original on the same shard.
      const routeBy = input.key || input.dedupId;
      if (!routeBy && unroutedShard === undefined) unroutedShard = this.placeUnrouted(queue, shards);
      const shard = routeBy ? shardForKey(routeBy, shards) : (unroutedShard as number);
      const message = withMessageId(input, newMessageId(this.params.clock, this.params.random));
      const group = byShard.get(shard) ?? [];
      byShard.set(shard, group);
      group.push({ index, message });
    }
    if (byShard.size > 1 && remoteLeaderOf) await this.refuseSplitBatch(queue, byShard, remoteLeaderOf);
    if (byShard.size > 1) await this.checkWhole(queue, byShard);
    const outcomes: EnqueueOutcome[] = new Array(messages.length);
    await Promise.all(
      [...byShard].map(async ([shard, group]) => {
        const result = expectKind(
          await this.leader(queue, shard).submit(
            {
              kind: "enqueue",
              messages: group.map((entry) => entry.message),
              // Errors name a message by its place in the request, not in this shard's part;
              // max_batch bounds the request, not the part.
              ...(byShard.size > 1
                ? { requestIndexes: group.map((entry) => entry.index), requestSize: messages.length }
                : {}),
            },
            signal ? { signal } : undefined,
          ),
          "enqueue",
        );
        for (const [i, entry] of group.entries()) {
          const one = result.results[i];
          if (!one) throw new CasqError("internal", "enqueue returned fewer results than messages");
          outcomes[entry.index] = { id: one.id, shard, offset: one.offset, duplicate: one.duplicate };
        }
      }),
    );
    return outcomes;
  }

  /**
   * Checks a request split over several shards (its size and every message)
   * against the queue's config before any shard applies its part: each shard
   * checks only its own part, so a message a limit refuses (a payload too
   * large) would fail its shard's part while the other shards stored theirs.
   * The config is the first shard's as this broker holds it: shards share
   * it, but while an UpdateQueue reaches them one by one a part can still be
   * refused alone, as can one that depends on its shard's state (a shard too
   * full, one without a subscription yet). Best effort, then: each part is
   * checked again where it is applied.
   */
  private async checkWhole(
    queue: string,
    byShard: ReadonlyMap<number, readonly { index: number; message: NewMessage }[]>,
  ): Promise<void> {
    const [first] = byShard.keys();
    const config = await this.leader(queue, first as number).config();
    const now = Math.floor(this.params.clock.now());
    let size = 0;
    for (const group of byShard.values()) size += group.length;
    checkRequestSize(size, config);
    for (const group of byShard.values())
      for (const { index, message } of group) checkNewMessage(message, config, now, index);
  }

  /**
   * Claims up to `max` messages for a worker, walking the queue's shards;
   * with `waitMs`, waits for a commit that makes a message runnable. See
   * `shard-claims.ts`. An aborted claim answers with nothing.
   */
  async claim(queue: string, options: ClaimOptions): Promise<Delivery[]> {
    validateName("queue", queue);
    validateName("subscription", options.subscription);
    try {
      return await this.claims.claim(
        {
          queue,
          subscription: options.subscription,
          workerId: options.workerId,
          max: options.max,
          leaseTtlMs: options.leaseTtlMs,
          ...(options.signal ? { signal: options.signal } : {}),
        },
        this.shardCount(queue),
        Math.max(0, options.waitMs ?? 0),
      );
    } catch (error) {
      if (options.signal?.aborted && isCasqError(error, "cancelled")) return [];
      throw error;
    }
  }

  /** Extends leases; reports the ones this worker no longer holds. */
  async heartbeat(queue: string, subscription: string, workerId: string, receipts: ShardReceipt[]) {
    return this.perShard(queue, receipts, (shard, group) =>
      this.leader(queue, shard).submit({ kind: "heartbeat", subscription, workerId, receipts: group }),
    );
  }

  /** Acks deliveries; per receipt the outcome is `acked`, `already_acked` or `lease_lost`. */
  async ack(queue: string, subscription: string, receipts: ShardReceipt[]) {
    return this.perShard(queue, receipts, (shard, group) =>
      this.leader(queue, shard).submit({ kind: "ack", subscription, receipts: group }),
    );
  }

  /** Nacks deliveries: retry after a delay (default: the queue's backoff), dead-letter now, or release unprocessed. */
  async nack(
    queue: string,
    subscription: string,
    receipts: ShardReceipt[],
    options: { delayMs?: number; deadLetter?: boolean; reason?: string; release?: boolean } = {},
  ) {
    return this.perShard(queue, receipts, (shard, group) =>
      this.leader(queue, shard).submit({ kind: "nack", subscription, receipts: group, ...options }),
    );
  }

  /** Applies one administrative operation to every shard of a queue. */
  async adminAll(
    queue: string,
    op: Parameters<ShardLeader["submit"]>[0],
  ): Promise<{ shard: number; result: OperationResult }[]> {
    validateName("queue", queue);
    const shards = this.shardCount(queue);
    return Promise.all(
      Array.from({ length: shards }, async (_, shard) => ({
        shard,
        result: await this.leader(queue, shard).submit(op),
      })),
    );
  }

  /**
   * Stops every shard: buffered operations are committed, and with `release`
   * the leadership leases are handed back so another broker takes over at once.
   */
  async stop(options: { release: boolean }): Promise<void> {
    this.stopped = true;
    await Promise.all([...this.leaders.values()].map((leader) => leader.stop(options)));
  }

  private async perShard<T>(
    queue: string,
    receipts: ShardReceipt[],
    run: (shard: number, group: Receipt[]) => Promise<T>,
  ): Promise<{ shard: number; result: T }[]> {
    validateName("queue", queue);
    const shards = this.shardCount(queue);
    const groups = new Map<number, Receipt[]>();
    for (const receipt of receipts) {
      if (!Number.isInteger(receipt.shard) || receipt.shard < 0 || receipt.shard >= shards)
        throw new CasqError(
          "invalid_argument",
          `receipt names shard ${receipt.shard}, but queue ${queue} has ${shards}`,
        );
      const group = groups.get(receipt.shard) ?? [];
      groups.set(receipt.shard, group);
      group.push({ offset: receipt.offset, attempt: receipt.attempt });
    }
    return Promise.all(
      [...groups].map(async ([shard, group]) => ({ shard, result: await run(shard, group) })),
    );
  }

  /**
   * A batch whose shards are led by more than one broker cannot be stored by
   * any one of them: storing the local part and redirecting the rest would
   * store that part again on every retry. Refuse it as a whole, before
   * anything is written, with the split the client should make.
   */
  private async refuseSplitBatch(
    queue: string,
    byShard: ReadonlyMap<number, readonly { index: number }[]>,
    remoteLeaderOf: RemoteLeaderLookup,
  ): Promise<void> {
    const routes = new Map<string, number[]>();
    await Promise.all(
      [...byShard].map(async ([shard, group]) => {
        const address = (await remoteLeaderOf(shard)) ?? this.params.identity.address;
        const indexes = routes.get(address) ?? [];
        routes.set(address, indexes);
        indexes.push(...group.map((entry) => entry.index));
      }),
    );
    if (routes.size <= 1) return;
    throw new CasqError(
      "batch_redirect",
      `the batch's messages belong to shards of queue ${queue} led by ${routes.size} brokers (${[...routes.keys()].join(", ")}); nothing was stored — send each broker its part (the casq SDKs do this by themselves)`,
      {
        queue,
        batchRoutes: [...routes].map(([leaderAddress, indexes]) => ({
          leaderAddress,
          messageIndexes: indexes.sort((a, b) => a - b),
        })),
      },
    );
  }

  /**
   * The shard for the messages of a request without key or dedup id: any
   * shard will do, so go round-robin over the shards not known to be led by
   * another broker.
   * Otherwise a batch spread over shards led by different brokers could be
   * accepted by none of them: every try would commit the local part and
   * redirect for the rest.
   */
  private placeUnrouted(queue: string, shards: number): number {
    const start = this.nextShard(queue, shards);
    for (let i = 0; i < shards; i++) {
      const shard = (start + i) % shards;
      const mode = this.leaders.get(`${queue}/${shard}`)?.currentMode;
      if (mode !== "following" && mode !== "refused") return shard;
    }
    return start;
  }

  private nextShard(queue: string, shards: number): number {
    const next = this.roundRobin.get(queue) ?? 0;
    this.roundRobin.set(queue, (next + 1) % shards);
    return next % shards;
  }
}
