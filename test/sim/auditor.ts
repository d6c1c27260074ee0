/**
 * The auditor: records every result a client was ACKNOWLEDGED (and every
 * ack/nack a worker sent), watches every committed version through
 * {@link CommittedHistory}, and judges the run.
 *
 * When a result is acknowledged, it must already be true in the latest
 * committed version of its shard (answers come only after the write landed);
 * the history's transition checks then guarantee it stays true in every
 * later version. Concretely:
 *
 * 1. An acknowledged enqueue names a message id that is committed at exactly
 *    that shard and offset (with the producer's dedup id; a duplicate names
 *    the original that carries the same dedup id; and the history checks
 *    that no committed version ever stores a second message with a dedup id
 *    within the window of the first on that shard, wherever the id was
 *    remembered — head, dedup segment, a new leader's load). At the end, after the
 *    drain, every acknowledged message is settled in every subscription —
 *    acked, or a dead letter whose attempt count equals the deliveries the
 *    history saw — and was delivered to every subscription at least once.
 * 2. An acknowledged `acked`/`already_acked` is settled (not dead) in the
 *    latest version; an acknowledged `retry_scheduled` no longer holds that
 *    lease; an acknowledged `dead_lettered` is a dead letter with that
 *    attempt. Nothing acknowledged is lost later (history: settled is final,
 *    nothing vanishes).
 * 3. At most one worker holds a message per subscription: the deliveries a
 *    worker was told about (claim deadline, extended by acknowledged
 *    heartbeats, cut short when the worker sent an ack or nack) never overlap
 *    in time, and their attempts grow (a receipt is never handed out twice).
 * 4. Offsets, epochs and ids: see {@link CommittedHistory}.
 * 5. Once an ack was confirmed to a worker, that message is never delivered
 *    to that subscription again.
 *
 * A violation does not stop the run; all of them are collected and printed
 * with the seed and the command that replays it.
 */

import { CasqError as SdkCasqError, Code as SdkCode } from "../../sdk/ts/src/errors.ts";
import type { Delivery, EnqueueInput, EnqueueOutcome } from "../../server/src/broker/broker.ts";
import { isCasqError } from "../../server/src/errors.ts";
import type {
  AckItemResult,
  ClaimedMessage,
  NackItemResult,
  Receipt,
} from "../../server/src/model/operations.ts";
import { CommittedHistory, type SentRequests } from "./committed-history.ts";
import { statusOf } from "./shard-view.ts";
import type { Trace } from "./trace.ts";

/** One broken invariant. */
export interface Violation {
  readonly atMs: number;
  readonly invariant: string;
  readonly detail: string;
}

/** What the auditor reads of a delivery a worker was handed (a broker's {@link Delivery}, or one read off the wire). */
export interface ReportedDelivery {
  readonly shard: number;
  readonly message: Pick<ClaimedMessage, "id" | "receipt" | "leaseDeadline">;
}

/** A delivery as a worker was told about it. */
interface DeliveryRecord {
  readonly worker: string;
  readonly attempt: number;
  readonly claimedAt: number;
  /** Latest lease deadline the worker was told (claim, then heartbeats). */
  deadline: number;
  /** When the worker first sent an ack or nack for it (the lease may end there). */
  releaseSentAt: number | undefined;
}

interface ConfirmedAck {
  readonly attempt: number;
  readonly outcome: "acked" | "already_acked";
  readonly atMs: number;
}

/** Counters printed per run. */
export interface AuditStats {
  readonly sent: Readonly<Record<string, number>>;
  readonly ok: Readonly<Record<string, number>>;
  readonly failed: Readonly<Record<string, number>>;
  readonly outcomes: Readonly<Record<string, number>>;
  readonly acknowledgedMessages: number;
  readonly deliveries: number;
  /** Acknowledged deliveries with attempt > 1. */
  readonly redeliveries: number;
  readonly finallyAcked: number;
  readonly finallyDead: number;
}

/** Records acknowledged results and checks the invariants (see module header). */
export class Auditor implements SentRequests {
  readonly history: CommittedHistory;
  private readonly found: Violation[] = [];
  private readonly acksSent = new Set<string>();
  /** When a nack for each delivery was first sent. */
  private readonly nacksSent = new Map<string, number>();
  private readonly enqueued = new Map<string, { shard: number; offset: number }>();
  private readonly deliveries = new Map<string, DeliveryRecord[]>();
  private readonly confirmedAcks = new Map<string, ConfirmedAck>();
  private readonly counters = {
    sent: {} as Record<string, number>,
    ok: {} as Record<string, number>,
    failed: {} as Record<string, number>,
    outcomes: {} as Record<string, number>,
  };
  private deliveryCount = 0;
  private redeliveryCount = 0;
  private finallyAcked = 0;
  private finallyDead = 0;

  constructor(
    private readonly now: () => number,
    private readonly trace: Trace,
    private readonly subscriptions: readonly string[],
    private readonly leaseTtlMs: number,
  ) {
    this.history = new CommittedHistory(
      this,
      (invariant, detail) => this.violation(invariant, detail),
      (view) =>
        this.trace.add(`commit ${view.key} v${view.version} epoch=${view.broker?.epoch} by=${view.writeId}`),
    );
  }

  /** Every violation found so far. */
  get violations(): readonly Violation[] {
    return this.found;
  }

  /** Records a broken invariant. */
  violation(invariant: string, detail: string): void {
    this.found.push({ atMs: this.now(), invariant, detail });
    this.trace.add(`VIOLATION ${invariant}: ${detail}`);
  }

  // ------------------------------------------------------------ what was sent

  /** A request left a client (for the op counters). */
  requestSent(kind: string): void {
    bump(this.counters.sent, kind);
  }

  /**
   * A request failed after the client's retries (the direct client's or the
   * SDK's): its outcome is unknown to the client.
   */
  requestFailed(kind: string, error: unknown): void {
    // The SDK's errors carry a gRPC code; they are named like the engine's (`unavailable`, ...).
    const code = isCasqError(error)
      ? error.code
      : error instanceof SdkCasqError
        ? snakeCase(SdkCode[error.code])
        : "non-casq";
    bump(this.counters.failed, `${kind}:${code}`);
    const message = isCasqError(error) || error instanceof SdkCasqError ? error.message : "";
    this.trace.add(`fail ${kind} ${code} ${message}`);
    if (code === "internal" || code === "data_loss" || code === "non-casq")
      this.violation("no-internal-errors", `${kind} failed with ${code}: ${String(error)}`);
  }

  /** Records that a worker sent an ack for a delivery (before it reaches any broker). */
  markAckSent(shard: number, subscription: string, receipt: Receipt): void {
    this.acksSent.add(receiptKey(shard, subscription, receipt.offset, receipt.attempt));
    this.releaseSent(shard, subscription, receipt.offset, receipt.attempt);
  }

  /** Records that a worker sent a nack for a delivery (before it reaches any broker). */
  markNackSent(shard: number, subscription: string, receipt: Receipt): void {
    const key = receiptKey(shard, subscription, receipt.offset, receipt.attempt);
    if (!this.nacksSent.has(key)) this.nacksSent.set(key, this.now());
    this.releaseSent(shard, subscription, receipt.offset, receipt.attempt);
  }

  /** {@link SentRequests}: an ack for this delivery was sent. */
  ackSent(shard: number, subscription: string, offset: number, attempt: number): boolean {
    return this.acksSent.has(receiptKey(shard, subscription, offset, attempt));
  }

  /** {@link SentRequests}: a nack for this delivery was sent. */
  nackSent(shard: number, subscription: string, offset: number, attempt: number): boolean {
    return this.nacksSent.has(receiptKey(shard, subscription, offset, attempt));
  }

  /** {@link SentRequests}: when a nack for this delivery was first sent. */
  nackSentAt(shard: number, subscription: string, offset: number, attempt: number): number | undefined {
    return this.nacksSent.get(receiptKey(shard, subscription, offset, attempt));
  }

  private releaseSent(shard: number, subscription: string, offset: number, attempt: number): void {
    for (const d of this.deliveries.get(messageKey(shard, subscription, offset)) ?? []) {
      if (d.attempt === attempt && d.releaseSentAt === undefined) d.releaseSentAt = this.now();
    }
  }

  // ---------------------------------------------------- acknowledged results

  /** An enqueue call returned: every outcome is durable. */
  enqueueAcknowledged(inputs: readonly EnqueueInput[], outcomes: readonly EnqueueOutcome[]): void {
    bump(this.counters.ok, "enqueue");
    outcomes.forEach((outcome, i) => {
      const input = inputs[i];
      bump(this.counters.outcomes, outcome.duplicate ? "enqueue:duplicate" : "enqueue:new");
      this.trace.add(
        `enqueued ${outcome.id} s${outcome.shard}@${outcome.offset}${outcome.duplicate ? " dup" : ""}`,
      );
      const what = `enqueue of ${outcome.id} (shard ${outcome.shard} offset ${outcome.offset})`;
      const location = this.history.locate(outcome.id);
      if (location === undefined || location.shard !== outcome.shard || location.offset !== outcome.offset) {
        this.violation(
          "durable-enqueue",
          `${what} was acknowledged but no committed version holds it there (found: ${JSON.stringify(location)})`,
        );
        return;
      }
      if (location.dedupId !== input?.dedupId)
        this.violation(
          "dedup",
          `${what}${outcome.duplicate ? " (duplicate)" : ""}: stored dedup id ${location.dedupId}, producer sent ${input?.dedupId}`,
        );
      const latest = this.history.latest(outcome.shard);
      for (const sub of this.subscriptions) {
        if (latest === undefined || statusOf(latest, sub, outcome.offset) === "unknown")
          this.violation("durable-enqueue", `${what}: not in the latest committed version for ${sub}`);
      }
      this.enqueued.set(outcome.id, { shard: outcome.shard, offset: outcome.offset });
    });
  }

  /** A claim returned deliveries to a worker. */
  claimAcknowledged(worker: string, subscription: string, deliveries: readonly ReportedDelivery[]): void {
    bump(this.counters.ok, "claim");
    const now = this.now();
    for (const { shard, message } of deliveries) {
      const { offset, attempt } = message.receipt;
      this.deliveryCount += 1;
      if (attempt > 1) this.redeliveryCount += 1;
      this.trace.add(
        `claimed ${worker} ${subscription} s${shard}@${offset}#${attempt} ${message.id} until ${message.leaseDeadline}`,
      );
      const what = `${subscription} shard ${shard} offset ${offset} attempt ${attempt} (to ${worker})`;
      const location = this.history.locate(message.id);
      if (location === undefined || location.shard !== shard || location.offset !== offset)
        this.violation(
          "claims",
          `delivery ${what} names message ${message.id}, committed at ${JSON.stringify(location)}`,
        );
      const latest = this.history.latest(shard);
      const committed = latest?.subscriptions.get(subscription)?.deliveries.get(offset);
      const status = latest ? statusOf(latest, subscription, offset) : "unknown";
      if (status !== "acked" && status !== "dead" && (committed?.attempt ?? 0) < attempt)
        this.violation(
          "claims",
          `delivery ${what} was acknowledged but is not in the latest committed version`,
        );

      const key = messageKey(shard, subscription, offset);
      const ack = this.confirmedAcks.get(key);
      if (ack !== undefined)
        this.violation(
          "no-redelivery-after-ack",
          `delivery ${what} after an ack of attempt ${ack.attempt} was confirmed (${ack.outcome}) at ${ack.atMs}`,
        );
      const list = this.deliveries.get(key) ?? [];
      if (list.some((d) => d.attempt === attempt))
        this.violation("receipts-unique", `delivery ${what} reuses a receipt already handed out`);
      list.push({
        worker,
        attempt,
        claimedAt: message.leaseDeadline - this.leaseTtlMs,
        deadline: message.leaseDeadline,
        releaseSentAt: undefined,
      });
      this.deliveries.set(key, list);
      if (message.leaseDeadline - this.leaseTtlMs > now)
        this.violation("claims", `delivery ${what} claims a lease that starts in the future`);
    }
  }

  /** A heartbeat returned: these leases are held until the given deadlines. */
  heartbeatAcknowledged(
    shard: number,
    subscription: string,
    extended: readonly { receipt: Receipt; deadline: number }[],
    lost: readonly Receipt[],
  ): void {
    bump(this.counters.ok, "heartbeat");
    bump(this.counters.outcomes, "heartbeat:extended", extended.length);
    bump(this.counters.outcomes, "heartbeat:lost", lost.length);
    for (const { receipt, deadline } of extended) {
      for (const d of this.deliveries.get(messageKey(shard, subscription, receipt.offset)) ?? []) {
        if (d.attempt === receipt.attempt && deadline > d.deadline) d.deadline = deadline;
      }
    }
  }

  /** An ack returned its per-receipt outcomes. */
  ackAcknowledged(shard: number, subscription: string, results: readonly AckItemResult[]): void {
    bump(this.counters.ok, "ack");
    const latest = this.history.latest(shard);
    for (const { receipt, outcome } of results) {
      bump(this.counters.outcomes, `ack:${outcome}`);
      this.trace.add(`ack ${subscription} s${shard}@${receipt.offset}#${receipt.attempt} ${outcome}`);
      if (outcome === "lease_lost") continue;
      const what = `ack of ${subscription} shard ${shard} offset ${receipt.offset} attempt ${receipt.attempt} (${outcome})`;
      const status = latest ? statusOf(latest, subscription, receipt.offset) : "unknown";
      if (status !== "acked")
        this.violation("durable-ack", `${what} was confirmed but the latest version says ${status}`);
      const key = messageKey(shard, subscription, receipt.offset);
      if (outcome === "acked") {
        const later = (this.deliveries.get(key) ?? []).find((d) => d.attempt > receipt.attempt);
        if (later !== undefined)
          this.violation(
            "no-redelivery-after-ack",
            `${what}, but attempt ${later.attempt} had already been delivered to ${later.worker}`,
          );
      }
      if (!this.confirmedAcks.has(key))
        this.confirmedAcks.set(key, { attempt: receipt.attempt, outcome, atMs: this.now() });
    }
  }

  /** A nack returned its per-receipt outcomes. */
  nackAcknowledged(shard: number, subscription: string, results: readonly NackItemResult[]): void {
    bump(this.counters.ok, "nack");
    const latest = this.history.latest(shard);
    for (const { receipt, outcome } of results) {
      bump(this.counters.outcomes, `nack:${outcome}`);
      this.trace.add(`nack ${subscription} s${shard}@${receipt.offset}#${receipt.attempt} ${outcome}`);
      const what = `nack of ${subscription} shard ${shard} offset ${receipt.offset} attempt ${receipt.attempt} (${outcome})`;
      if (outcome === "retry_scheduled") {
        const lease = latest?.subscriptions.get(subscription)?.deliveries.get(receipt.offset);
        if (lease?.lease !== undefined && lease.attempt === receipt.attempt)
          this.violation(
            "durable-nack",
            `${what} was confirmed but the latest version still holds that lease`,
          );
      } else if (outcome === "dead_lettered") {
        const dead = latest?.subscriptions.get(subscription)?.dead.get(receipt.offset);
        const status = latest ? statusOf(latest, subscription, receipt.offset) : "unknown";
        if (status !== "dead" || dead === undefined)
          this.violation("durable-nack", `${what} was confirmed but the latest version says ${status}`);
        else if (dead.attempts !== receipt.attempt)
          this.violation("attempts", `${what}: the dead letter records ${dead.attempts} attempts`);
      }
    }
  }

  // ------------------------------------------------------------ the verdict

  /** True when no committed shard holds an unsettled message (the drain is complete). */
  drained(shards: number): boolean {
    for (let shard = 0; shard < shards; shard++) {
      const latest = this.history.latest(shard);
      if (latest === undefined) continue;
      for (const offset of latest.messages.keys()) {
        for (const sub of this.subscriptions) {
          const status = statusOf(latest, sub, offset);
          if (status !== "acked" && status !== "dead") return false;
        }
      }
    }
    return true;
  }

  /** The end-of-run checks (after the drain). */
  finalAudit(): void {
    for (const [id, { shard, offset }] of this.enqueued) {
      const latest = this.history.latest(shard);
      for (const sub of this.subscriptions) {
        const what = `message ${id} (shard ${shard} offset ${offset}) in ${sub}`;
        const status = latest ? statusOf(latest, sub, offset) : "unknown";
        const delivered = this.history.deliveriesOf(shard, sub, offset);
        if (delivered === 0) this.violation("fan-out", `${what} was never delivered`);
        if (status === "acked") this.finallyAcked += 1;
        else if (status === "dead") {
          this.finallyDead += 1;
          const dead = latest?.subscriptions.get(sub)?.dead.get(offset);
          if (dead === undefined)
            this.violation("no-vanishing", `${what} is settled as dead but has no dead letter`);
          else if (dead.attempts !== delivered)
            this.violation(
              "attempts",
              `${what}: dead letter says ${dead.attempts} attempts, the history committed ${delivered} deliveries`,
            );
        } else this.violation("drained", `${what} is still ${status} after the drain`);
      }
    }
    for (const [key, list] of this.deliveries) {
      const ordered = [...list].sort((a, b) => a.claimedAt - b.claimedAt || a.attempt - b.attempt);
      for (let i = 1; i < ordered.length; i++) {
        const before = ordered[i - 1] as DeliveryRecord;
        const after = ordered[i] as DeliveryRecord;
        // Lease times are whole ms (the claim's start is the floor of when it was applied).
        const heldUntil = Math.min(
          before.deadline,
          before.releaseSentAt === undefined ? Number.POSITIVE_INFINITY : Math.floor(before.releaseSentAt),
        );
        if (after.claimedAt < heldUntil)
          this.violation(
            "one-holder",
            `${key}: ${after.worker} got attempt ${after.attempt} at ${after.claimedAt} while ${before.worker} held attempt ${before.attempt} until ${heldUntil}`,
          );
        if (after.attempt <= before.attempt)
          this.violation(
            "receipts-unique",
            `${key}: attempt ${after.attempt} (${after.worker}) was delivered after attempt ${before.attempt} (${before.worker})`,
          );
      }
    }
  }

  /** Counters of this run. */
  stats(): AuditStats {
    return {
      sent: { ...this.counters.sent },
      ok: { ...this.counters.ok },
      failed: { ...this.counters.failed },
      outcomes: { ...this.counters.outcomes },
      acknowledgedMessages: this.enqueued.size,
      deliveries: this.deliveryCount,
      redeliveries: this.redeliveryCount,
      finallyAcked: this.finallyAcked,
      finallyDead: this.finallyDead,
    };
  }
}

/** `DataLoss` -> `data_loss`. */
function snakeCase(name: string): string {
  return name.replace(/(?<=[a-z])(?=[A-Z])/g, "_").toLowerCase();
}

function bump(counter: Record<string, number>, key: string, by = 1): void {
  if (by !== 0) counter[key] = (counter[key] ?? 0) + by;
}

function messageKey(shard: number, subscription: string, offset: number): string {
  return `${shard}/${subscription}/${offset}`;
}

function receiptKey(shard: number, subscription: string, offset: number, attempt: number): string {
  return `${shard}/${subscription}/${offset}#${attempt}`;
}
