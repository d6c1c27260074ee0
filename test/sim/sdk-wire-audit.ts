/**
 * What an SDK worker sends and is told, read off its wire ({@link WireTap})
 * and reported to the auditor exactly as the direct worker actor
 * (`worker.ts`) reports its calls:
 *
 * - an ack / nack (unary, or a Work-stream request) is marked SENT when it
 *   leaves the client, before any broker can apply it (a release is a nack);
 * - a `job` on a Work stream is an acknowledged claim;
 * - an ack / nack / heartbeat answer (a unary response, or the stream's
 *   `acked` / `nacked` / `heartbeated` reply) is an acknowledged result,
 *   per shard of its receipts. A `request_failed` reply, a broken stream or
 *   a failed call acknowledges nothing.
 *
 * Receipts are parsed the way the server parses them (`receipts.ts`).
 */
import { timestampMs } from "@bufbuild/protobuf/wkt";
import {
  AckOutcome,
  type AckResult,
  type ClaimedMessage,
  HeartbeatOutcome,
  type HeartbeatResult,
  NackOutcome,
  type NackResult,
} from "@casq/api/casq/v1/message_pb.ts";
import type { WorkResponse } from "@casq/api/casq/v1/work_pb.ts";
import type { AckItemResult, NackItemResult, Receipt } from "../../server/src/model/operations.ts";
import { parseReceipt } from "../../server/src/service/receipts.ts";
import type { Auditor } from "./auditor.ts";
import type { WireTap } from "./sim-connections.ts";

const ACK_OUTCOMES: Record<AckOutcome, AckItemResult["outcome"] | undefined> = {
  [AckOutcome.UNSPECIFIED]: undefined,
  [AckOutcome.ACKED]: "acked",
  [AckOutcome.ALREADY_ACKED]: "already_acked",
  [AckOutcome.LEASE_LOST]: "lease_lost",
};

const NACK_OUTCOMES: Record<NackOutcome, NackItemResult["outcome"] | undefined> = {
  [NackOutcome.UNSPECIFIED]: undefined,
  [NackOutcome.RETRY_SCHEDULED]: "retry_scheduled",
  [NackOutcome.DEAD_LETTERED]: "dead_lettered",
  [NackOutcome.LEASE_LOST]: "lease_lost",
};

interface ShardReceipt extends Receipt {
  readonly shard: number;
}

function receiptOf(text: string): ShardReceipt {
  return parseReceipt(text, 0, Number.MAX_SAFE_INTEGER);
}

/** Groups per-receipt results by the shard their receipt names. */
function byShard<T extends { receipt: string }>(results: readonly T[]): Map<number, [ShardReceipt, T][]> {
  const out = new Map<number, [ShardReceipt, T][]>();
  for (const result of results) {
    const receipt = receiptOf(result.receipt);
    const list = out.get(receipt.shard) ?? [];
    list.push([receipt, result]);
    out.set(receipt.shard, list);
  }
  return out;
}

/** Shapes the SDK builds its requests in (message init shapes). */
interface SettleRequest {
  readonly receipts?: readonly string[];
}
interface WorkRequestInit {
  readonly command?: { readonly case?: string; readonly value?: SettleRequest };
}

/** Reports one SDK worker process's wire to the auditor (see module header). */
export class SdkWireAudit implements WireTap {
  constructor(
    private readonly auditor: Auditor,
    private readonly subscription: string,
    private readonly workerId: string,
    /** Called with each job the worker was handed (for the actor's own bookkeeping). */
    private readonly onJob: (claim: ClaimedMessage) => void = () => {},
  ) {}

  request(method: string, message: unknown): void {
    if (method === "Ack" || method === "Nack" || method === "Heartbeat")
      this.auditor.requestSent(method.toLowerCase());
    if (method === "Ack") this.sent("ack", (message as SettleRequest).receipts);
    else if (method === "Nack") this.sent("nack", (message as SettleRequest).receipts);
    else if (method === "Work") {
      const command = (message as WorkRequestInit).command;
      if (command?.case === "ack" || command?.case === "nack") {
        this.auditor.requestSent(`work:${command.case}`);
        this.sent(command.case, command.value?.receipts);
      }
    }
  }

  response(method: string, message: unknown): void {
    if (method === "Ack") this.acked((message as { results: AckResult[] }).results);
    else if (method === "Nack") this.nacked((message as { results: NackResult[] }).results);
    else if (method === "Heartbeat") this.heartbeated((message as { results: HeartbeatResult[] }).results);
    else if (method === "Work") {
      const event = (message as WorkResponse).event;
      if (event.case === "job") {
        this.onJob(event.value);
        this.claimed(event.value);
      } else if (event.case === "jobs") {
        for (const job of event.value.jobs) {
          this.onJob(job);
          this.claimed(job);
        }
      } else if (event.case === "acked") this.acked(event.value.results);
      else if (event.case === "nacked") this.nacked(event.value.results);
      else if (event.case === "heartbeated") this.heartbeated(event.value.results);
    }
  }

  private sent(kind: "ack" | "nack", receipts: readonly string[] | undefined): void {
    for (const text of receipts ?? []) {
      const { shard, offset, attempt } = receiptOf(text);
      if (kind === "ack") this.auditor.markAckSent(shard, this.subscription, { offset, attempt });
      else this.auditor.markNackSent(shard, this.subscription, { offset, attempt });
    }
  }

  private claimed(claim: ClaimedMessage): void {
    const { shard, offset, attempt } = receiptOf(claim.receipt);
    const leaseDeadline = claim.leaseDeadline ? timestampMs(claim.leaseDeadline) : 0;
    this.auditor.claimAcknowledged(this.workerId, this.subscription, [
      { shard, message: { id: claim.message?.id ?? "", receipt: { offset, attempt }, leaseDeadline } },
    ]);
  }

  private acked(results: readonly AckResult[]): void {
    for (const [shard, list] of byShard(results)) {
      const items: AckItemResult[] = [];
      for (const [{ offset, attempt }, r] of list) {
        const outcome = ACK_OUTCOMES[r.outcome];
        if (outcome !== undefined) items.push({ receipt: { offset, attempt }, outcome });
      }
      this.auditor.ackAcknowledged(shard, this.subscription, items);
    }
  }

  private nacked(results: readonly NackResult[]): void {
    for (const [shard, list] of byShard(results)) {
      const items: NackItemResult[] = [];
      for (const [{ offset, attempt }, r] of list) {
        const outcome = NACK_OUTCOMES[r.outcome];
        if (outcome !== undefined) items.push({ receipt: { offset, attempt }, outcome });
      }
      this.auditor.nackAcknowledged(shard, this.subscription, items);
    }
  }

  private heartbeated(results: readonly HeartbeatResult[]): void {
    for (const [shard, list] of byShard(results)) {
      const extended: { receipt: Receipt; deadline: number }[] = [];
      const lost: Receipt[] = [];
      for (const [{ offset, attempt }, r] of list) {
        if (r.outcome === HeartbeatOutcome.EXTENDED && r.leaseDeadline)
          extended.push({ receipt: { offset, attempt }, deadline: timestampMs(r.leaseDeadline) });
        else if (r.outcome === HeartbeatOutcome.LOST) lost.push({ offset, attempt });
      }
      this.auditor.heartbeatAcknowledged(shard, this.subscription, extended, lost);
    }
  }
}
