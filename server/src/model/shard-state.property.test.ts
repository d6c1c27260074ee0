/**
 * Property tests: random sequences of operations with advancing time,
 * checking the model's invariants after every step, and that a state
 * decoded from its own document behaves exactly like the original.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { referenceEncodeHead } from "../../testing/reference-head-encoder.ts";
import { isCasqError } from "../errors.ts";
import { applyOperation } from "./apply-operation.ts";
import type { ClaimedMessage, Operation, OperationResult, Receipt } from "./operations.ts";
import type { QueueConfigPatch } from "./queue-config.ts";
import { ShardState } from "./shard-state.ts";
import { hasRunnable, nextHousekeepingAt, nextWakeAt } from "./shard-stats.ts";

const T0 = 1_700_000_000_000;
const SUBS = ["default", "alpha", "beta"] as const;

// ------------------------------------------------------------ generators

const newMessage = fc.record({
  priority: fc.integer({ min: -2, max: 2 }),
  delayMs: fc.option(fc.integer({ min: 0, max: 3000 }), { nil: undefined }),
  dedup: fc.option(fc.integer({ min: 0, max: 3 }), { nil: undefined }),
  maxAttempts: fc.option(fc.integer({ min: 1, max: 3 }), { nil: undefined }),
  size: fc.integer({ min: 0, max: 24 }),
});

/** Receipt choices, counted from the most recent delivery of the subscription backwards. */
const picks = fc.array(fc.nat({ max: 5 }), { minLength: 1, maxLength: 3 });
/** Mostly "default", often "alpha" (created at the start), sometimes "beta". */
const sub = fc.oneof(
  { weight: 6, arbitrary: fc.constant(0) },
  { weight: 3, arbitrary: fc.constant(1) },
  { weight: 1, arbitrary: fc.constant(2) },
);

const action = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.record({
      t: fc.constant("enqueue" as const),
      messages: fc.array(newMessage, { minLength: 1, maxLength: 3 }),
    }),
  },
  {
    weight: 6,
    arbitrary: fc.record({
      t: fc.constant("claim" as const),
      sub,
      max: fc.integer({ min: 1, max: 3 }),
      ttl: fc.option(fc.integer({ min: 500, max: 3000 }), { nil: undefined }),
    }),
  },
  { weight: 2, arbitrary: fc.record({ t: fc.constant("heartbeat" as const), sub, picks }) },
  { weight: 5, arbitrary: fc.record({ t: fc.constant("ack" as const), sub, picks }) },
  {
    weight: 3,
    arbitrary: fc.record({
      t: fc.constant("nack" as const),
      sub,
      picks,
      delayMs: fc.option(fc.integer({ min: 0, max: 2000 }), { nil: undefined }),
      deadLetter: fc.boolean(),
    }),
  },
  { weight: 3, arbitrary: fc.record({ t: fc.constant("expire" as const) }) },
  // jump exactly to the next wake-up (lease deadline / delay), then sweep: exercises the boundaries
  { weight: 2, arbitrary: fc.record({ t: fc.constant("jump" as const) }) },
  {
    weight: 2,
    arbitrary: fc.record({
      t: fc.constant("create" as const),
      sub,
      from: fc.constantFrom("latest" as const, "earliest" as const),
    }),
  },
  { weight: 1, arbitrary: fc.record({ t: fc.constant("delete" as const), sub }) },
  {
    weight: 1,
    arbitrary: fc.record({
      t: fc.constant("purge" as const),
      sub: fc.option(sub, { nil: undefined }),
      deadLetters: fc.boolean(),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      t: fc.constant("redrive" as const),
      sub,
      limit: fc.option(fc.integer({ min: 1, max: 2 }), { nil: undefined }),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      t: fc.constant("config" as const),
      patch: fc.constantFrom<QueueConfigPatch>(
        { retentionMs: 0 },
        { retentionMs: 2000 },
        { deadLetterLimit: 1 },
        { deadLetterLimit: 5 },
        { maxAttempts: 2 },
        { maxAttempts: 4 },
        { leaseTtlMs: 1000 },
        { dedupWindowMs: 0 },
        { dedupWindowMs: 4000 },
      ),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      t: fc.constant("bad" as const),
      which: fc.integer({ min: 0, max: 3 }),
    }),
  },
);

const step = fc.record({ advance: fc.integer({ min: 0, max: 2500 }), action });

// ------------------------------------------------------------ raw document analysis

// biome-ignore lint/suspicious/noExplicitAny: raw JSON
type Json = any;

type Status = "pending" | "in_flight" | "settled" | "dead";

interface Analysis {
  doc: Json;
  /** sub -> offset -> status, for retained messages. */
  status: Map<string, Map<number, Status>>;
  /** sub -> offsets of dead letters. */
  dead: Map<string, Set<number>>;
  /** sub -> offset -> runnable time, for pending messages. */
  runnableAt: Map<string, Map<number, number>>;
  /** sub -> offset -> raw delivery record. */
  deliveries: Map<string, Map<number, Json>>;
}

/** The oracle for receipts: is `r` the current delivery of its message in `sub` (per the raw document)? */
function isCurrent(a: Analysis, sub: string, r: Receipt): boolean {
  const status = a.status.get(sub)?.get(r.offset);
  const d = a.deliveries.get(sub)?.get(r.offset);
  return (
    (status === "pending" || status === "in_flight") &&
    d !== undefined &&
    d.attempts === r.attempt &&
    d.attempts > (d.attempts_at_redrive ?? 0)
  );
}

/** The offsets of an inclusive range of the v2 `acked` list. */
function range(from: number, to: number): number[] {
  return Array.from({ length: to - from + 1 }, (_, i) => from + i);
}

function analyse(state: ShardState): Analysis {
  const doc = JSON.parse(new TextDecoder().decode(state.encode()));
  const status = new Map<string, Map<number, Status>>();
  const dead = new Map<string, Set<number>>();
  const runnableAt = new Map<string, Map<number, number>>();
  const allDeliveries = new Map<string, Map<number, Json>>();
  for (const s of doc.subscriptions) {
    const acked = new Set<number>((s.acked as [number, number][]).flatMap(([a, b]) => range(a, b)));
    const deliveries = new Map<number, Json>(s.deliveries.map((d: Json) => [d.offset, d]));
    expect(deliveries.size).toBe(s.deliveries.length); // at most one delivery (lease) per message
    const deadSet = new Set<number>(s.dead_letters.map((d: Json) => d.message.offset));
    expect(deadSet.size).toBe(s.dead_letters.length);
    expect(s.dead_letters.length).toBeLessThanOrEqual(doc.config.dead_letter_limit);
    const st = new Map<number, Status>();
    const ra = new Map<number, number>();
    for (const m of doc.messages) {
      const settled = m.targets
        ? !m.targets.includes(s.name)
        : m.offset < s.acked_below || acked.has(m.offset);
      const d = deliveries.get(m.offset);
      if (settled) {
        expect(d, `delivery for settled offset ${m.offset} in ${s.name}`).toBeUndefined();
        st.set(m.offset, deadSet.has(m.offset) ? "dead" : "settled");
      } else {
        expect(deadSet.has(m.offset), `offset ${m.offset} both dead and unsettled in ${s.name}`).toBe(false);
        if (d?.lease) st.set(m.offset, "in_flight");
        else {
          st.set(m.offset, "pending");
          ra.set(m.offset, Math.max(m.run_at ?? m.enqueued_at, d?.available_at ?? 0));
        }
      }
    }
    for (const off of deliveries.keys()) expect(st.get(off)).toMatch(/pending|in_flight/);
    status.set(s.name, st);
    dead.set(s.name, deadSet);
    runnableAt.set(s.name, ra);
    allDeliveries.set(s.name, deliveries);
  }
  return { doc, status, dead, runnableAt, deliveries: allDeliveries };
}

/** The analysis with `offset` settled in `sub` (what an ack of it does), without re-encoding. */
function analyseAfterAck(a: Analysis, sub: string, offset: number): Analysis {
  const status = new Map(a.status);
  status.set(sub, new Map(a.status.get(sub)).set(offset, "settled"));
  const deliveries = new Map(a.deliveries);
  const own = new Map(a.deliveries.get(sub));
  own.delete(offset);
  deliveries.set(sub, own);
  return { ...a, status, deliveries };
}

function flattenCounters(doc: Json): Map<string, number> {
  const out = new Map<string, number>();
  for (const [k, v] of Object.entries(doc.counters)) out.set(`shard.${k}`, v as number);
  for (const s of doc.subscriptions) {
    for (const [k, v] of Object.entries(s.counters)) out.set(`${s.name}@${s.created_at}.${k}`, v as number);
  }
  return out;
}

// ------------------------------------------------------------ the run

type Step = { advance: number; action: typeof action extends fc.Arbitrary<infer A> ? A : never };

function toOperation(
  a: Step["action"],
  history: { sub: string; receipt: Receipt }[],
  ctx: { nextId: number },
): Operation {
  const pick = (subName: string, idx: number[]): Receipt[] => {
    const own = history.filter((h) => h.sub === subName).slice(-8);
    if (own.length === 0) return [{ offset: idx[0] ?? 0, attempt: 1 }];
    return idx.map((i) => (own[own.length - 1 - (i % own.length)] as { receipt: Receipt }).receipt);
  };
  switch (a.t) {
    case "enqueue":
      return {
        kind: "enqueue",
        messages: a.messages.map((m) => ({
          id: `m${ctx.nextId++}`,
          payload: new Uint8Array(m.size).fill(m.size),
          priority: m.priority,
          delayMs: m.delayMs,
          dedupId: m.dedup === undefined ? undefined : `d${m.dedup}`,
          maxAttempts: m.maxAttempts,
          headers: m.size % 3 === 0 ? { n: String(m.size) } : undefined,
        })),
      };
    case "claim":
      return {
        kind: "claim",
        subscription: SUBS[a.sub] as string,
        workerId: "w",
        max: a.max,
        leaseTtlMs: a.ttl,
      };
    case "heartbeat":
      return {
        kind: "heartbeat",
        subscription: SUBS[a.sub] as string,
        workerId: "w",
        receipts: pick(SUBS[a.sub] as string, a.picks),
      };
    case "ack":
      return {
        kind: "ack",
        subscription: SUBS[a.sub] as string,
        receipts: pick(SUBS[a.sub] as string, a.picks),
      };
    case "nack":
      return {
        kind: "nack",
        subscription: SUBS[a.sub] as string,
        receipts: pick(SUBS[a.sub] as string, a.picks),
        delayMs: a.delayMs,
        deadLetter: a.deadLetter,
      };
    case "expire":
    case "jump":
      return { kind: "expire" };
    case "create":
      return { kind: "createSubscription", name: SUBS[a.sub] as string, from: a.from };
    case "delete":
      return { kind: "deleteSubscription", name: SUBS[a.sub] as string };
    case "purge":
      return {
        kind: "purge",
        subscription: a.sub === undefined ? undefined : SUBS[a.sub],
        deadLetters: a.deadLetters,
      };
    case "redrive":
      return { kind: "redrive", subscription: SUBS[a.sub] as string, limit: a.limit };
    case "config":
      return { kind: "updateConfig", patch: a.patch };
    case "bad":
      return (
        [
          {
            kind: "enqueue",
            messages: [
              { id: `m${ctx.nextId++}`, payload: new Uint8Array(1) },
              { id: "x", payload: new Uint8Array(1), priority: 9999 },
            ],
          },
          { kind: "claim", subscription: "ghost", workerId: "w", max: 1 },
          { kind: "ack", subscription: "default", receipts: [{ offset: -1, attempt: 1 }] },
          { kind: "updateConfig", patch: { maxBatch: 0 } },
        ] satisfies Operation[]
      )[a.which] as Operation;
  }
}

type Outcome = { ok: true; result: OperationResult } | { ok: false; code: string };

function attempt(state: ShardState, op: Operation, now: number): Outcome {
  try {
    return { ok: true, result: applyOperation(state, op, now) };
  } catch (error) {
    if (!isCasqError(error)) throw error;
    return { ok: false, code: error.code };
  }
}

function before(a: { priority: number; offset: number }, b: { priority: number; offset: number }): boolean {
  return a.priority !== b.priority ? a.priority > b.priority : a.offset < b.offset;
}

/** Initial config variations: with and without retention and dedup. */
const initial = fc.record({
  retentionMs: fc.constantFrom(0, 0, 1500, 4000),
  dedupWindowMs: fc.constantFrom(0, 5000),
});

function run(
  steps: Step[],
  init: { retentionMs: number; dedupWindowMs: number } = { retentionMs: 0, dedupWindowMs: 5000 },
): void {
  const state = ShardState.create({
    queue: "prop",
    shard: 1,
    now: T0,
    config: {
      leaseTtlMs: 2000,
      maxAttempts: 3,
      backoff: { initialMs: 100, multiplier: 2, maxMs: 2000, jitter: 0.5 },
      dedupWindowMs: init.dedupWindowMs,
      retentionMs: init.retentionMs,
      deadLetterLimit: 3,
    },
  });
  applyOperation(state, { kind: "createSubscription", name: "alpha" }, T0);
  let now = T0;
  const ctx = { nextId: 0 };
  const history: { sub: string; receipt: Receipt }[] = [];
  const ackedBy = new Map<string, Set<number>>(); // shadow: acked (final) per subscription
  let lastOffset = -1;
  let prev = analyse(state);
  let prevCounters = flattenCounters(prev.doc);

  const dedupShadow = new Map<string, { id: string; offset: number; expiresAt: number }>();
  for (const s of steps) {
    now += s.advance;
    if (s.action.t === "jump") {
      const due = [nextWakeAt(state, now), nextHousekeepingAt(state)].filter((t) => t !== undefined);
      now = Math.max(now, Math.min(now + 10_000, ...due));
    }
    const op = toOperation(s.action, history, ctx);
    const bytesBefore = new TextDecoder().decode(state.encode());
    const twin = ShardState.decode(state.encode());
    const outcome = attempt(state, op, now);
    const twinOutcome = attempt(twin, op, now);

    // A state rebuilt from its document behaves exactly like the original.
    expect(twinOutcome).toEqual(outcome);
    const bytesAfter = new TextDecoder().decode(state.encode());
    expect(new TextDecoder().decode(twin.encode())).toBe(bytesAfter);
    // The encoder copies from its last encode: still what a from-scratch encode writes.
    expect(new TextDecoder().decode(referenceEncodeHead(state))).toBe(bytesAfter);

    if (!outcome.ok) {
      expect(bytesAfter, "a rejected operation must leave the state unchanged").toBe(bytesBefore);
      continue;
    }
    const result = outcome.result;
    if (!result.changed) expect(bytesAfter, `${result.kind} said changed: false`).toBe(bytesBefore);

    // Round trip: decode(encode(s)) encodes to the same bytes; same size estimate.
    const decoded = ShardState.decode(state.encode());
    expect(new TextDecoder().decode(decoded.encode())).toBe(bytesAfter);
    expect(decoded.approxBytes()).toBe(state.approxBytes());
    const encodedLength = state.encode().byteLength;
    expect(state.approxBytes()).toBeGreaterThanOrEqual(encodedLength / 3);
    expect(state.approxBytes()).toBeLessThanOrEqual(encodedLength * 3);

    const after = analyse(state);

    switch (result.kind) {
      case "enqueue": {
        const window = state.config.dedupWindowMs;
        for (const [i, r] of result.results.entries()) {
          const input = (op as Extract<Operation, { kind: "enqueue" }>).messages[i];
          const known = input?.dedupId === undefined ? undefined : dedupShadow.get(input.dedupId);
          const expectDuplicate = window > 0 && known !== undefined && known.expiresAt > now;
          expect(r.duplicate, `dedup of ${input?.dedupId}`).toBe(expectDuplicate);
          if (r.duplicate) {
            expect({ id: r.id, offset: r.offset }).toEqual({ id: known?.id, offset: known?.offset });
          } else {
            expect(r.offset, "offsets strictly increase").toBe(lastOffset + 1);
            lastOffset = r.offset;
            if (input?.dedupId !== undefined && window > 0) {
              dedupShadow.set(input.dedupId, { id: r.id, offset: r.offset, expiresAt: now + window });
            }
          }
        }
        expect(state.nextOffset).toBe(lastOffset + 1);
        break;
      }
      case "nack": {
        const nackOp = op as Extract<Operation, { kind: "nack" }>;
        const backoff = state.config.backoff;
        const receipts = new Set<string>();
        for (const r of result.results) {
          const key = `${r.receipt.offset}/${r.receipt.attempt}`;
          if (!receipts.has(key) && isCurrent(prev, nackOp.subscription, r.receipt)) {
            const d = prev.deliveries.get(nackOp.subscription)?.get(r.receipt.offset);
            const m = prev.doc.messages.find((x: Json) => x.offset === r.receipt.offset);
            const exhausted =
              d.attempts - (d.attempts_at_redrive ?? 0) >= (m.max_attempts ?? prev.doc.config.max_attempts);
            const leased = d.lease !== undefined;
            const expected =
              nackOp.deadLetter === true || (leased && exhausted) ? "dead_lettered" : "retry_scheduled";
            expect(r.outcome).toBe(expected);
          }
          if (!receipts.has(key) && r.outcome !== "lease_lost") {
            const current = isCurrent(prev, nackOp.subscription, r.receipt);
            const deadBefore = prev.doc.subscriptions
              .find((x: Json) => x.name === nackOp.subscription)
              ?.dead_letters.some(
                (d: Json) => d.message.offset === r.receipt.offset && d.attempts === r.receipt.attempt,
              );
            expect(current || (r.outcome === "dead_lettered" && deadBefore)).toBe(true);
          }
          if (!receipts.has(key) && r.outcome === "lease_lost") {
            expect(isCurrent(prev, nackOp.subscription, r.receipt)).toBe(false);
          }
          receipts.add(key);
          if (r.outcome !== "retry_scheduled") continue;
          const at = r.availableAt as number;
          expect(at).toBeGreaterThanOrEqual(now);
          const wasLeased = prev.status.get(nackOp.subscription)?.get(r.receipt.offset) === "in_flight";
          if (wasLeased && nackOp.delayMs !== undefined) expect(at).toBe(now + nackOp.delayMs);
          if (wasLeased && nackOp.delayMs === undefined) {
            expect(at).toBeGreaterThanOrEqual(now + Math.floor(backoff.initialMs * (1 - backoff.jitter)));
            expect(at).toBeLessThanOrEqual(now + backoff.maxMs);
          }
          const pendingAt = after.runnableAt.get(nackOp.subscription)?.get(r.receipt.offset);
          expect(pendingAt === undefined ? at : Math.max(now, pendingAt)).toBe(at);
        }
        break;
      }
      case "claim": {
        const claimOp = op as Extract<Operation, { kind: "claim" }>;
        const subName = claimOp.subscription;
        const offsets = result.messages.map((m: ClaimedMessage) => m.offset);
        expect(new Set(offsets).size).toBe(offsets.length);
        for (const m of result.messages) {
          expect(prev.status.get(subName)?.get(m.offset), "claimed message was pending").toBe("pending");
          expect(prev.runnableAt.get(subName)?.get(m.offset) as number).toBeLessThanOrEqual(now);
          expect(ackedBy.get(subName)?.has(m.offset) ?? false, "acked message delivered again").toBe(false);
          expect(after.status.get(subName)?.get(m.offset)).toBe("in_flight");
          expect(m.leaseDeadline).toBe(now + (claimOp.leaseTtlMs ?? state.config.leaseTtlMs));
          history.push({ sub: subName, receipt: m.receipt });
        }
        for (let i = 1; i < result.messages.length; i++) {
          expect(before(result.messages[i - 1] as ClaimedMessage, result.messages[i] as ClaimedMessage)).toBe(
            true,
          );
        }
        // Nothing runnable was skipped: the rest comes after the last claimed one.
        const last = result.messages.at(-1);
        for (const [off, at] of after.runnableAt.get(subName) ?? []) {
          if (at > now) continue;
          expect(result.messages.length, "claim returned less than max while runnable remain").toBe(
            Math.min(claimOp.max, state.config.maxBatch),
          );
          const m = after.doc.messages.find((x: Json) => x.offset === off);
          if (last !== undefined) expect(before(last, { priority: m.priority ?? 0, offset: off })).toBe(true);
        }
        expect(hasRunnable(state, subName, now)).toBe(
          [...(after.runnableAt.get(subName) ?? [])].some(([, at]) => at <= now),
        );
        break;
      }
      case "heartbeat": {
        const subName = (op as Extract<Operation, { kind: "heartbeat" }>).subscription;
        const held = new Set<string>();
        for (const e of result.extended) {
          const key = `${e.receipt.offset}/${e.receipt.attempt}`;
          const lease = (held.has(key) ? after : prev).deliveries.get(subName)?.get(e.receipt.offset)?.lease;
          expect(isCurrent(prev, subName, e.receipt)).toBe(true);
          expect(lease).toBeDefined();
          // the persistence rule: extend to now + ttl only when less than half the TTL remains
          const expected = lease.deadline - now < lease.ttl_ms / 2 ? now + lease.ttl_ms : lease.deadline;
          expect(e.deadline).toBe(expected);
          expect(after.deliveries.get(subName)?.get(e.receipt.offset)?.lease.deadline).toBe(e.deadline);
          held.add(key);
        }
        for (const r of result.lost) {
          expect(isCurrent(prev, subName, r) && prev.status.get(subName)?.get(r.offset) === "in_flight").toBe(
            false,
          );
        }
        break;
      }
      case "ack": {
        const subName = (op as Extract<Operation, { kind: "ack" }>).subscription;
        let cur = prev;
        for (const r of result.results) {
          // replay each receipt against the state as the previous receipts left it
          const current = isCurrent(cur, subName, r.receipt);
          const retainedStatus = cur.status.get(subName)?.get(r.receipt.offset);
          const alreadyAcked =
            !current &&
            r.receipt.offset < cur.doc.next_offset &&
            (retainedStatus === undefined || retainedStatus === "settled") &&
            !(cur.dead.get(subName)?.has(r.receipt.offset) ?? false);
          expect(r.outcome).toBe(current ? "acked" : alreadyAcked ? "already_acked" : "lease_lost");
          if (current) cur = analyseAfterAck(cur, subName, r.receipt.offset);
          if (r.outcome === "acked") {
            expect(prev.status.get(subName)?.get(r.receipt.offset)).toMatch(/pending|in_flight/);
            const set = ackedBy.get(subName) ?? new Set<number>();
            ackedBy.set(subName, set);
            set.add(r.receipt.offset);
          }
        }
        break;
      }
      case "expire":
        for (const sd of after.doc.subscriptions) {
          for (const d of sd.deliveries) if (d.lease) expect(d.lease.deadline).toBeGreaterThan(now);
        }
        for (const e of after.doc.dedup) expect(e.expires_at).toBeGreaterThan(now);
        for (const m of after.doc.messages) {
          const owed = [...after.status.values()].some((st) =>
            /pending|in_flight/.test(st.get(m.offset) ?? ""),
          );
          if (!owed) expect(m.enqueued_at + after.doc.config.retention_ms).toBeGreaterThan(now);
        }
        break;
      case "deleteSubscription":
        ackedBy.delete(result.name);
        expect(after.status.has(result.name)).toBe(false);
        break;
      case "createSubscription": {
        const untargeted = prev.doc.messages.filter((m: Json) => m.targets === undefined).length;
        expect(result.backlog).toBe(result.from === "earliest" ? untargeted : 0);
        const st = [...(after.status.get(result.name)?.values() ?? [])];
        expect(st.filter((x) => x === "pending").length).toBe(result.backlog);
        break;
      }
      case "purge": {
        const purgeOp = op as Extract<Operation, { kind: "purge" }>;
        const names = purgeOp.subscription === undefined ? [...prev.status.keys()] : [purgeOp.subscription];
        if (purgeOp.deadLetters === true) {
          for (const n of names) expect(after.dead.get(n)?.size).toBe(0);
          expect(result.deadLettersPurged).toBe(names.reduce((t, n) => t + (prev.dead.get(n)?.size ?? 0), 0));
        } else if (purgeOp.subscription !== undefined) {
          const owed = [...(prev.status.get(purgeOp.subscription)?.values() ?? [])].filter(
            (x) => x !== "settled" && x !== "dead",
          );
          expect(result.messagesPurged).toBe(owed.length);
          for (const x of after.status.get(purgeOp.subscription)?.values() ?? [])
            expect(x).toMatch(/settled|dead/);
        } else {
          expect(result.messagesPurged).toBe(prev.doc.messages.length);
          expect(after.doc.messages).toEqual([]);
        }
        break;
      }
      case "redrive": {
        const subName = result.subscription;
        const wasDead = prev.doc.subscriptions.find((x: Json) => x.name === subName).dead_letters;
        expect(result.ids).toEqual(wasDead.slice(0, result.redriven).map((d: Json) => d.message.id));
        for (const d of wasDead.slice(0, result.redriven)) {
          expect(after.dead.get(subName)?.has(d.message.offset)).toBe(false);
          expect(after.status.get(subName)?.get(d.message.offset)).toBe("pending");
          const del = after.deliveries.get(subName)?.get(d.message.offset);
          expect(del.attempts).toBe(d.attempts);
          expect(del.attempts_at_redrive ?? 0).toBe(d.attempts);
        }
        break;
      }
      default:
        break;
    }

    // Acked is final: never pending, in flight or dead again in that subscription.
    for (const [subName, set] of ackedBy) {
      const st = after.status.get(subName);
      const dead = after.dead.get(subName);
      for (const off of set) {
        expect(st?.get(off) ?? "settled").toBe("settled");
        expect(dead?.has(off) ?? false).toBe(false);
      }
    }

    // Offsets of retained messages are below next_offset and ascending.
    const offs = after.doc.messages.map((m: Json) => m.offset);
    for (let i = 1; i < offs.length; i++) expect(offs[i]).toBeGreaterThan(offs[i - 1]);
    if (offs.length > 0) expect(offs.at(-1)).toBeLessThan(after.doc.next_offset);

    // Counters never go down (per subscription incarnation).
    const counters = flattenCounters(after.doc);
    for (const [k, v] of counters) {
      const was = prevCounters.get(k);
      if (was !== undefined) expect(v, k).toBeGreaterThanOrEqual(was);
    }
    prev = after;
    prevCounters = counters;
  }
}

describe("shard state (property)", () => {
  it("keeps its invariants over random operation sequences", () => {
    fc.assert(
      fc.property(fc.array(step, { minLength: 1, maxLength: 60, size: "max" }), initial, (steps, init) => {
        run(steps as Step[], init);
      }),
      { numRuns: 200 },
    );
  });

  it("keeps them in a long run with many messages", () => {
    fc.assert(
      fc.property(fc.array(step, { minLength: 150, maxLength: 250, size: "max" }), initial, (steps, init) => {
        run(steps as Step[], init);
      }),
      { numRuns: 12 },
    );
  });
});
