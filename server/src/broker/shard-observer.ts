/**
 * The broker's observation seam: the commit loop reports what it did here,
 * and telemetry (metrics, traces, logs) attaches to it without the engine
 * knowing about any of them.
 */
import type { ExpireResult, Operation, OperationResult } from "../model/operations.ts";
import type { BrokerRecord } from "../model/shard-state.ts";

/** One finished batch. */
export interface CommitInfo {
  readonly queue: string;
  readonly shard: number;
  readonly epoch: number;
  /** Operations (and reads) in the batch. */
  readonly operations: number;
  readonly opsByKind: Readonly<Record<string, number>>;
  /** CAS writes it took (0 when nothing needed writing). */
  readonly casAttempts: number;
  readonly outcome: "ok" | "no_write";
  readonly documentBytes: number;
  readonly durationMs: number;
  /** When the batch was applied (the `now` its operations saw, epoch ms). */
  readonly appliedAt?: number;
  /** The batch's operations that succeeded with their results, in batch order (what the commit did). */
  readonly applied?: readonly { readonly op: Operation; readonly result: OperationResult }[];
  /** The housekeeping sweep the commit included (for a write recognised only after a re-read, the sweep of the attempt that landed). */
  readonly expired?: ExpireResult;
}

/** One failed CAS attempt. */
export interface CasAttemptInfo {
  readonly queue: string;
  readonly shard: number;
  readonly attempt: number;
  /** The store error kind that ended the attempt. */
  readonly outcome: string;
}

/** A change of leadership as this broker saw it. */
export interface LeadershipEvent {
  readonly queue: string;
  readonly shard: number;
  readonly event: "acquired" | "lost" | "refused";
  readonly record?: BrokerRecord | undefined;
  /** Why the shard was refused (`refused` only): the message its requests get. */
  readonly reason?: string | undefined;
}

/** Callbacks a shard leader invokes; all optional. */
export interface ShardObserver {
  onCommit?(info: CommitInfo): void;
  onCasAttempt?(info: CasAttemptInfo): void;
  onLeadership?(event: LeadershipEvent): void;
}
