/**
 * The queue catalog: which queues exist, and how many shards each has.
 *
 * Every queue has one small manifest object next to its shard documents,
 * `queues/<queue>/queue.json`:
 *
 * ```json
 * {"format":"casq.queue.v1","queue":"orders","shard_count":4,"created_at":1767225600000,
 *  "state":"ready","config":{"lease_ttl_ms":60000,...}}
 * ```
 *
 * It is created with put-if-absent, so two brokers creating the same queue
 * at once agree on one shard count (the loser reads the winner's manifest),
 * and it never changes afterwards except for its `state`:
 *
 * - `creating`: CreateQueue wrote the manifest and is creating the shard
 *   documents. A CreateQueue that finds it with the same shard count and
 *   config completes it; requests for the queue get `not_found` until then.
 * - `ready`: the queue is in service, and every shard document exists. A
 *   shard document missing under a `ready` manifest was lost (deleted by
 *   hand, a store lifecycle rule...): the shard is refused with `data_loss`
 *   rather than silently recreated empty ({@link missingShardVerdict}).
 * - `deleting`: DeleteQueue is removing the shard documents; requests get
 *   `not_found`, and a DeleteQueue that finds it finishes the job.
 *
 * So a shard document is only ever created while its manifest is
 * `creating`. A broker that finds a document missing under a `deleting`
 * manifest, or under none (a broker whose cached manifest still said
 * `ready` when the queue was deleted through another one), answers
 * `not_found` and writes nothing: writing would leave an orphan document
 * that no manifest owns. And a new manifest is never written over such an
 * orphan (one left by an older casq, or a deletion interrupted by hand):
 * creating a queue whose name still has shard documents but no manifest is
 * refused with `failed_precondition` naming them, instead of adopting their
 * old messages, subscriptions and config as the "new" queue's.
 *
 * The shard count is fixed for the queue's life, so a cached manifest is
 * always right about it. Whether the queue still exists is not: each broker
 * re-reads a manifest it uses once its copy is older than `refreshMs`
 * (serving the cached copy meanwhile), so a queue deleted through one broker
 * is gone for the others within that time. Only queues in service are
 * cached: a missing queue is looked up again on every request, so a queue
 * created through one broker is usable through all of them at once. `config` is the config the queue
 * was created with (the config in force lives in every shard document).
 *
 * Enqueue's auto-creation goes the same way as CreateQueue: manifest
 * `creating`, the shard document, then `ready`; an auto-creation interrupted
 * half-way is completed by the next Enqueue the queue would take. An Enqueue
 * the new queue would refuse (its `admit` check) creates nothing.
 */
import { CasqError, isCasqError } from "../errors.ts";
import { configProblem, DEFAULT_QUEUE_CONFIG, type QueueConfig, sameConfig } from "../model/queue-config.ts";
import { ShardState, validateName } from "../model/shard-state.ts";
import type { ObjectStore } from "../store/object-store.ts";
import { isStoreError } from "../store/store-errors.ts";
import type { Clock } from "../util/clock.ts";
import { shardKey } from "./shard-key.ts";

/** The manifest format this casq reads and writes. */
export const QUEUE_MANIFEST_FORMAT = "casq.queue.v1";

/** Most shards a queue may have. */
export const MAX_SHARD_COUNT = 256;

/** Lifecycle state of a queue (see the module header). */
export type QueueState = "creating" | "ready" | "deleting";

/** A queue manifest as stored, with the etag of the version read. */
export interface QueueManifest {
  readonly queue: string;
  readonly shardCount: number;
  /** When the manifest was created, ms since the epoch. */
  readonly createdAt: number;
  readonly state: QueueState;
  /** The complete config the queue was created with. */
  readonly config: QueueConfig;
  /** Etag of the stored manifest this value was read from (or written as). */
  readonly etag: string;
}

/** The store key of a queue's manifest. */
export function manifestKey(queue: string): string {
  validateName("queue", queue);
  return `queues/${queue}/queue.json`;
}

/** Options of a {@link QueueCatalog}. */
export interface QueueCatalogOptions {
  readonly store: ObjectStore;
  readonly clock: Clock;
  /** Re-read a cached manifest once it is older than this (ms). Default 5000. */
  readonly refreshMs?: number;
}

interface CacheEntry {
  /** undefined: known not to exist. */
  manifest: QueueManifest | undefined;
  loadedAt: number;
  loading?: Promise<QueueManifest | undefined>;
}

/** A queue whose manifest exists but cannot be read (listed, not served). */
export interface UnreadableQueue {
  readonly queue: string;
  /** Why the manifest cannot be read (the `data_loss` message). */
  readonly problem: string;
}

/** One page of queue names. */
export interface QueuePage {
  /** Queues in service, and queues whose manifest cannot be read, sorted by name. */
  readonly queues: readonly (QueueManifest | UnreadableQueue)[];
  /** Name of the last queue of the page when more may follow; undefined on the last page. */
  readonly nextAfter: string | undefined;
}

/** Reads, caches and writes queue manifests (see the module header). */
export class QueueCatalog {
  private readonly store: ObjectStore;
  private readonly clock: Clock;
  private readonly refreshMs: number;
  private readonly cache = new Map<string, CacheEntry>();

  constructor(options: QueueCatalogOptions) {
    this.store = options.store;
    this.clock = options.clock;
    this.refreshMs = options.refreshMs ?? 5000;
  }

  /**
   * Shard count of a queue whose manifest is cached (the broker's synchronous
   * `shardsFor`). Callers load the manifest first with {@link require};
   * an uncached queue is `not_found`.
   */
  shardsFor(queue: string): number {
    const manifest = this.cache.get(queue)?.manifest;
    if (manifest === undefined) throw queueNotFound(queue);
    return manifest.shardCount;
  }

  /** The cached manifest, if any, without touching the store. */
  cached(queue: string): QueueManifest | undefined {
    return this.cache.get(queue)?.manifest;
  }

  /**
   * The manifest of a queue that is in service. Uses the cache while it is
   * fresh; a stale ready entry is served while it is re-read in the
   * background. Throws `not_found` when the queue does not exist (or is
   * being created or deleted), `unavailable` when the store cannot be read.
   */
  async require(queue: string): Promise<QueueManifest> {
    validateName("queue", queue);
    const entry = this.cache.get(queue);
    const now = this.clock.now();
    let manifest: QueueManifest | undefined;
    // Only queues in service are cached; a missing, creating or deleting queue is
    // read again every time, so a queue created through another broker is seen at once.
    if (entry?.manifest?.state === "ready") {
      manifest = entry.manifest;
      if (now - entry.loadedAt >= this.refreshMs) this.load(queue).catch(() => {});
    } else {
      manifest = await this.load(queue);
    }
    if (manifest === undefined) throw queueNotFound(queue);
    if (manifest.state === "creating")
      throw new CasqError(
        "not_found",
        `queue ${queue} is still being created (an interrupted CreateQueue?); resend CreateQueue with the same shard count and config to finish it`,
        { queue },
      );
    if (manifest.state === "deleting")
      throw new CasqError("not_found", `queue ${queue} is being deleted; resend DeleteQueue to finish it`, {
        queue,
      });
    return manifest;
  }

  /**
   * Like {@link require}, but when the queue does not exist at all and
   * `autoCreate` is set, creates it with one shard and the default config
   * (Enqueue's auto-creation; see the module header), or completes such a
   * creation that was interrupted. `onCreated` is called when this call is
   * the one that made the queue ready (of racing brokers, exactly one).
   * `admit` is asked first, with the config the queue would get: when it
   * throws (the request would be refused by that queue), nothing is created.
   */
  async ensure(
    queue: string,
    autoCreate: boolean,
    onCreated?: (manifest: QueueManifest) => void,
    admit?: (config: QueueConfig) => void,
  ): Promise<QueueManifest> {
    try {
      return await this.require(queue);
    } catch (error) {
      if (!autoCreate || !isCasqError404(error)) throw error;
      const known = this.cached(queue);
      if (known !== undefined && !isAutoCreation(known)) throw error;
      admit?.(known?.config ?? DEFAULT_QUEUE_CONFIG);
      const manifest = known ?? (await this.create(queue, 1, DEFAULT_QUEUE_CONFIG, "creating")).manifest;
      if (!isAutoCreation(manifest)) return this.require(queue);
      await this.createShardDocument(queue, 0, manifest.config);
      try {
        const ready = await this.setState(manifest, "ready");
        onCreated?.(ready);
        return ready;
      } catch (raced) {
        // Another broker completing the same creation marked it ready first.
        if (!isCasqError(raced, "unavailable")) throw raced;
        return this.require(queue);
      }
    }
  }

  /** Writes an empty shard document with `config` unless one exists (put-if-absent). */
  private async createShardDocument(queue: string, shard: number, config: QueueConfig): Promise<void> {
    const state = ShardState.create({ queue, shard, config, now: Math.floor(this.clock.now()) });
    try {
      await this.store.put(shardKey(queue, shard), state.encode(), { ifAbsent: true });
    } catch (error) {
      if (!isStoreError(error, "precondition_failed")) throw storeFailure(error, queue);
    }
  }

  /** Reads a manifest from the store now (single flight per queue) and caches the answer. */
  load(queue: string): Promise<QueueManifest | undefined> {
    validateName("queue", queue);
    const entry = this.cache.get(queue);
    if (entry?.loading) return entry.loading;
    const loading = this.read(queue).then(
      (manifest) => {
        this.cache.set(queue, { manifest, loadedAt: this.clock.now() });
        return manifest;
      },
      (error: unknown) => {
        const current = this.cache.get(queue);
        if (current) delete current.loading;
        throw error;
      },
    );
    this.cache.set(queue, { manifest: entry?.manifest, loadedAt: entry?.loadedAt ?? 0, loading });
    return loading;
  }

  /**
   * Writes a new manifest with put-if-absent. Resolves `{ created: true }`
   * with the new manifest, or `{ created: false }` with the one that already
   * exists (whatever its shard count, config and state).
   */
  async create(
    queue: string,
    shardCount: number,
    config: QueueConfig,
    state: QueueState = "creating",
  ): Promise<{ manifest: QueueManifest; created: boolean }> {
    validateName("queue", queue);
    if (!Number.isInteger(shardCount) || shardCount < 1 || shardCount > MAX_SHARD_COUNT)
      throw new CasqError(
        "invalid_argument",
        `shard_count must be between 1 and ${MAX_SHARD_COUNT}, got ${shardCount}`,
      );
    const fields = { queue, shardCount, createdAt: this.clock.now(), state, config };
    // A manifest that exists already is read below; without one, no shard document may exist.
    const manifestExists = await this.refuseStrayShards(queue);
    if (!manifestExists) {
      try {
        const put = await this.store.put(manifestKey(queue), encodeManifest(fields), { ifAbsent: true });
        const manifest: QueueManifest = { ...fields, etag: put.etag };
        this.remember(manifest);
        return { manifest, created: true };
      } catch (error) {
        if (!isStoreError(error, "precondition_failed")) throw storeFailure(error, queue);
      }
    }
    const existing = await this.load(queue);
    if (existing === undefined)
      throw new CasqError(
        "unavailable",
        `queue ${queue} was being created and deleted at the same time; retry`,
        { queue },
      );
    return { manifest: existing, created: false };
  }

  /**
   * Lists the queue's objects before its manifest is written. Resolves true
   * when the manifest exists already (the caller reads it instead of
   * writing); throws `failed_precondition` when it does not but shard
   * documents do (see the module header): they are never adopted.
   */
  private async refuseStrayShards(queue: string): Promise<boolean> {
    let listed: { key: string }[];
    try {
      listed = await this.store.list(`queues/${queue}/`);
    } catch (error) {
      throw storeFailure(error, queue);
    }
    const keys = listed.map((entry) => entry.key);
    if (keys.includes(manifestKey(queue))) return true;
    const heads = /^queues\/[^/]+\/[0-9]+\.json$/;
    const strays = keys.filter((key) => heads.test(key)).sort();
    if (strays.length === 0) return false;
    const more = strays.length > 3 ? ` and ${strays.length - 3} more` : "";
    throw new CasqError(
      "failed_precondition",
      `queue ${queue} cannot be created: shard document ${strays.slice(0, 3).join(", ")}${more} already exists but belongs to no queue (queue ${queue} has no manifest: left by a deleted queue, or written after the deletion by an older casq broker); it is not adopted as the new queue's. Delete or move it away with your store's tools (keep a copy if its messages matter), then create the queue again`,
      { queue },
    );
  }

  /** Moves a manifest to `state` with a CAS on the etag it was read with. Resolves the new manifest. */
  async setState(manifest: QueueManifest, state: QueueState): Promise<QueueManifest> {
    if (manifest.state === state) return manifest;
    const next = { ...manifest, state };
    try {
      const put = await this.store.put(manifestKey(manifest.queue), encodeManifest(next), {
        ifMatch: manifest.etag,
      });
      const written: QueueManifest = { ...next, etag: put.etag };
      this.remember(written);
      return written;
    } catch (error) {
      if (isStoreError(error, "precondition_failed")) {
        this.cache.delete(manifest.queue);
        throw new CasqError(
          "unavailable",
          `queue ${manifest.queue} was changed by someone else meanwhile; retry`,
          { queue: manifest.queue },
        );
      }
      throw storeFailure(error, manifest.queue);
    }
  }

  /** Deletes a manifest (if it is still the version read). The queue no longer exists. */
  async remove(manifest: QueueManifest): Promise<void> {
    try {
      await this.store.delete(manifestKey(manifest.queue), { ifMatch: manifest.etag });
    } catch (error) {
      if (!isStoreError(error, "precondition_failed")) throw storeFailure(error, manifest.queue);
    }
    this.cache.set(manifest.queue, { manifest: undefined, loadedAt: this.clock.now() });
  }

  /**
   * Queues in service (`ready`), sorted by name, starting after the queue
   * named `after`: at most `pageSize` of them. A queue whose manifest cannot
   * be read (`data_loss`) is listed as an {@link UnreadableQueue} instead of
   * failing the whole listing.
   */
  async list(pageSize: number, after?: string): Promise<QueuePage> {
    let keys: { key: string }[];
    try {
      keys = await this.store.list("queues/");
    } catch (error) {
      throw storeFailure(error, undefined);
    }
    const names = keys
      .map((entry) => /^queues\/([^/]+)\/queue\.json$/.exec(entry.key)?.[1])
      .filter((name): name is string => name !== undefined && (after === undefined || name > after))
      .sort();
    const queues: (QueueManifest | UnreadableQueue)[] = [];
    let index = 0;
    // Read manifests a few at a time until the page is full (skipping queues not in service).
    while (queues.length < pageSize && index < names.length) {
      const batch = names.slice(index, index + Math.min(16, pageSize - queues.length));
      index += batch.length;
      const loaded = await Promise.all(
        batch.map((name) =>
          this.freshOrLoad(name).catch((error: unknown): UnreadableQueue => {
            if (!isCasqError(error, "data_loss")) throw error;
            return { queue: name, problem: error.message };
          }),
        ),
      );
      for (const entry of loaded)
        if (entry !== undefined && (!("state" in entry) || entry.state === "ready")) queues.push(entry);
    }
    const last = queues.at(-1);
    return { queues, nextAfter: index < names.length && last ? last.queue : undefined };
  }

  /** Forgets everything cached about a queue. */
  forget(queue: string): void {
    this.cache.delete(queue);
  }

  private async freshOrLoad(queue: string): Promise<QueueManifest | undefined> {
    const entry = this.cache.get(queue);
    if (entry && this.clock.now() - entry.loadedAt < this.refreshMs) return entry.manifest;
    return this.load(queue);
  }

  private remember(manifest: QueueManifest): void {
    this.cache.set(manifest.queue, { manifest, loadedAt: this.clock.now() });
  }

  private async read(queue: string): Promise<QueueManifest | undefined> {
    let stored: Awaited<ReturnType<ObjectStore["get"]>>;
    try {
      stored = await this.store.get(manifestKey(queue));
    } catch (error) {
      throw storeFailure(error, queue);
    }
    if (stored === undefined) return undefined;
    return { ...decodeManifest(queue, stored.body), etag: stored.etag };
  }
}

function isCasqError404(error: unknown): boolean {
  return isCasqError(error, "not_found");
}

/** A manifest as Enqueue's auto-creation writes it, not yet ready. */
function isAutoCreation(manifest: QueueManifest): boolean {
  return (
    manifest.state === "creating" &&
    manifest.shardCount === 1 &&
    sameConfig(manifest.config, DEFAULT_QUEUE_CONFIG)
  );
}

/**
 * What a broker does about a shard whose document it finds missing (the
 * module header says why):
 *
 * - `"create"`: create it empty — the manifest is `creating` and has the shard.
 * - `"lost"`: refuse the shard with `data_loss` — the manifest is `ready`
 *   and has the shard, so its document existed and was lost; or the
 *   manifest cannot be read (never create under what cannot be read).
 * - `"absent"`: answer `not_found` and write nothing — no manifest, a
 *   `deleting` one, or one without this shard.
 *
 * Reads the manifest from the store (not a cache: a cached one may be
 * stale). Store failures are thrown (`unavailable`).
 */
export async function missingShardVerdict(
  store: ObjectStore,
  queue: string,
  shard: number,
): Promise<"create" | "lost" | "absent"> {
  let stored: Awaited<ReturnType<ObjectStore["get"]>>;
  try {
    stored = await store.get(manifestKey(queue));
  } catch (error) {
    throw storeFailure(error, queue);
  }
  if (stored === undefined) return "absent";
  let manifest: ManifestFields;
  try {
    manifest = decodeManifest(queue, stored.body);
  } catch {
    return "lost";
  }
  if (shard >= manifest.shardCount || manifest.state === "deleting") return "absent";
  return manifest.state === "ready" ? "lost" : "create";
}

/**
 * True when the queue's manifest says shard `shard` has a document (it is
 * `ready` with that shard, or cannot be read): a shard whose document is then
 * missing lost its data ({@link missingShardVerdict} says `"lost"`).
 */
export async function shardDocumentExpected(
  store: ObjectStore,
  queue: string,
  shard: number,
): Promise<boolean> {
  return (await missingShardVerdict(store, queue, shard)) === "lost";
}

/** The `not_found` of a queue that does not exist (also of one being deleted, to a shard's leader). */
export function queueNotFound(queue: string): CasqError {
  return new CasqError(
    "not_found",
    `queue ${queue} does not exist; create it with AdminService.CreateQueue (or \`casq queue create ${queue}\`)`,
    { queue },
  );
}

function storeFailure(error: unknown, queue: string | undefined): CasqError {
  if (error instanceof CasqError) return error;
  const details = queue === undefined ? {} : { queue };
  if (isStoreError(error) && error.kind !== "invalid")
    return new CasqError("unavailable", `object store: ${error.message}; retry`, details, { cause: error });
  return new CasqError("internal", `queue catalog: ${String(error)}`, details, { cause: error });
}

type ManifestFields = Omit<QueueManifest, "etag">;

const CONFIG_FIELDS = [
  ["lease_ttl_ms", "leaseTtlMs"],
  ["max_attempts", "maxAttempts"],
  ["dedup_window_ms", "dedupWindowMs"],
  ["retention_ms", "retentionMs"],
  ["max_payload_bytes", "maxPayloadBytes"],
  ["max_document_bytes", "maxDocumentBytes"],
  ["max_batch", "maxBatch"],
  ["dead_letter_limit", "deadLetterLimit"],
  ["max_headers", "maxHeaders"],
  ["max_header_bytes", "maxHeaderBytes"],
  ["max_subscriptions", "maxSubscriptions"],
] as const;

const BACKOFF_FIELDS = [
  ["initial_ms", "initialMs"],
  ["multiplier", "multiplier"],
  ["max_ms", "maxMs"],
  ["jitter", "jitter"],
] as const;

/** The canonical bytes of a manifest. */
export function encodeManifest(m: ManifestFields): Uint8Array {
  const config: Record<string, unknown> = {};
  for (const [json, field] of CONFIG_FIELDS) config[json] = m.config[field];
  const backoff: Record<string, unknown> = {};
  for (const [json, field] of BACKOFF_FIELDS) backoff[json] = m.config.backoff[field];
  config.backoff = backoff;
  return new TextEncoder().encode(
    JSON.stringify({
      format: QUEUE_MANIFEST_FORMAT,
      queue: m.queue,
      shard_count: m.shardCount,
      created_at: m.createdAt,
      state: m.state,
      config,
    }),
  );
}

/** Parses a manifest strictly; anything unexpected is `data_loss` (never overwritten). */
export function decodeManifest(queue: string, bytes: Uint8Array): ManifestFields {
  const fail = (problem: string): never => {
    throw new CasqError(
      "data_loss",
      `queue manifest ${manifestKey(queue)} cannot be read (${problem}); it is left untouched — inspect it, restore it from a backup or move it aside`,
      { queue },
    );
  };
  let doc: unknown;
  try {
    doc = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (error) {
    return fail(`not UTF-8 JSON: ${error instanceof Error ? error.message : String(error)}`);
  }
  if (typeof doc !== "object" || doc === null || Array.isArray(doc)) return fail("not a JSON object");
  const top = doc as Record<string, unknown>;
  if (top.format !== QUEUE_MANIFEST_FORMAT)
    return fail(`format ${JSON.stringify(top.format)}, this casq understands ${QUEUE_MANIFEST_FORMAT}`);
  if (top.queue !== queue) return fail(`it names queue ${JSON.stringify(top.queue)}`);
  const shardCount = top.shard_count;
  if (
    typeof shardCount !== "number" ||
    !Number.isInteger(shardCount) ||
    shardCount < 1 ||
    shardCount > MAX_SHARD_COUNT
  )
    return fail(`shard_count ${JSON.stringify(shardCount)}`);
  const createdAt = top.created_at;
  if (typeof createdAt !== "number" || !Number.isSafeInteger(createdAt) || createdAt < 0)
    return fail(`created_at ${JSON.stringify(createdAt)}`);
  const state = top.state;
  if (state !== "creating" && state !== "ready" && state !== "deleting")
    return fail(`state ${JSON.stringify(state)}`);
  const rawConfig = top.config;
  if (typeof rawConfig !== "object" || rawConfig === null) return fail("no config");
  const c = rawConfig as Record<string, unknown>;
  const b = (c.backoff ?? {}) as Record<string, unknown>;
  const config: Record<string, unknown> = {};
  for (const [json, field] of CONFIG_FIELDS) config[field] = c[json];
  const backoff: Record<string, unknown> = {};
  for (const [json, field] of BACKOFF_FIELDS) backoff[field] = b[json];
  config.backoff = backoff;
  const problem = configProblem(config as unknown as QueueConfig);
  if (problem !== undefined) return fail(problem);
  return { queue, shardCount, createdAt, state, config: config as unknown as QueueConfig };
}
