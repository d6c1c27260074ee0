/**
 * The checker on synthetic histories: a clean run with every allowed
 * at-least-once pattern passes, and each kind of violation is reported, so a
 * chaos run that finds nothing cannot be passing vacuously.
 */
import { describe, expect, it } from "vitest";
import { checkHistories, type FinalState, type Violation } from "./checker.ts";
import type { Deliver, HistoryRecord } from "./history.ts";

const T0 = Date.parse("2030-01-01T00:00:00Z");
const LEASE = 3_000;
const drained: FinalState = { depth: 0, deadLetterIds: [] };

function enqueued(dedup: string, id: string, t = T0): HistoryRecord {
  return { kind: "enqueue-ok", t, proc: "ts-p1", dedup, id };
}

function deliver(id: string, dedup: string, receipt: string, t: number, attempt = 1): Deliver {
  return {
    kind: "deliver",
    t,
    proc: "go-w1",
    id,
    dedup,
    jobDedup: dedup,
    receipt,
    attempt,
    leaseDeadline: t + LEASE,
    leaseTtlMs: LEASE,
  };
}

function acked(id: string, receipt: string, t: number): HistoryRecord {
  return { kind: "ack-sent", t, proc: "go-w1", id, receipt };
}

function kinds(violations: readonly Violation[]): string[] {
  return violations.map((v) => v.kind);
}

/** One message enqueued, delivered once and acked. */
function clean(dedup: string, id: string, at = T0): HistoryRecord[] {
  return [enqueued(dedup, id, at), deliver(id, dedup, `${id}-r1`, at + 10), acked(id, `${id}-r1`, at + 50)];
}

describe("checkHistories", () => {
  it("passes a clean history with every allowed at-least-once pattern", () => {
    const records: HistoryRecord[] = [
      ...clean("p.1", "m1"),
      // Retried enqueue: a failure, then the same id twice (the second a duplicate).
      { kind: "enqueue-fail", t: T0, proc: "ts-p1", dedup: "p.2", error: "UNAVAILABLE" },
      enqueued("p.2", "m2"),
      { kind: "enqueue-ok", t: T0 + 5, proc: "ts-p1", dedup: "p.2", id: "m2", duplicate: true },
      // Worker killed mid-job: redelivered once the lease expired.
      deliver("m2", "p.2", "m2-r1", T0 + 10),
      deliver("m2", "p.2", "m2-r2", T0 + 10 + LEASE + 5, 2),
      acked("m2", "m2-r2", T0 + LEASE + 100),
      // Acked, but the ack did not land (leader died): redelivered after the lease expired.
      enqueued("p.3", "m3"),
      deliver("m3", "p.3", "m3-r1", T0 + 10),
      acked("m3", "m3-r1", T0 + 20),
      deliver("m3", "p.3", "m3-r2", T0 + 10 + LEASE + 400, 2),
      acked("m3", "m3-r2", T0 + LEASE + 500),
      // Lease lost, handler threw (nack): redelivered at once.
      enqueued("p.4", "m4"),
      deliver("m4", "p.4", "m4-r1", T0 + 10),
      { kind: "lease-lost", t: T0 + 20, proc: "go-w1", id: "m4", receipt: "m4-r1" },
      { kind: "nack-sent", t: T0 + 21, proc: "go-w1", id: "m4", receipt: "m4-r1" },
      deliver("m4", "p.4", "m4-r2", T0 + 30, 2),
      acked("m4", "m4-r2", T0 + 40),
      // Dead-lettered without a delivery (counts as accounted for).
      enqueued("p.5", "m5"),
    ];
    const result = checkHistories(records, { depth: 0, deadLetterIds: ["m5"] });
    expect(result.violations).toEqual([]);
    expect(result.counts).toMatchObject({
      enqueued: 5,
      enqueueFailures: 1,
      duplicateAcks: 1,
      delivered: 7,
      messagesDelivered: 4,
      redelivered: 3,
      acked: 5,
      nacked: 1,
      redeliveredAfterAckExpired: 1,
      leasesLost: 1,
      deadLetters: 1,
    });
  });

  it("reports an acknowledged enqueue that was never delivered nor dead-lettered", () => {
    const result = checkHistories([...clean("p.1", "m1"), enqueued("p.2", "m2")], drained);
    expect(kinds(result.violations)).toEqual(["lost"]);
    expect(result.violations[0]?.subject).toBe("m2");
  });

  it("reports a message that left the queue although no handler finished it", () => {
    const records = [enqueued("p.1", "m1"), deliver("m1", "p.1", "r1", T0 + 10)];
    expect(kinds(checkHistories(records, drained).violations)).toEqual(["vanished"]);
  });

  it("reports two message ids for one dedup id, from enqueues or from deliveries", () => {
    const twoAcks = [...clean("p.1", "m1"), ...clean("p.1", "m9")];
    expect(kinds(checkHistories(twoAcks, drained).violations)).toEqual(["duplicate-dedup"]);
    const deliveredTwice = [
      ...clean("p.1", "m1"),
      deliver("m7", "p.1", "r7", T0 + 60),
      acked("m7", "r7", T0 + 70),
    ];
    expect(kinds(checkHistories(deliveredTwice, drained).violations)).toEqual(["duplicate-dedup"]);
  });

  it("reports a redelivery after an ack while the acked delivery's lease still ran", () => {
    const records = [...clean("p.1", "m1"), deliver("m1", "p.1", "m1-r2", T0 + 1_000, 2)];
    expect(kinds(checkHistories(records, drained).violations)).toEqual(["redelivery-after-ack"]);
  });

  it("reports two live leases on one message", () => {
    const records = [
      enqueued("p.1", "m1"),
      deliver("m1", "p.1", "m1-r1", T0 + 10),
      deliver("m1", "p.1", "m1-r2", T0 + 1_000, 2),
      acked("m1", "m1-r2", T0 + 1_100),
      acked("m1", "m1-r1", T0 + 1_200),
    ];
    expect(kinds(checkHistories(records, drained).violations)).toEqual(["two-live-leases"]);
  });

  it("does not count a nack that came only after the second delivery as giving the job back", () => {
    const records = [
      enqueued("p.1", "m1"),
      deliver("m1", "p.1", "m1-r1", T0 + 10),
      deliver("m1", "p.1", "m1-r2", T0 + 1_000, 2),
      { kind: "nack-sent", t: T0 + 2_000, proc: "go-w1", id: "m1", receipt: "m1-r1" } as const,
      acked("m1", "m1-r2", T0 + 2_100),
    ];
    expect(kinds(checkHistories(records, drained).violations)).toEqual(["two-live-leases"]);
  });

  it("compares claim times, not handler starts: a job a frozen broker sent late is no second lease", () => {
    // Claimed at T0, sent only after the broker was thawed at T0+5 s; meanwhile the
    // lease expired and another broker delivered the message again.
    const late = { ...deliver("m1", "p.1", "m1-r1", T0 + 5_000), leaseDeadline: T0 + LEASE };
    const records = [
      enqueued("p.1", "m1"),
      deliver("m1", "p.1", "m1-r2", T0 + LEASE + 300, 2),
      late,
      acked("m1", "m1-r2", T0 + LEASE + 400),
      acked("m1", "m1-r1", T0 + 5_100),
    ];
    const result = checkHistories(records, drained);
    expect(result.violations).toEqual([]);
    expect(result.counts.lateStarts).toBe(1);
    // A handler that started late but whose claim fell inside the first lease is a second lease.
    const overlapping = [
      enqueued("p.2", "m2"),
      deliver("m2", "p.2", "m2-r1", T0 + 10),
      { ...deliver("m2", "p.2", "m2-r2", T0 + 4_000, 2), leaseDeadline: T0 + 1_000 + LEASE },
      acked("m2", "m2-r1", T0 + 3_500),
      acked("m2", "m2-r2", T0 + 4_100),
    ];
    expect(kinds(checkHistories(overlapping, drained).violations)).toEqual(["two-live-leases"]);
  });

  it("reports a final depth that is not 0", () => {
    const result = checkHistories(clean("p.1", "m1"), { depth: 3, deadLetterIds: [] });
    expect(kinds(result.violations)).toEqual(["final-depth"]);
  });

  it("reports a delivery no producer sent, and a job whose dedup id differs from its payload's", () => {
    const unknown = [...clean("p.1", "m1"), deliver("m2", "x.9", "r2", T0 + 10), acked("m2", "r2", T0 + 20)];
    expect(kinds(checkHistories(unknown, drained).violations)).toEqual(["unknown-message"]);
    const mismatch = [
      enqueued("p.1", "m1"),
      { ...deliver("m1", "p.1", "r1", T0 + 10), jobDedup: "p.2" },
      acked("m1", "r1", T0 + 20),
    ];
    expect(kinds(checkHistories(mismatch, drained).violations)).toEqual(["payload-mismatch"]);
  });

  it("skips lease checks of deliveries without a deadline, and counts them", () => {
    const records = [
      enqueued("p.1", "m1"),
      { ...deliver("m1", "p.1", "m1-r1", T0 + 10), leaseDeadline: null },
      deliver("m1", "p.1", "m1-r2", T0 + 20, 2),
      acked("m1", "m1-r2", T0 + 30),
    ];
    const result = checkHistories(records, drained);
    expect(result.violations).toEqual([]);
    expect(result.counts.uncheckedLeases).toBe(1);
  });

  it("lists at most maxPerKind violations of a kind and counts the rest", () => {
    const records = Array.from({ length: 5 }, (_, i) => enqueued(`p.${i}`, `m${i}`));
    const result = checkHistories(records, drained, { maxPerKind: 2 });
    expect(kinds(result.violations)).toEqual(["lost", "lost", "lost"]);
    expect(result.violations[2]?.detail).toContain("3 more lost");
  });
});
