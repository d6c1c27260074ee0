/**
 * Leadership by CAS, as pure decisions.
 *
 * The shard document names the broker that may write it: `{id, address,
 * epoch, leaseUntil}`. A broker leads a shard while that record is its own and
 * the lease has not run out. It renews the lease with every ordinary write
 * and, when idle, with a renewal write once less than half the lease remains
 * (so an idle shard costs one PUT per `leaseMs / 2`; with the default 10 s
 * lease that is 0.2 PUT/s, about 17,000 PUTs or $0.09 a day per idle shard at
 * $5 per million PUTs).
 *
 * Another broker takes a shard over only when the lease has expired (or was
 * released by a graceful stop, `leaseUntil = 0`), and only by a CAS write that
 * bumps the epoch. A deposed broker's next write carries a stale etag and
 * fails, so it can never commit again: fencing is by CAS on the etag, and the
 * epoch tells every reader who is current. Two brokers at once cost
 * contention, never correctness.
 */
import type { BrokerRecord } from "../model/shard-state.ts";

/** Who this broker is. */
export interface BrokerIdentity {
  /** Unique per process start. */
  readonly id: string;
  /** Address clients should be redirected to (host:port). */
  readonly address: string;
}

/** True when `record` is held by someone else whose lease has not expired at `now`. */
export function heldByOther(record: BrokerRecord | undefined, self: BrokerIdentity, now: number): boolean {
  return record !== undefined && record.id !== self.id && record.leaseUntil > now;
}

/** True when `record` names this broker (any lease state). */
export function isOwnRecord(record: BrokerRecord | undefined, self: BrokerIdentity): boolean {
  return record !== undefined && record.id === self.id;
}

/** The record a broker writes to take over a shard: the epoch moves forward by one. */
export function takeoverRecord(
  previous: BrokerRecord | undefined,
  self: BrokerIdentity,
  now: number,
  leaseMs: number,
): BrokerRecord {
  return { id: self.id, address: self.address, epoch: (previous?.epoch ?? 0) + 1, leaseUntil: now + leaseMs };
}

/** True when an idle leader should spend a write on renewing its lease. */
export function needsRenewal(record: BrokerRecord, now: number, leaseMs: number): boolean {
  return record.leaseUntil - now < leaseMs / 2;
}
