/**
 * settleError: a nack resent after an attempt that may have landed finds the
 * lease gone because of that very nack, so LEASE_LOST is no lease loss there.
 */
import { create } from "@bufbuild/protobuf";
import { AckOutcome, AckResultSchema, NackOutcome, NackResultSchema } from "@casq/api/casq/v1/message_pb.ts";
import { describe, expect, it } from "vitest";
import { CasqError, Code, LeaseLostError } from "./errors.ts";
import { settleError } from "./settle-outcome.ts";

const job = { id: "m1", queue: "q", attempt: 1, receipt: "r1" };
const nackLost = [create(NackResultSchema, { receipt: "r1", outcome: NackOutcome.LEASE_LOST })];
const ackLost = [create(AckResultSchema, { receipt: "r1", outcome: AckOutcome.LEASE_LOST })];

describe("settleError", () => {
  it("is nothing for an ack or nack that did what was asked", () => {
    const acked = [create(AckResultSchema, { receipt: "r1", outcome: AckOutcome.ALREADY_ACKED })];
    expect(settleError(job, "ack", acked, true)).toBeUndefined();
    const retried = [create(NackResultSchema, { receipt: "r1", outcome: NackOutcome.RETRY_SCHEDULED })];
    expect(settleError(job, "nack", retried, false)).toBeUndefined();
  });

  it("reports a lost lease on a first answer", () => {
    expect(settleError(job, "nack", nackLost, false)).toBeInstanceOf(LeaseLostError);
    expect(settleError(job, "ack", ackLost, false)).toBeInstanceOf(LeaseLostError);
  });

  it("reports an unknown outcome, not a lost lease, for LEASE_LOST to a resent nack", () => {
    const error = settleError(job, "nack", nackLost, true);
    expect(error).toBeInstanceOf(CasqError);
    expect(error).not.toBeInstanceOf(LeaseLostError);
    expect(error?.code).toBe(Code.Unknown);
    expect(error?.message).toContain("unknown outcome");
    // An ack that landed answers ALREADY_ACKED on its resend: LEASE_LOST is a real loss.
    expect(settleError(job, "ack", ackLost, true)).toBeInstanceOf(LeaseLostError);
  });
});
