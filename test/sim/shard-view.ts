/**
 * A committed shard document as the auditor sees it: parsed straight from the
 * stored JSON (the public document format, `docs/document-format.md`), not
 * through the model's internals, so the checks judge what is actually in the
 * store.
 *
 * Per subscription and offset it answers one question: what is the status of
 * this message here — `pending` (not settled, not leased), `leased`, `acked`
 * (settled, not a dead letter) or `dead` (settled as a dead letter). A message
 * that left the document (offset below `next_offset`, not retained) is settled
 * for every subscription: `dead` where a dead letter holds it, `acked`
 * elsewhere.
 */

/** The leadership record of a document. */
export interface BrokerView {
  readonly id: string;
  readonly address: string;
  readonly epoch: number;
  readonly leaseUntil: number;
}

/** A lease as stored. */
export interface LeaseView {
  readonly worker: string;
  readonly claimedAt: number;
  readonly deadline: number;
  readonly ttlMs: number;
}

/** Delivery state of one unsettled message in one subscription. */
export interface DeliveryView {
  readonly attempt: number;
  readonly base: number;
  readonly availableAt: number | undefined;
  readonly lease: LeaseView | undefined;
}

/** A dead letter as stored. */
export interface DeadLetterView {
  readonly id: string;
  readonly attempts: number;
  readonly reason: string;
  readonly deadAt: number;
}

/** A retained message (contents the checks care about). */
export interface MessageView {
  readonly offset: number;
  readonly id: string;
  readonly dedupId: string | undefined;
  readonly enqueuedAt: number;
  readonly maxAttempts: number | undefined;
  readonly priority: number;
  /** When it becomes runnable (its delay), ms. */
  readonly runAt: number;
  readonly targets: readonly string[] | undefined;
}

/** One subscription's part of the document. */
export interface SubscriptionView {
  readonly name: string;
  readonly ackedBelow: number;
  readonly acked: ReadonlySet<number>;
  readonly deliveries: ReadonlyMap<number, DeliveryView>;
  readonly dead: ReadonlyMap<number, DeadLetterView>;
}

/** The status of a message in one subscription. */
export type MessageStatus = "pending" | "leased" | "acked" | "dead" | "unknown";

/** One committed version of a shard document. */
export interface ShardView {
  readonly key: string;
  readonly shard: number;
  /** Index of this version in the shard's history (0 = the creating write). */
  readonly version: number;
  readonly etag: string;
  /** Clock time when the write landed in the store. */
  readonly committedAt: number;
  readonly writeId: string | undefined;
  readonly broker: BrokerView | undefined;
  readonly nextOffset: number;
  readonly maxAttempts: number;
  /** The queue's dedup window in this version. */
  readonly dedupWindowMs: number;
  readonly messages: ReadonlyMap<number, MessageView>;
  readonly subscriptions: ReadonlyMap<string, SubscriptionView>;
}

type Json = Record<string, unknown>;

const num = (value: unknown): number => value as number;
const opt = (value: unknown): number | undefined => (value === undefined ? undefined : (value as number));

/** The offsets of v2 `acked` ranges (`[[from, to], ...]`, inclusive) or of a v1 list. */
function ackedOffsets(raw: unknown[]): number[] {
  return raw.flatMap((entry) => {
    if (typeof entry === "number") return [entry];
    const [from, to] = entry as [number, number];
    return Array.from({ length: to - from + 1 }, (_, i) => from + i);
  });
}

/**
 * Parses committed document bytes into a {@link ShardView}. A v2 head's
 * sealed messages come from its segments (`segments`: segment object name ->
 * bytes, as written to the store; those it lists itself and those its index
 * segments list), minus the offsets their entries mark gone;
 * sealed dead letters from its dead-letter segments, minus the positions
 * the head marks gone.
 * Throws on bytes that are not a JSON object, or a segment that is not given.
 */
export function parseShardView(
  key: string,
  bytes: Uint8Array,
  meta: { version: number; etag: string; committedAt: number },
  segments: ReadonlyMap<string, Uint8Array> = new Map(),
): ShardView {
  const doc = JSON.parse(new TextDecoder().decode(bytes)) as Json;
  const broker = doc.broker as Json | null;
  const messages = new Map<number, MessageView>();
  const raws: Json[] = [];
  // The segments the head lists itself, and those its index segments list.
  const refs = [...((doc.segments as Json[] | undefined) ?? [])];
  for (const idx of (doc.index_segments as Json[] | undefined) ?? []) {
    const stored = segments.get(idx.name as string);
    if (stored === undefined) throw new Error(`index segment ${String(idx.name)} was never written`);
    refs.push(...((JSON.parse(new TextDecoder().decode(stored)) as Json).segments as Json[]));
  }
  for (const ref of refs) {
    const stored = segments.get(ref.name as string);
    if (stored === undefined) throw new Error(`segment ${String(ref.name)} was never written`);
    const gone = new Set(ackedOffsets(ref.gone as unknown[]));
    const seg = JSON.parse(new TextDecoder().decode(stored)) as Json;
    for (const raw of seg.messages as Json[]) if (!gone.has(num(raw.offset))) raws.push(raw);
  }
  raws.push(...(doc.messages as Json[]));
  for (const raw of raws) {
    const offset = num(raw.offset);
    messages.set(offset, {
      offset,
      id: raw.id as string,
      dedupId: raw.dedup_id as string | undefined,
      enqueuedAt: num(raw.enqueued_at),
      maxAttempts: opt(raw.max_attempts),
      priority: opt(raw.priority) ?? 0,
      runAt: opt(raw.run_at) ?? num(raw.enqueued_at),
      targets: raw.targets as string[] | undefined,
    });
  }
  const subscriptions = new Map<string, SubscriptionView>();
  for (const raw of doc.subscriptions as Json[]) {
    const deliveries = new Map<number, DeliveryView>();
    for (const d of raw.deliveries as Json[]) {
      const lease = d.lease as Json | undefined;
      deliveries.set(num(d.offset), {
        attempt: num(d.attempts),
        base: opt(d.attempts_at_redrive) ?? 0,
        availableAt: opt(d.available_at),
        lease: lease && {
          worker: lease.worker as string,
          claimedAt: num(lease.claimed_at),
          deadline: num(lease.deadline),
          ttlMs: num(lease.ttl_ms),
        },
      });
    }
    const dead = new Map<number, DeadLetterView>();
    // Sealed dead letters (oldest) from their dead-letter segments, less the positions marked gone.
    const sealed: Json[] = [];
    for (const ref of (raw.dead_letter_segments as Json[] | undefined) ?? []) {
      const stored = segments.get(ref.name as string);
      if (stored === undefined) throw new Error(`dead-letter segment ${String(ref.name)} was never written`);
      const gone = new Set(ackedOffsets(ref.gone as unknown[]));
      const seg = JSON.parse(new TextDecoder().decode(stored)) as Json;
      (seg.dead_letters as Json[]).forEach((dl, position) => {
        if (!gone.has(position)) sealed.push(dl);
      });
    }
    for (const dl of [...sealed, ...(raw.dead_letters as Json[])]) {
      const message = dl.message as Json;
      dead.set(num(message.offset), {
        id: message.id as string,
        attempts: num(dl.attempts),
        reason: dl.reason as string,
        deadAt: num(dl.dead_at),
      });
    }
    const name = raw.name as string;
    subscriptions.set(name, {
      name,
      ackedBelow: num(raw.acked_below),
      acked: new Set(ackedOffsets(raw.acked as unknown[])),
      deliveries,
      dead,
    });
  }
  return {
    key,
    shard: num(doc.shard),
    version: meta.version,
    etag: meta.etag,
    committedAt: meta.committedAt,
    writeId: (doc.write_id as string | null) ?? undefined,
    broker: broker
      ? {
          id: broker.id as string,
          address: broker.address as string,
          epoch: num(broker.epoch),
          leaseUntil: num(broker.lease_until),
        }
      : undefined,
    nextOffset: num(doc.next_offset),
    maxAttempts: num((doc.config as Json).max_attempts),
    dedupWindowMs: num((doc.config as Json).dedup_window_ms),
    messages,
    subscriptions,
  };
}

/** True when the retained message at `offset` is settled for `sub`. */
function settledRetained(sub: SubscriptionView, message: MessageView): boolean {
  if (message.targets !== undefined) return !message.targets.includes(sub.name);
  return message.offset < sub.ackedBelow || sub.acked.has(message.offset);
}

/** The status of the message at `offset` in subscription `name` (see module header). */
export function statusOf(view: ShardView, name: string, offset: number): MessageStatus {
  const sub = view.subscriptions.get(name);
  if (sub === undefined || offset >= view.nextOffset) return "unknown";
  const message = view.messages.get(offset);
  if (message === undefined || settledRetained(sub, message)) return sub.dead.has(offset) ? "dead" : "acked";
  return sub.deliveries.get(offset)?.lease ? "leased" : "pending";
}

/** True for `acked` and `dead`. */
export function isSettledStatus(status: MessageStatus): boolean {
  return status === "acked" || status === "dead";
}

/** Effective max attempts of a retained message. */
export function maxAttemptsOf(view: ShardView, offset: number): number {
  return view.messages.get(offset)?.maxAttempts ?? view.maxAttempts;
}
