/**
 * casq.v1.AdminService: queues, subscriptions, statistics, dead letters and
 * raw shard documents.
 *
 * Reads (ListQueues, GetQueue, ListDeadLetters, GetDocument) never take a
 * shard over: shards this broker leads are read live, the others from the
 * store (`shard-reader.ts`). Changes go shard by shard through each shard's
 * leader, like any other operation, and are answered once durable; a shard
 * led by another broker fails the call with a redirect (shards already
 * changed stay changed, and resending is safe: a shard that already has the
 * requested state is left alone).
 *
 * Queue lifecycle uses the catalog (`broker/queue-catalog.ts`):
 * - CreateQueue writes the manifest (`creating`), creates every shard
 *   document with the config, then marks the queue `ready`. A CreateQueue
 *   that finds an interrupted create with the same shard count and config
 *   completes it.
 * - DeleteQueue checks every shard (FAILED_PRECONDITION while something is
 *   unsettled, unless `force`), marks the manifest `deleting`, stops this
 *   broker's shard leaders, deletes the shard documents, then the manifest.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  type AdminService,
  type DeadLetterSchema,
  SubscriptionStart,
} from "@casq/api/casq/v1/admin_service_pb.ts";
import type { ServiceImpl } from "@connectrpc/connect";
import type { Broker } from "../broker/broker.ts";
import { expectKind } from "../broker/broker.ts";
import type { QueueManifest } from "../broker/queue-catalog.ts";
import { MAX_SHARD_COUNT } from "../broker/queue-catalog.ts";
import { shardKey } from "../broker/shard-key.ts";
import { CasqError, isCasqError } from "../errors.ts";
import type { Operation, OperationResult } from "../model/operations.ts";
import { DEFAULT_QUEUE_CONFIG, mergeConfig, sameConfig, validateConfigPatch } from "../model/queue-config.ts";
import { segmentPrefix } from "../model/segment-codec.ts";
import { listDeadLetters } from "../model/shard-inspect.ts";
import { computeStats, type ShardStats } from "../model/shard-stats.ts";
import { isStoreError } from "../store/store-errors.ts";
import {
  configPatchFromProto,
  configToProto,
  messageToProto,
  queueTotalsToProto,
  type ShardFigures,
  shardStatusToProto,
  subscriptionStatsToProto,
  sumSubscriptionStats,
  toTimestamp,
} from "./conversions.ts";
import type { ServiceContext } from "./service-context.ts";
import { readShard } from "./shard-reader.ts";
import { repairShard } from "./shard-repair.ts";
import { checkPageSize, checkQueueName, checkSubscriptionName } from "./validation.ts";

/** Largest chunk of a GetDocument stream. */
export const DOCUMENT_CHUNK_BYTES = 1024 * 1024;

/** The AdminService implementation. */
export function createAdminService(ctx: ServiceContext): ServiceImpl<typeof AdminService> {
  return {
    async listQueues(req) {
      const pageSize = checkPageSize(req.pageSize);
      const after = req.pageToken === "" ? undefined : decodeToken(req.pageToken, "queues").after;
      const page = await ctx.catalog.list(pageSize, typeof after === "string" ? after : undefined);
      return {
        queues: page.queues.map((m) =>
          "problem" in m
            ? { name: m.queue, problem: m.problem }
            : { name: m.queue, shardCount: m.shardCount },
        ),
        nextPageToken: page.nextAfter === undefined ? "" : encodeToken("queues", { after: page.nextAfter }),
      };
    },

    async getQueue(req) {
      const queue = checkQueueName(req.queue);
      const manifest = await ctx.catalog.require(queue);
      const now = ctx.clock.now();
      const [reads, listing] = await Promise.all([
        Promise.all(
          shardsOf(manifest).map((shard) =>
            readShard(ctx.broker, ctx.store, queue, shard, (state) => ({
              stats: computeStats(state, now),
              config: state.config,
            })),
          ),
        ),
        listShards(ctx, queue),
      ]);
      const figures: ShardFigures[] = reads.map((r) => {
        const listed = listing.get(shardKey(queue, r.shard));
        return {
          shard: r.shard,
          stats: r.value?.stats,
          servedHere: r.servedHere,
          documentBytes: r.documentBytes || listed?.size || 0,
          etag: r.etag || listed?.etag || "",
          // Under a ready manifest every shard has a document: a missing one was lost.
          problem: r.missing ? missingShardProblem(queue, r.shard) : r.problem,
          leader: r.record,
        };
      });
      const config = reads.find((r) => r.value !== undefined)?.value?.config ?? manifest.config;
      return {
        queue,
        shardCount: manifest.shardCount,
        config: configToProto(config),
        totals: queueTotalsToProto(figures),
        subscriptions: subscriptionTotals(figures.map((f) => f.stats)),
        shards: figures.map(shardStatusToProto),
        observedAt: toTimestamp(now),
      };
    },

    async createQueue(req) {
      const queue = checkQueueName(req.queue);
      if (req.shardCount > MAX_SHARD_COUNT)
        throw invalid(
          `shard_count must be between 1 and ${MAX_SHARD_COUNT} (0 means 1), got ${req.shardCount}`,
        );
      const shardCount = req.shardCount === 0 ? 1 : req.shardCount;
      const config = mergeConfig(DEFAULT_QUEUE_CONFIG, configPatchFromProto(req.config));
      let { manifest, created } = await ctx.catalog.create(queue, shardCount, config, "creating");
      // if_not_exists: an existing, usable queue is the answer, as it is (idempotent "create if missing").
      if (!created && req.ifNotExists && manifest.state === "ready")
        return {
          queue,
          shardCount: manifest.shardCount,
          config: configToProto(manifest.config),
          created: false,
        };
      if (!created) {
        const resumable =
          manifest.state === "creating" &&
          manifest.shardCount === shardCount &&
          sameConfig(manifest.config, config);
        if (!resumable)
          throw new CasqError(
            "already_exists",
            manifest.state === "deleting"
              ? `queue ${queue} is being deleted; resend DeleteQueue to finish, then create it again`
              : manifest.state === "creating"
                ? `queue ${queue} is being created with a different shard count or config (${manifest.shardCount} shards)`
                : `queue ${queue} already exists (${manifest.shardCount} shards); use it, or delete it first`,
            { queue },
          );
      }
      // Create (or complete) every shard document with the config.
      await eachShard(ctx.broker, manifest, { kind: "updateConfig", patch: config });
      manifest = await ctx.catalog.setState(manifest, "ready");
      ctx.logger.info({ queue, shards: shardCount }, "queue created");
      return { queue, shardCount, config: configToProto(config), created: true };
    },

    async updateQueue(req) {
      const queue = checkQueueName(req.queue);
      const patch = configPatchFromProto(req.config);
      validateConfigPatch(patch);
      const manifest = await ctx.catalog.require(queue);
      const results = await eachShard(ctx.broker, manifest, { kind: "updateConfig", patch });
      const updates = results.map((r) => expectKind(r, "updateConfig"));
      const first = updates[0];
      if (first === undefined) throw new CasqError("internal", `queue ${queue} has no shards`);
      return {
        config: configToProto(first.config),
        deadLettersEvicted: BigInt(updates.reduce((n, u) => n + u.deadEvicted, 0)),
      };
    },

    async deleteQueue(req) {
      const queue = checkQueueName(req.queue);
      let manifest = await requireForDelete(ctx, queue);
      // Every shard must be led here (a redirect otherwise), and empty unless forced.
      // Resuming a deletion, a shard whose document is gone already is `not_found`: fine.
      const read = await Promise.all(
        shardsOf(manifest).map((shard) =>
          ctx.broker
            .leader(queue, shard)
            .read((state) => computeStats(state, ctx.clock.now()))
            .catch((error: unknown) => {
              if (manifest.state === "deleting" && isCasqError(error, "not_found")) return undefined;
              throw error;
            }),
        ),
      );
      const stats = read.filter((s): s is ShardStats => s !== undefined);
      if (!req.force && manifest.state === "ready") {
        const busy = stats.find((s) => s.ready + s.delayed + s.inFlight + s.dead > 0);
        if (busy)
          throw new CasqError(
            "failed_precondition",
            `queue ${queue} still holds ${describeBusy(stats)}; purge it first or set force to delete it anyway`,
            { queue },
          );
      }
      manifest = await ctx.catalog.setState(manifest, "deleting");
      for (const shard of shardsOf(manifest)) await deleteShard(ctx, queue, shard);
      await ctx.catalog.remove(manifest);
      ctx.directory.forget(queue);
      ctx.logger.info({ queue, shards: manifest.shardCount, force: req.force }, "queue deleted");
      return {};
    },

    async createSubscription(req) {
      const queue = checkQueueName(req.queue);
      const subscription = checkSubscriptionName(req.subscription, "subscription", true);
      const from = req.start === SubscriptionStart.EARLIEST ? "earliest" : "latest";
      if (
        req.start !== SubscriptionStart.UNSPECIFIED &&
        req.start !== SubscriptionStart.LATEST &&
        from !== "earliest"
      )
        throw invalid(`start ${req.start} is not a SubscriptionStart value`);
      const manifest = await ctx.catalog.require(queue);
      const outcomes = await eachShardSettled(ctx.broker, manifest, {
        kind: "createSubscription",
        name: subscription,
        from,
      });
      const created = tolerate(outcomes, "already_exists").map((r) => expectKind(r, "createSubscription"));
      if (created.length === 0)
        throw new CasqError(
          "already_exists",
          `subscription "${subscription}" already exists on queue ${queue}; use it, or delete it first`,
          { queue },
        );
      return {
        subscription,
        start: from === "earliest" ? SubscriptionStart.EARLIEST : SubscriptionStart.LATEST,
        backlog: BigInt(created.reduce((n, r) => n + r.backlog, 0)),
      };
    },

    async deleteSubscription(req) {
      const queue = checkQueueName(req.queue);
      const subscription = checkSubscriptionName(req.subscription, "subscription", true);
      const manifest = await ctx.catalog.require(queue);
      const outcomes = await eachShardSettled(ctx.broker, manifest, {
        kind: "deleteSubscription",
        name: subscription,
      });
      const deleted = tolerate(outcomes, "not_found").map((r) => expectKind(r, "deleteSubscription"));
      if (deleted.length === 0) throw subscriptionNotFound(queue, subscription);
      return {
        messagesDropped: BigInt(deleted.reduce((n, r) => n + r.messagesDropped, 0)),
        leasesDropped: BigInt(deleted.reduce((n, r) => n + r.leasesDropped, 0)),
        deadLettersDropped: BigInt(deleted.reduce((n, r) => n + r.deadLettersDropped, 0)),
      };
    },

    async purgeQueue(req) {
      const queue = checkQueueName(req.queue);
      if ((req.subscription === "") === !req.allSubscriptions)
        throw invalid("set exactly one of subscription and all_subscriptions");
      const subscription = req.allSubscriptions ? undefined : checkSubscriptionName(req.subscription);
      const manifest = await ctx.catalog.require(queue);
      const outcomes = await eachShardSettled(ctx.broker, manifest, {
        kind: "purge",
        ...(subscription === undefined ? {} : { subscription }),
        ...(req.deadLetters ? { deadLetters: true } : {}),
      });
      const purged = tolerate(outcomes, "not_found").map((r) => expectKind(r, "purge"));
      if (purged.length === 0 && subscription !== undefined) throw subscriptionNotFound(queue, subscription);
      return {
        messagesPurged: BigInt(purged.reduce((n, r) => n + r.messagesPurged, 0)),
        leasesDropped: BigInt(purged.reduce((n, r) => n + r.leasesDropped, 0)),
        deadLettersPurged: BigInt(purged.reduce((n, r) => n + r.deadLettersPurged, 0)),
      };
    },

    repairShard: (req) => repairShard(ctx, req),

    async listDeadLetters(req) {
      const queue = checkQueueName(req.queue);
      const subscription = checkSubscriptionName(req.subscription);
      const pageSize = checkPageSize(req.pageSize);
      let shard = 0;
      let afterOffset: number | undefined;
      if (req.pageToken !== "") {
        const token = decodeToken(req.pageToken, "dead-letters");
        if (token.queue !== queue || token.subscription !== subscription)
          throw invalid("page_token belongs to another queue or subscription");
        if (typeof token.shard !== "number" || (token.after !== undefined && typeof token.after !== "number"))
          throw invalid("page_token is not from ListDeadLetters");
        shard = token.shard;
        afterOffset = token.after as number | undefined;
      }
      const manifest = await ctx.catalog.require(queue);
      const out: MessageInitShape<typeof DeadLetterSchema>[] = [];
      let sawSubscription = false;
      let next: { shard: number; after?: number } | undefined;
      for (; shard < manifest.shardCount; shard++, afterOffset = undefined) {
        const want = pageSize - out.length;
        const after = afterOffset;
        const read = await readShard(ctx.broker, ctx.store, queue, shard, (state) =>
          state.subscriptionNames().includes(subscription)
            ? listDeadLetters(state, subscription, {
                limit: want + 1,
                ...(after === undefined ? {} : { afterOffset: after }),
              })
            : undefined,
        );
        // A shard without a document yet has only the default subscription (and no dead letters).
        if (read.missing && subscription === "default") sawSubscription = true;
        if (read.value === undefined) continue;
        sawSubscription = true;
        for (const dl of read.value.slice(0, want))
          out.push({
            message: messageToProto(queue, shard, dl.message, dl.message.maxAttempts),
            subscription,
            reason: dl.reason,
            attempts: dl.attempts,
            deadAt: toTimestamp(dl.deadAt),
          });
        if (read.value.length > want) {
          next = { shard, after: (read.value[want - 1] as (typeof read.value)[number]).message.offset };
          break;
        }
        if (out.length >= pageSize) {
          if (shard + 1 < manifest.shardCount) next = { shard: shard + 1 };
          break;
        }
      }
      if (!sawSubscription && req.pageToken === "") throw subscriptionNotFound(queue, subscription);
      return {
        deadLetters: out,
        nextPageToken:
          next === undefined ? "" : encodeToken("dead-letters", { queue, subscription, ...next }),
      };
    },

    async redriveDeadLetters(req) {
      const queue = checkQueueName(req.queue);
      const subscription = checkSubscriptionName(req.subscription);
      if (req.all && req.ids.length > 0) throw invalid("set all or ids, not both");
      if (!req.all && req.ids.length === 0 && req.limit === 0)
        throw invalid("nothing selected: set all, ids or limit");
      const manifest = await ctx.catalog.require(queue);
      let remaining = req.limit === 0 ? Number.POSITIVE_INFINITY : req.limit;
      let redriven = 0;
      let missing: Set<string> | undefined;
      let found = false;
      for (const shard of shardsOf(manifest)) {
        if (remaining <= 0) break;
        let result: OperationResult;
        try {
          result = await ctx.broker.leader(queue, shard).submit({
            kind: "redrive",
            subscription,
            ...(req.ids.length > 0 ? { ids: req.ids } : {}),
            ...(Number.isFinite(remaining) ? { limit: remaining } : {}),
          });
        } catch (error) {
          if (isCasqError(error, "not_found")) continue;
          throw error;
        }
        found = true;
        const r = expectKind(result, "redrive");
        redriven += r.redriven;
        remaining -= r.redriven;
        const shardMissing = new Set(r.missing);
        missing =
          missing === undefined ? shardMissing : new Set([...missing].filter((id) => shardMissing.has(id)));
      }
      if (!found) throw subscriptionNotFound(queue, subscription);
      return {
        redriven: BigInt(redriven),
        missingIds: req.ids.filter((id) => missing?.has(id) ?? true),
      };
    },

    async *getDocument(req, call) {
      const queue = checkQueueName(req.queue);
      let stored: Awaited<ReturnType<typeof ctx.store.get>>;
      try {
        stored = await ctx.store.get(shardKey(queue, req.shard), { signal: call.signal });
      } catch (error) {
        if (isStoreError(error))
          throw new CasqError(
            "unavailable",
            `object store: ${error.message}; retry`,
            { queue },
            { cause: error },
          );
        throw error;
      }
      if (stored === undefined)
        throw new CasqError(
          "not_found",
          `queue ${queue} has no document for shard ${req.shard} (no such queue or shard, or nothing was written to it yet)`,
          { queue, shard: req.shard },
        );
      const body = stored.body;
      for (let offset = 0; offset < body.byteLength || offset === 0; offset += DOCUMENT_CHUNK_BYTES) {
        const chunk = body.subarray(offset, Math.min(body.byteLength, offset + DOCUMENT_CHUNK_BYTES));
        yield offset === 0 ? { chunk, etag: stored.etag, totalBytes: BigInt(body.byteLength) } : { chunk };
        if (body.byteLength === 0) break;
      }
    },
  };
}

/** What GetQueue says about a shard whose document is missing although the queue is ready. */
function missingShardProblem(queue: string, shard: number): string {
  return `shard document ${shardKey(queue, shard)} is missing though the queue was created with this shard: its messages were lost; restore it from a backup or recreate it with \`casq repair ${queue} --shard ${shard}\``;
}

function invalid(message: string): CasqError {
  return new CasqError("invalid_argument", message);
}

function subscriptionNotFound(queue: string, subscription: string): CasqError {
  return new CasqError(
    "not_found",
    `subscription "${subscription}" does not exist on queue ${queue}; create it with CreateSubscription`,
    { queue },
  );
}

function shardsOf(manifest: QueueManifest): number[] {
  return Array.from({ length: manifest.shardCount }, (_, shard) => shard);
}

/** Applies one operation to every shard; the first failure fails the call (after every shard answered). */
async function eachShard(broker: Broker, manifest: QueueManifest, op: Operation): Promise<OperationResult[]> {
  const outcomes = await eachShardSettled(broker, manifest, op);
  return tolerate(outcomes, undefined);
}

async function eachShardSettled(
  broker: Broker,
  manifest: QueueManifest,
  op: Operation,
): Promise<PromiseSettledResult<OperationResult>[]> {
  return Promise.allSettled(
    shardsOf(manifest).map((shard) => broker.leader(manifest.queue, shard).submit(op)),
  );
}

/**
 * The results of the shards that succeeded. Failures with code `tolerated`
 * (a shard that already has the requested state) are skipped; any other
 * failure is thrown (a redirect first, so the client resends to the leader).
 */
function tolerate(
  outcomes: PromiseSettledResult<OperationResult>[],
  tolerated: "already_exists" | "not_found" | undefined,
): OperationResult[] {
  const errors = outcomes
    .filter((o): o is PromiseRejectedResult => o.status === "rejected")
    .map((o) => o.reason as unknown)
    .filter((e) => tolerated === undefined || !isCasqError(e, tolerated));
  const redirect = errors.find((e) => isCasqError(e, "redirect"));
  if (redirect !== undefined) throw redirect;
  if (errors.length > 0) throw errors[0];
  return outcomes
    .filter((o): o is PromiseFulfilledResult<OperationResult> => o.status === "fulfilled")
    .map((o) => o.value);
}

function subscriptionTotals(stats: readonly (ShardStats | undefined)[]) {
  const byName = new Map<string, ShardStats["subscriptions"][number][]>();
  for (const s of stats)
    for (const sub of s?.subscriptions ?? []) {
      const list = byName.get(sub.name) ?? [];
      byName.set(sub.name, list);
      list.push(sub);
    }
  return [...byName.keys()]
    .sort()
    .map((name) => subscriptionStatsToProto(sumSubscriptionStats(name, byName.get(name) ?? [])));
}

async function listShards(
  ctx: ServiceContext,
  queue: string,
): Promise<Map<string, { etag?: string; size?: number }>> {
  try {
    const listed = await ctx.store.list(`queues/${queue}/`);
    return new Map(listed.map((entry) => [entry.key, entry]));
  } catch {
    return new Map();
  }
}

/** A queue to delete: in service, or left half-deleted by an interrupted DeleteQueue. */
async function requireForDelete(ctx: ServiceContext, queue: string): Promise<QueueManifest> {
  const manifest = await ctx.catalog.load(queue);
  if (manifest?.state === "deleting") return manifest;
  return ctx.catalog.require(queue);
}

/**
 * Deletes one shard document. This broker leads the shard (checked just
 * before), so nobody else writes it: its leader is stopped first (so that no
 * renewal re-creates the document) and the document is deleted only if it
 * is still the version this broker wrote.
 */
async function deleteShard(ctx: ServiceContext, queue: string, shard: number): Promise<void> {
  await ctx.broker.dropShard(queue, shard);
  const key = shardKey(queue, shard);
  let stored: Awaited<ReturnType<typeof ctx.store.get>>;
  try {
    stored = await ctx.store.get(key);
    if (stored !== undefined) await ctx.store.delete(key, { ifMatch: stored.etag });
    // Then its segments (format v2): nothing references them once the head is gone.
    for (const entry of await ctx.store.list(segmentPrefix(queue, shard))) await ctx.store.delete(entry.key);
  } catch (error) {
    if (isStoreError(error, "precondition_failed"))
      throw new CasqError(
        "unavailable",
        `shard ${queue}/${shard} changed while it was being deleted; resend DeleteQueue`,
        { queue, shard },
      );
    if (isStoreError(error))
      throw new CasqError("unavailable", `object store: ${error.message}; resend DeleteQueue`, {
        queue,
        shard,
      });
    throw error;
  }
}

/**
 * Removes a stopped shard leader from the broker, so that a queue created
 * again under the same name gets a fresh leader. The Broker has no public
 * way to do this yet; until it does, reach into its leader map.
 */
function describeBusy(stats: readonly ShardStats[]): string {
  const sum = (pick: (s: ShardStats) => number) => stats.reduce((n, s) => n + pick(s), 0);
  return `${sum((s) => s.ready + s.delayed + s.inFlight)} unsettled deliveries and ${sum((s) => s.dead)} dead letters`;
}

/** Page tokens: base64url JSON tagged with the RPC they belong to. */
function encodeToken(kind: string, fields: Record<string, unknown>): string {
  return Buffer.from(JSON.stringify({ k: kind, ...fields })).toString("base64url");
}

function decodeToken(token: string, kind: string): Record<string, unknown> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(token, "base64url").toString("utf8"));
  } catch {
    throw invalid(`page_token is not a token from ${kind === "queues" ? "ListQueues" : "ListDeadLetters"}`);
  }
  if (typeof parsed !== "object" || parsed === null || (parsed as { k?: unknown }).k !== kind)
    throw invalid(`page_token is not a token from ${kind === "queues" ? "ListQueues" : "ListDeadLetters"}`);
  return parsed as Record<string, unknown>;
}
