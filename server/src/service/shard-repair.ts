/**
 * AdminService.RepairShard: the operator's way out of a refused shard.
 *
 * A shard document the brokers refuse (it does not parse, names another
 * queue or shard, or is missing although the queue's manifest says it
 * exists) blocks every call for that shard, DeleteQueue and PurgeQueue
 * included: casq never writes over what it cannot read. The repair does, on
 * an operator's explicit request, in this order:
 *
 * 1. Read the stored head and check it is really refused (a readable shard,
 *    its segments included, is left alone), that a newer casq did not write
 *    it (then the brokers need upgrading, not the shard repairing) and, when
 *    asked, that it is still the version the operator looked at
 *    (`expected_etag`).
 * 2. Copy the refused bytes, exactly, to `repairs/<queue>/<shard>/<ms>.json`,
 *    and every segment object of the shard to
 *    `repairs/<queue>/<shard>/<ms>/seg/<name>` (put-if-absent; casq never
 *    deletes anything under `repairs/`).
 * 3. Build a fresh v2 head, salvaging what the bytes still tell when they
 *    are JSON for this very shard: the config, the subscriptions,
 *    `next_offset` (offsets are never reused) and the messages — the head's
 *    own (its tail, or a v1 document's list) and those of the segments it
 *    references that can still be read, less the offsets it marks `gone`.
 *    When the head is gone (missing, not JSON, or another shard's), the
 *    messages of every segment object under the shard's prefix are
 *    salvaged instead (a message in several is taken once). Salvaged
 *    messages become pending again for every subscription, all in the new
 *    head's tail (acks, leases and dedup ids are lost: at-least-once); the
 *    first leader write seals them into new segments. Dead letters are
 *    salvaged the same way — the head's own and those of the dead-letter
 *    segments it indexes (less the positions it marks gone), or of every
 *    dead-letter segment object when the head is gone — as dead letters of
 *    their subscription in the new head, except where their message is
 *    salvaged as pending (it will be delivered again anyway).
 *    What the bytes do not tell comes from a readable sibling shard, else
 *    from the manifest. The strict decoder judges the result; a salvage it
 *    refuses is dropped, part by part.
 * 4. The new head references no segment, so it never names one that is not
 *    in the store. Its broker record is a released lease whose epoch is the
 *    highest the old head or any segment name shows: the next leader takes
 *    over with a higher epoch, and its takeover sweep deletes the old
 *    segments (now unreferenced and of earlier epochs; their backup stays).
 * 5. Write it with a CAS on the refused version (put-if-absent for a missing
 *    one), so a concurrent change is never overwritten, then drop this
 *    broker's leader of the shard so that the next request loads the new
 *    document. Other brokers re-read a refused shard on every request.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { RepairShardRequest, RepairShardResponseSchema } from "@casq/api/casq/v1/admin_service_pb.ts";
import { shardDocumentExpected } from "../broker/queue-catalog.ts";
import { shardKey } from "../broker/shard-key.ts";
import { readShardSnapshot } from "../broker/shard-snapshot.ts";
import { CasqError, isCasqError } from "../errors.ts";
import { applyOperation } from "../model/apply-operation.ts";
import { SHARD_FORMAT, SHARD_FORMAT_V1 } from "../model/document-formats.ts";
import type { QueueConfig } from "../model/queue-config.ts";
import { segmentEpoch, segmentFirst, segmentPrefix } from "../model/segment-codec.ts";
import { ShardState } from "../model/shard-state.ts";
import type { ObjectStore, StoredObject } from "../store/object-store.ts";
import { isStoreError } from "../store/store-errors.ts";
import type { ServiceContext } from "./service-context.ts";
import { getShardObject } from "./shard-directory.ts";
import { readShard } from "./shard-reader.ts";
import { checkQueueName } from "./validation.ts";

/** Where every backup of a repaired shard document goes. */
export const REPAIR_BACKUP_PREFIX = "repairs/";

type Json = Record<string, unknown>;

/** Runs one RepairShard call (see the module header). */
export async function repairShard(
  ctx: ServiceContext,
  req: RepairShardRequest,
): Promise<MessageInitShape<typeof RepairShardResponseSchema>> {
  const queue = checkQueueName(req.queue);
  // Checked before anything is read or written: offsets are JSON numbers, exact only up to 2^53 - 1.
  if (req.nextOffset !== undefined && req.nextOffset > BigInt(Number.MAX_SAFE_INTEGER))
    throw new CasqError(
      "invalid_argument",
      `next_offset ${req.nextOffset} is too large: offsets go up to ${Number.MAX_SAFE_INTEGER} (2^53 - 1)`,
      { queue },
    );
  const manifest = await ctx.catalog.require(queue);
  const shard = req.shard;
  if (shard >= manifest.shardCount)
    throw new CasqError(
      "invalid_argument",
      `shard ${shard} is out of range: queue ${queue} has ${manifest.shardCount} shard(s)`,
      { queue },
    );
  const stored = await getShardObject(ctx.store, queue, shard);
  const problem = await refusal(ctx.store, queue, shard, stored);
  if (problem === undefined)
    throw new CasqError(
      "failed_precondition",
      `shard ${queue}/${shard} is readable; there is nothing to repair`,
      { queue, shard },
    );
  const format = newerFormat(stored?.body);
  if (format !== undefined)
    throw new CasqError(
      "failed_precondition",
      `shard ${queue}/${shard} has format ${format}, written by a newer casq than this broker: upgrade the brokers instead of repairing it (a repair here would replace it with what this casq can salvage)`,
      { queue, shard },
    );
  if (req.expectedEtag !== "" && req.expectedEtag !== (stored?.etag ?? ""))
    throw new CasqError(
      "failed_precondition",
      `shard ${queue}/${shard} changed since you looked at it (etag ${req.expectedEtag}, now ${stored?.etag || "missing"}); look again, then repair`,
      { queue, shard },
    );

  const now = Math.floor(ctx.clock.now());
  const backupKey = stored === undefined ? "" : await backup(ctx.store, queue, shard, now, stored.body);
  const raw = parseOwn(stored?.body, queue, shard);
  const segments = await salvageSegments(ctx.store, queue, shard, now, raw);
  const fallback = await siblingShape(ctx, queue, shard, manifest.shardCount);
  const built = rebuild(
    queue,
    shard,
    now,
    raw,
    segments,
    fallback ?? { config: manifest.config, subscriptions: [], source: "manifest" },
  );
  const minimum = req.nextOffset === undefined ? 0 : Number(req.nextOffset);
  const state = built.state.nextOffset >= minimum ? built.state : rebuildWithOffset(built.json, minimum);
  const bytes = state.encode();
  let etag: string;
  try {
    const put = await ctx.store.put(
      shardKey(queue, shard),
      bytes,
      stored === undefined ? { ifAbsent: true } : { ifMatch: stored.etag },
    );
    etag = put.etag;
  } catch (error) {
    if (isStoreError(error, "precondition_failed"))
      throw new CasqError(
        "unavailable",
        `shard ${queue}/${shard} changed during the repair; nothing was written over it (the backup ${backupKey || "-"} stays); look again and retry`,
        { queue, shard },
      );
    if (isStoreError(error))
      throw new CasqError(
        "unavailable",
        `object store: ${error.message}; retry`,
        { queue, shard },
        { cause: error },
      );
    throw error;
  }
  await ctx.broker.dropShard(queue, shard);
  ctx.directory.forget(queue);
  const response = {
    problem,
    backupKey,
    etag,
    messagesSalvaged: BigInt(built.messages),
    subscriptions: state.subscriptionNames(),
    nextOffset: BigInt(state.nextOffset),
    configSource: built.configSource,
  };
  ctx.logger.warn(
    { queue, shard, backupKey, messagesSalvaged: built.messages, nextOffset: state.nextOffset, problem },
    "shard repaired: the refused document was replaced",
  );
  return response;
}

/** Why the shard is refused, or undefined when it is not (read as a broker loads it: head and segments). */
async function refusal(
  store: ObjectStore,
  queue: string,
  shard: number,
  stored: StoredObject | undefined,
): Promise<string | undefined> {
  if (stored === undefined)
    return (await shardDocumentExpected(store, queue, shard))
      ? `shard document ${shardKey(queue, shard)} is missing though the queue was created with this shard`
      : undefined;
  try {
    await readShardSnapshot(store, queue, shard, stored);
    return undefined;
  } catch (error) {
    if (!isCasqError(error, "data_loss")) throw error;
    return error.message;
  }
}

/** The format of a shard head written by a newer casq (`casq.shard.*` unknown here), else undefined. */
function newerFormat(body: Uint8Array | undefined): string | undefined {
  let format: unknown;
  try {
    format = (JSON.parse(new TextDecoder().decode(body)) as Json | null)?.format;
  } catch {
    return undefined;
  }
  return typeof format === "string" &&
    format.startsWith("casq.shard.") &&
    format !== SHARD_FORMAT &&
    format !== SHARD_FORMAT_V1
    ? format
    : undefined;
}

/** Copies the refused bytes to a fresh key under `repairs/`. Resolves the key. */
async function backup(
  store: ObjectStore,
  queue: string,
  shard: number,
  now: number,
  body: Uint8Array,
  suffix = ".json",
): Promise<string> {
  for (let n = 0; ; n++) {
    const key = `${REPAIR_BACKUP_PREFIX}${queue}/${shard}/${now}${n === 0 ? "" : `-${n}`}${suffix}`;
    try {
      await store.put(key, body, { ifAbsent: true });
      return key;
    } catch (error) {
      if (isStoreError(error, "precondition_failed") && n < 100) continue;
      if (isStoreError(error))
        throw new CasqError(
          "unavailable",
          `object store: ${error.message}; nothing was changed, retry`,
          { queue, shard },
          { cause: error },
        );
      throw error;
    }
  }
}

/** What the shard's segment objects still hold (module header, steps 2–4). */
interface SegmentSalvage {
  /** Salvaged messages (JSON, without `targets`), by ascending offset, each offset once. */
  readonly messages: readonly Json[];
  /** Salvaged sealed dead letters (JSON) by subscription, oldest first (before the head's own). */
  readonly deadLetters: ReadonlyMap<string, readonly Json[]>;
  /** The highest epoch the old head or a segment name shows (0: none). */
  readonly epoch: number;
}

/**
 * Backs up every segment object of the shard under
 * `repairs/<queue>/<shard>/<now>/seg/` and collects the messages to salvage:
 * those of the segments `raw` (the refused head, when it is this shard's
 * JSON) references, itself or through its index segments, less their `gone`
 * offsets, and for an index segment that cannot be read those of every
 * segment object named in its offset range; without such a head, those of
 * every segment object.
 */
async function salvageSegments(
  store: ObjectStore,
  queue: string,
  shard: number,
  now: number,
  raw: Json | undefined,
): Promise<SegmentSalvage> {
  const prefix = segmentPrefix(queue, shard);
  const storeFailure = (error: unknown): never => {
    if (isStoreError(error))
      throw new CasqError(
        "unavailable",
        `object store: ${error.message}; nothing was changed, retry`,
        { queue, shard },
        { cause: error },
      );
    throw error;
  };
  const listed = await store.list(prefix).catch(storeFailure);
  const names = listed.map((entry) => entry.key.slice(prefix.length)).sort();
  const broker = raw?.broker as Json | null | undefined;
  let epoch = typeof broker?.epoch === "number" && Number.isSafeInteger(broker.epoch) ? broker.epoch : 0;
  for (const name of names) epoch = Math.max(epoch, segmentEpoch(name) ?? 0);

  // Which dead-letter segments to take dead letters from (in the head's order), and which positions it dropped.
  const deadWanted = new Map<string, { subscription: string; gone: (position: number) => boolean }>();
  if (Array.isArray(raw?.subscriptions)) {
    for (const sub of raw.subscriptions as unknown[]) {
      if (typeof sub !== "object" || sub === null || typeof (sub as Json).name !== "string") continue;
      const refs = (sub as Json).dead_letter_segments;
      if (!Array.isArray(refs)) continue;
      for (const ref of refs as unknown[])
        if (typeof ref === "object" && ref !== null && typeof (ref as Json).name === "string")
          deadWanted.set((ref as Json).name as string, {
            subscription: (sub as Json).name as string,
            gone: goneOffsets((ref as Json).gone),
          });
    }
  }
  const deadObjects = new Map<string, { subscription: string; letters: Json[] }>();

  // Which segments to take messages from, and which of their offsets the head dropped: those the
  // head lists itself and those its index segments list. Without a head, every segment object; for
  // an index segment that cannot be read, every segment object whose first offset lies in its range.
  const refs = Array.isArray(raw?.segments) ? [...(raw.segments as unknown[])] : undefined;
  const unreadRanges: [number, number][] = refs === undefined ? [[0, Number.MAX_SAFE_INTEGER]] : [];
  if (refs !== undefined && Array.isArray(raw?.index_segments))
    for (const idx of raw.index_segments as unknown[]) {
      const entry = typeof idx === "object" && idx !== null ? (idx as Json) : {};
      const stored =
        typeof entry.name === "string" ? await store.get(prefix + entry.name).catch(storeFailure) : undefined;
      const listed = stored === undefined ? undefined : parseOwn(stored.body, queue, shard)?.segments;
      if (Array.isArray(listed)) refs.push(...(listed as unknown[]));
      else
        unreadRanges.push([
          typeof entry.first === "number" ? entry.first : 0,
          typeof entry.last === "number" ? entry.last : Number.MAX_SAFE_INTEGER,
        ]);
    }
  const wanted = new Map<string, (offset: number) => boolean>();
  for (const ref of refs ?? []) {
    if (typeof ref !== "object" || ref === null || typeof (ref as Json).name !== "string") continue;
    wanted.set((ref as Json).name as string, goneOffsets((ref as Json).gone));
  }
  for (const name of names) {
    const first = segmentFirst(name);
    if (
      !wanted.has(name) &&
      first !== undefined &&
      unreadRanges.some(([from, to]) => first >= from && first <= to)
    )
      wanted.set(name, () => false);
  }

  const byOffset = new Map<number, Json>();
  for (const name of names) {
    const stored = await store.get(prefix + name).catch(storeFailure);
    if (stored === undefined) continue;
    await backup(store, queue, shard, now, stored.body, `/seg/${name}`);
    const dead = segmentDeadLetters(stored.body, queue, shard);
    if (dead !== undefined) {
      const ref = deadWanted.get(name);
      // With a head, only the dead-letter segments it indexes (less what it marks gone); without, all of them.
      if (raw !== undefined && ref === undefined) continue;
      if (ref !== undefined && ref.subscription !== dead.subscription) continue;
      deadObjects.set(name, {
        subscription: dead.subscription,
        letters: dead.letters.filter((_, position) => !ref?.gone(position)),
      });
      continue;
    }
    const gone = wanted.get(name);
    if (gone === undefined) continue;
    for (const m of segmentMessages(stored.body, queue, shard)) {
      const offset = m.offset as number;
      if (!gone(offset) && !byOffset.has(offset)) byOffset.set(offset, m);
    }
  }
  // Oldest first: in the head's index order, else by object name.
  const order = raw !== undefined ? [...deadWanted.keys()] : [...deadObjects.keys()].sort();
  const deadLetters = new Map<string, Json[]>();
  for (const name of order) {
    const found = deadObjects.get(name);
    if (found === undefined) continue;
    const list = deadLetters.get(found.subscription) ?? [];
    list.push(...found.letters);
    deadLetters.set(found.subscription, list);
  }
  return { messages: [...byOffset.values()], deadLetters, epoch };
}

/** The subscription and dead letters of a dead-letter segment object of this shard; undefined when it is not one. */
function segmentDeadLetters(
  body: Uint8Array,
  queue: string,
  shard: number,
): { subscription: string; letters: Json[] } | undefined {
  const doc = parseOwn(body, queue, shard);
  if (doc === undefined || typeof doc.subscription !== "string" || !Array.isArray(doc.dead_letters))
    return undefined;
  const letters = (doc.dead_letters as unknown[]).filter(
    (dl): dl is Json => typeof dl === "object" && dl !== null,
  );
  return { subscription: doc.subscription, letters };
}

/**
 * `doc` with the salvaged dead letters in its subscriptions' `dead_letters`:
 * the sealed ones, then the refused head's own, each offset once per
 * subscription, leaving out those whose message is salvaged as pending (a
 * dead letter must be of a message its subscription settled).
 */
function withDeadLetters(
  doc: Json,
  raw: Json | undefined,
  segments: SegmentSalvage,
  messages: readonly Json[],
): Json {
  const pendingOffsets = new Set(messages.map((m) => m.offset));
  const headOwn = new Map<string, Json[]>();
  if (Array.isArray(raw?.subscriptions))
    for (const sub of raw.subscriptions as unknown[])
      if (typeof sub === "object" && sub !== null && typeof (sub as Json).name === "string") {
        const own = (sub as Json).dead_letters;
        if (Array.isArray(own))
          headOwn.set(
            (sub as Json).name as string,
            (own as unknown[]).filter((dl): dl is Json => typeof dl === "object" && dl !== null),
          );
      }
  if (!Array.isArray(doc.subscriptions)) return doc;
  const subscriptions = (doc.subscriptions as unknown[]).map((sub) => {
    if (typeof sub !== "object" || sub === null) return sub;
    const name = (sub as Json).name as string;
    const seen = new Set<unknown>();
    const letters: Json[] = [];
    for (const dl of [...(segments.deadLetters.get(name) ?? []), ...(headOwn.get(name) ?? [])]) {
      const offset = (dl.message as Json | undefined)?.offset;
      if (typeof offset !== "number" || seen.has(offset) || pendingOffsets.has(offset)) continue;
      seen.add(offset);
      letters.push(dl);
    }
    return { ...(sub as Json), dead_letters: letters };
  });
  return { ...doc, subscriptions };
}

/** A head's `gone` ranges (`[[from, to], ...]`, inclusive) as a membership test; malformed ranges are ignored. */
function goneOffsets(gone: unknown): (offset: number) => boolean {
  const ranges: [number, number][] = [];
  if (Array.isArray(gone))
    for (const range of gone) {
      if (!Array.isArray(range)) continue;
      const [from, to] = range as unknown[];
      if (typeof from === "number" && typeof to === "number" && from <= to) ranges.push([from, to]);
    }
  return (offset) => ranges.some(([from, to]) => offset >= from && offset <= to);
}

/** The messages of a segment object of this shard (JSON, without `targets`); none when it is not one. */
function segmentMessages(body: Uint8Array, queue: string, shard: number): Json[] {
  const doc = parseOwn(body, queue, shard);
  if (doc === undefined || !Array.isArray(doc.messages)) return [];
  return (doc.messages as unknown[])
    .filter((m): m is Json => typeof m === "object" && m !== null && Number.isSafeInteger((m as Json).offset))
    .map(({ targets: _, ...m }) => m);
}

interface Shape {
  readonly config: QueueConfig;
  readonly subscriptions: readonly string[];
  readonly source: string;
}

/** Config and subscriptions of the first readable other shard of the queue. */
async function siblingShape(
  ctx: ServiceContext,
  queue: string,
  shard: number,
  shards: number,
): Promise<Shape | undefined> {
  for (let other = 0; other < shards; other++) {
    if (other === shard) continue;
    try {
      const read = await readShard(ctx.broker, ctx.store, queue, other, (state) => ({
        config: state.config,
        subscriptions: state.subscriptionNames(),
      }));
      if (read.value !== undefined) return { ...read.value, source: `shard ${other}` };
    } catch {
      // An unreadable or unreachable sibling just does not help.
    }
  }
  return undefined;
}

/** The new document: the salvage that the strict decoder accepts, most complete first. */
function rebuild(
  queue: string,
  shard: number,
  now: number,
  raw: Json | undefined,
  segments: SegmentSalvage,
  fallback: Shape,
): { state: ShardState; json: Json; messages: number; configSource: string } {
  const rawConfig = raw?.config;
  const names = subscriptionNames(raw) ?? fallback.subscriptions;
  const base = (config: QueueConfig | undefined) => {
    const state = ShardState.create({ queue, shard, now, ...(config ? { config } : {}) });
    for (const name of names) {
      if (state.subscriptionNames().includes(name)) continue;
      try {
        applyOperation(state, { kind: "createSubscription", name }, now);
      } catch {
        // A name or count the config does not allow is not salvaged.
      }
    }
    if (names.length > 0 && !names.includes("default"))
      applyOperation(state, { kind: "deleteSubscription", name: "default" }, now);
    const json = JSON.parse(new TextDecoder().decode(state.encode())) as Json;
    // A released lease above every epoch the old shard used (module header, step 4).
    if (segments.epoch > 0)
      json.broker = { id: "casq-repair", address: "", epoch: segments.epoch, lease_until: 0 };
    return json;
  };
  const skeleton = base(fallback.config);
  const nextOffset =
    typeof raw?.next_offset === "number" && Number.isSafeInteger(raw.next_offset) ? raw.next_offset : 0;
  const own = Array.isArray(raw?.messages)
    ? (raw.messages as unknown[])
        .filter((m): m is Json => typeof m === "object" && m !== null)
        .map(({ targets: _, ...m }) => m)
    : [];
  // The head's own messages and its segments', ascending offsets, each offset once (the head's copy first).
  const seen = new Set(own.map((m) => m.offset));
  const messages = [...own, ...segments.messages.filter((m) => !seen.has(m.offset))].sort(
    (a, b) => (typeof a.offset === "number" ? a.offset : 0) - (typeof b.offset === "number" ? b.offset : 0),
  );
  // Offsets are never reused: above every salvaged message and sealed dead letter.
  const sealedDead = [...segments.deadLetters.values()].flat().map((dl) => dl.message as Json | undefined);
  const highest = [...messages, ...sealedDead].reduce(
    (n, m) => (typeof m?.offset === "number" ? Math.max(n, m.offset + 1) : n),
    0,
  );
  const tries: { json: Json; messages: number; configSource: string }[] = [];
  const withOffset = (doc: Json) => raiseNextOffset(doc, Math.max(nextOffset, highest), messages);
  if (rawConfig !== undefined) {
    tries.push({
      json: { ...withOffset(skeleton), config: rawConfig, messages },
      messages: messages.length,
      configSource: "document",
    });
    tries.push({
      json: { ...withOffset(skeleton), config: rawConfig },
      messages: 0,
      configSource: "document",
    });
  }
  tries.push({
    json: { ...withOffset(skeleton), messages },
    messages: messages.length,
    configSource: fallback.source,
  });
  tries.push({ json: withOffset(skeleton), messages: 0, configSource: fallback.source });
  tries.push({ json: skeleton, messages: 0, configSource: fallback.source });
  // Each salvage first with the dead letters, then without them.
  const withDead = tries.flatMap((t) => [
    {
      ...t,
      json: withDeadLetters(
        t.json,
        raw,
        segments,
        Array.isArray(t.json.messages) ? (t.json.messages as Json[]) : [],
      ),
    },
    t,
  ]);
  for (const attempt of withDead) {
    if (attempt.messages === 0 && Array.isArray(attempt.json.messages) && attempt.json.messages.length > 0)
      continue;
    try {
      const state = ShardState.decode(new TextEncoder().encode(JSON.stringify(attempt.json)), {
        expected: { queue, shard },
      });
      return { state, ...attempt };
    } catch {
      // Not accepted: try a smaller salvage.
    }
  }
  return {
    state: ShardState.decode(new TextEncoder().encode(JSON.stringify(skeleton)), {
      expected: { queue, shard },
    }),
    json: skeleton,
    messages: 0,
    configSource: fallback.source,
  };
}

function rebuildWithOffset(json: Json, nextOffset: number): ShardState {
  const messages = Array.isArray(json.messages) ? (json.messages as Json[]) : [];
  return ShardState.decode(
    new TextEncoder().encode(JSON.stringify(raiseNextOffset(json, nextOffset, messages))),
  );
}

/**
 * `doc` with `next_offset` set to `next` and every subscription's
 * `acked_below` moved up to the first salvaged message (all of them are
 * pending for every subscription), or to `next` when there is none. Left at
 * 0, the loader would walk every offset of the gap one by one, which for a
 * large `--next-offset` takes minutes.
 */
function raiseNextOffset(doc: Json, next: number, messages: readonly Json[]): Json {
  const first = messages.reduce(
    (n, m) => (typeof m.offset === "number" ? Math.min(n, m.offset) : n),
    Number.POSITIVE_INFINITY,
  );
  const ackedBelow = Math.min(first, next);
  const subscriptions = Array.isArray(doc.subscriptions)
    ? (doc.subscriptions as unknown[]).map((sub) =>
        typeof sub === "object" && sub !== null ? { ...(sub as Json), acked_below: ackedBelow } : sub,
      )
    : doc.subscriptions;
  return { ...doc, next_offset: next, subscriptions };
}

/** The bytes as a JSON object (a head or a segment), when they parse and claim to be this shard; otherwise undefined. */
function parseOwn(body: Uint8Array | undefined, queue: string, shard: number): Json | undefined {
  if (body === undefined) return undefined;
  let raw: unknown;
  try {
    raw = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(body));
  } catch {
    return undefined;
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) return undefined;
  const doc = raw as Json;
  // A document of another queue or shard holds their data, not this shard's.
  if (doc.queue !== queue || doc.shard !== shard) return undefined;
  return doc;
}

function subscriptionNames(raw: Json | undefined): string[] | undefined {
  if (!Array.isArray(raw?.subscriptions)) return undefined;
  const names = (raw.subscriptions as unknown[])
    .map((s) => (typeof s === "object" && s !== null ? (s as Json).name : undefined))
    .filter((n): n is string => typeof n === "string");
  return names.length > 0 ? [...new Set(names)].sort() : undefined;
}
