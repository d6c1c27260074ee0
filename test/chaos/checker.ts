/**
 * The chaos checker: reads every client's history and the queue's final
 * state, and lists what broke the contract.
 *
 * - `lost`: an acknowledged enqueue was never delivered nor dead-lettered.
 * - `vanished`: a message is gone (final depth 0) although no handler ever
 *   finished it and it is not a dead letter: it left the queue unacked.
 * - `duplicate-dedup`: two message ids for one dedup id (stored twice).
 * - `redelivery-after-ack`: a delivery started after a handler of the same
 *   message had returned (the SDK acks right after), while the lease of that
 *   acked delivery had not expired yet. A redelivery after the lease expired
 *   is allowed: the ack may not have landed (the broker died, the stream
 *   hung), and at-least-once delivery then delivers again.
 * - `two-live-leases`: a delivery started while an earlier delivery of the
 *   same message was neither settled nor past its lease deadline.
 * - `final-depth`: messages left in the queue after the drain.
 * - `unknown-message`: a delivery of a payload no producer sent.
 * - `payload-mismatch`: the SDK's dedup id of a delivery differs from the one
 *   its payload names.
 *
 * A delivery's lease is taken as [claim time, deadline granted with the
 * claim]: heartbeats only move the real deadline later, so "claimed before
 * the earlier delivery's deadline" is a sound test. The claim time is the
 * deadline less the TTL the worker asked for (when both are known) or else
 * when the handler started, which is no earlier than the claim. A
 * delivery whose SDK does not report its deadline is not used as the earlier
 * one of a pair (counted in `uncheckedLeases`). `toleranceMs` absorbs the few
 * milliseconds between processes reading the one machine clock.
 */
import type { AckSent, Deliver, HistoryRecord, NackSent } from "./history.ts";

/** What the broker says about the queue once the run has drained. */
export interface FinalState {
  /** Unsettled messages (ready + in flight + delayed) over every subscription. */
  readonly depth: number;
  /** Ids of the dead letters. */
  readonly deadLetterIds: readonly string[];
}

/** One broken rule. */
export interface Violation {
  readonly kind:
    | "lost"
    | "vanished"
    | "duplicate-dedup"
    | "redelivery-after-ack"
    | "two-live-leases"
    | "final-depth"
    | "unknown-message"
    | "payload-mismatch"
    /** Not found by the checker: a client or broker process exited without being told to (added by the run). */
    | "process-crash";
  /** Message id or dedup id it concerns, when there is one. */
  readonly subject?: string;
  /** What was seen, in words and numbers. */
  readonly detail: string;
}

/** Counts over the histories. */
export interface CheckCounts {
  /** Distinct dedup ids a producer was told are durable. */
  enqueued: number;
  /** Enqueue attempts that failed (and were retried). */
  enqueueFailures: number;
  /** Acknowledged enqueues that came back as duplicates of an earlier attempt. */
  duplicateAcks: number;
  /** Deliveries (handler starts). */
  delivered: number;
  /** Distinct messages delivered. */
  messagesDelivered: number;
  /** Deliveries after the first of a message. */
  redelivered: number;
  /** Handlers that returned (acks sent). */
  acked: number;
  /** Handlers that threw after a lost lease (nacks sent). */
  nacked: number;
  /** Redeliveries after an ack was sent, once that delivery's lease had expired (allowed). */
  redeliveredAfterAckExpired: number;
  /** Leases the SDKs reported lost. */
  leasesLost: number;
  /** Failures the SDKs reported to the error callback. */
  clientErrors: number;
  /** Handlers that started after the lease of their delivery had run out (the job waited, or a frozen broker sent it late). */
  lateStarts: number;
  /** Deliveries without a lease deadline (their SDK does not report one). */
  uncheckedLeases: number;
  /** Dead letters at the end. */
  deadLetters: number;
}

/** The checker's verdict. */
export interface CheckResult {
  readonly counts: CheckCounts;
  readonly violations: Violation[];
}

/** Options of {@link checkHistories}. */
export interface CheckOptions {
  /** Clock tolerance in ms (default 250). */
  readonly toleranceMs?: number;
  /** Most violations listed per kind (the rest are counted in one line). Default 20. */
  readonly maxPerKind?: number;
}

/** Checks the merged histories of every client against the final state. */
export function checkHistories(
  records: readonly HistoryRecord[],
  final: FinalState,
  options: CheckOptions = {},
): CheckResult {
  const tolerance = options.toleranceMs ?? 250;
  const found: Violation[] = [];
  const counts: CheckCounts = {
    enqueued: 0,
    enqueueFailures: 0,
    duplicateAcks: 0,
    delivered: 0,
    messagesDelivered: 0,
    redelivered: 0,
    acked: 0,
    nacked: 0,
    redeliveredAfterAckExpired: 0,
    leasesLost: 0,
    clientErrors: 0,
    uncheckedLeases: 0,
    lateStarts: 0,
    deadLetters: final.deadLetterIds.length,
  };

  const idsByDedup = new Map<string, Set<string>>();
  const addId = (dedup: string, id: string) => {
    const ids = idsByDedup.get(dedup) ?? new Set<string>();
    ids.add(id);
    idsByDedup.set(dedup, ids);
  };
  const acknowledged = new Map<string, string>(); // message id -> dedup id
  const attempted = new Set<string>(); // dedup ids any producer tried
  const deliveries = new Map<string, Deliver[]>(); // message id -> deliveries
  const acks = new Map<string, AckSent>(); // receipt -> ack
  const nacks = new Map<string, NackSent>(); // receipt -> nack
  const ackedIds = new Set<string>();

  for (const r of records) {
    switch (r.kind) {
      case "enqueue-ok":
        attempted.add(r.dedup);
        if (r.duplicate) counts.duplicateAcks++;
        acknowledged.set(r.id, r.dedup);
        addId(r.dedup, r.id);
        break;
      case "enqueue-fail":
        attempted.add(r.dedup);
        counts.enqueueFailures++;
        break;
      case "deliver": {
        counts.delivered++;
        if (r.leaseDeadline === null) counts.uncheckedLeases++;
        else if (r.t > r.leaseDeadline + tolerance) counts.lateStarts++;
        addId(r.dedup, r.id);
        const list = deliveries.get(r.id) ?? [];
        list.push(r);
        deliveries.set(r.id, list);
        if (r.jobDedup !== null && r.jobDedup !== r.dedup)
          found.push({
            kind: "payload-mismatch",
            subject: r.id,
            detail: `delivery ${r.receipt} to ${r.proc}: the job's dedup id is ${JSON.stringify(r.jobDedup)}, its payload names ${JSON.stringify(r.dedup)}`,
          });
        break;
      }
      case "ack-sent":
        counts.acked++;
        acks.set(r.receipt, r);
        ackedIds.add(r.id);
        break;
      case "nack-sent":
        counts.nacked++;
        nacks.set(r.receipt, r);
        break;
      case "lease-lost":
        counts.leasesLost++;
        break;
      case "error":
        counts.clientErrors++;
        break;
      default:
        break;
    }
  }
  counts.enqueued = new Set(acknowledged.values()).size;
  counts.messagesDelivered = deliveries.size;

  for (const [dedup, ids] of idsByDedup)
    if (ids.size > 1)
      found.push({
        kind: "duplicate-dedup",
        subject: dedup,
        detail: `dedup id ${dedup} is stored as ${ids.size} messages: ${[...ids].sort().join(", ")}`,
      });

  const dead = new Set(final.deadLetterIds);
  for (const [id, dedup] of acknowledged) {
    if (!deliveries.has(id) && !dead.has(id))
      found.push({
        kind: "lost",
        subject: id,
        detail: `enqueue of ${dedup} was acknowledged as ${id}, which was never delivered nor dead-lettered`,
      });
    else if (final.depth === 0 && deliveries.has(id) && !ackedIds.has(id) && !dead.has(id))
      found.push({
        kind: "vanished",
        subject: id,
        detail: `${id} (${dedup}) left the queue though no handler finished it and it is not a dead letter (${deliveries.get(id)?.length} deliveries)`,
      });
  }

  for (const [id, list] of deliveries) {
    const first = list[0] as Deliver;
    if (!attempted.has(first.dedup))
      found.push({
        kind: "unknown-message",
        subject: id,
        detail: `${first.proc} got ${id} naming dedup id ${JSON.stringify(first.dedup)}, which no producer sent`,
      });
    if (list.length < 2) continue;
    list.sort((a, b) => claimedAt(a) - claimedAt(b));
    counts.redelivered += list.length - 1;
    for (let later = 1; later < list.length; later++) {
      const d2 = list[later] as Deliver;
      const c2 = claimedAt(d2);
      for (let earlier = 0; earlier < later; earlier++) {
        const d1 = list[earlier] as Deliver;
        if (d1.receipt === d2.receipt) continue;
        const ack = acks.get(d1.receipt);
        const nack = nacks.get(d1.receipt);
        if (nack && nack.t <= c2 + tolerance) continue; // given back first: claimable at once
        if (d1.leaseDeadline === null) continue;
        const live = c2 < d1.leaseDeadline - tolerance;
        if (ack && ack.t <= c2) {
          if (live)
            found.push({
              kind: "redelivery-after-ack",
              subject: id,
              detail: `${d2.proc} got ${id} (attempt ${d2.attempt}, ${d2.receipt}) claimed at ${iso(c2)}, ${c2 - ack.t} ms after ${d1.proc} acked attempt ${d1.attempt} (${d1.receipt}) whose lease ran to ${iso(d1.leaseDeadline)}`,
            });
          else if (earlier === later - 1) counts.redeliveredAfterAckExpired++;
        } else if (live) {
          found.push({
            kind: "two-live-leases",
            subject: id,
            detail: `${d2.proc} got ${id} (attempt ${d2.attempt}, ${d2.receipt}) claimed at ${iso(c2)} while ${d1.proc} held attempt ${d1.attempt} (${d1.receipt}, claimed at ${iso(claimedAt(d1))}, lease to ${iso(d1.leaseDeadline)}, ${ack ? `acked at ${iso(ack.t)}` : "not settled"})`,
          });
        }
      }
    }
  }

  if (final.depth !== 0)
    found.push({
      kind: "final-depth",
      detail: `${final.depth} messages are still in the queue after the drain`,
    });

  return { counts, violations: capPerKind(found, options.maxPerKind ?? 20) };
}

/**
 * When a delivery was claimed: its lease deadline less the TTL the worker
 * asked for (the broker grants exactly that at the claim), or, when either
 * is unknown, when its handler started (no earlier than the claim).
 */
function claimedAt(d: Deliver): number {
  return d.leaseDeadline !== null && d.leaseTtlMs !== undefined ? d.leaseDeadline - d.leaseTtlMs : d.t;
}

function iso(ms: number): string {
  return new Date(ms).toISOString();
}

/** Keeps the first `max` violations of each kind and says how many more there were. */
function capPerKind(violations: Violation[], max: number): Violation[] {
  const seen = new Map<string, number>();
  const out: Violation[] = [];
  for (const v of violations) {
    const n = (seen.get(v.kind) ?? 0) + 1;
    seen.set(v.kind, n);
    if (n <= max) out.push(v);
  }
  for (const [kind, n] of seen)
    if (n > max)
      out.push({ kind: kind as Violation["kind"], detail: `... and ${n - max} more ${kind} violations` });
  return out;
}
