/**
 * What a worker makes of the broker's answer to its ack or nack: nothing
 * (it did what was asked), a {@link LeaseLostError}, or an outcome it cannot
 * know.
 */

import { AckOutcome, type AckResult, NackOutcome, type NackResult } from "@casq/api/casq/v1/message_pb.ts";
import { Code } from "@connectrpc/connect";
import { CasqError, LeaseLostError, type SettleOperation } from "./errors.ts";

/** The job a settle was about. */
export interface SettledJob {
  readonly id: string;
  readonly queue: string;
  readonly attempt: number;
  readonly receipt: string;
}

/**
 * The error to report for the answer `results` to an ack or nack of `job`,
 * or undefined when it did what was asked. `resent`: the answer is to a
 * resend after an attempt that may have been applied. A nack that landed
 * ends the delivery, so its resend finds the lease gone: LEASE_LOST then
 * says nothing about the worker's nack, and the outcome is unknown (an ack
 * that landed answers ALREADY_ACKED instead, so acks need no such care).
 */
export function settleError(
  job: SettledJob,
  operation: SettleOperation,
  results: readonly (AckResult | NackResult)[],
  resent: boolean,
): CasqError | undefined {
  const result = results.find((r) => r.receipt === job.receipt) ?? results[0];
  const ok =
    operation === "ack"
      ? result?.outcome === AckOutcome.ACKED || result?.outcome === AckOutcome.ALREADY_ACKED
      : result?.outcome === NackOutcome.RETRY_SCHEDULED || result?.outcome === NackOutcome.DEAD_LETTERED;
  if (ok) return undefined;
  const lost =
    operation === "ack"
      ? result?.outcome === AckOutcome.LEASE_LOST
      : result?.outcome === NackOutcome.LEASE_LOST;
  if (lost && resent && operation === "nack") {
    return new CasqError(
      Code.Unknown,
      `casq: nack of job ${job.id} (queue ${job.queue}, attempt ${job.attempt}) has an unknown outcome: ` +
        "an attempt timed out or lost its connection and may have been applied, and its resend found " +
        "the lease gone, as it would after that nack",
    );
  }
  if (lost) return new LeaseLostError(job, operation);
  return new CasqError(
    Code.Unknown,
    `casq: ${operation} of job ${job.id} (queue ${job.queue}) got no known outcome ` +
      `(${result === undefined ? "no result" : `outcome ${result.outcome}`})`,
  );
}
