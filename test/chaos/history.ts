/**
 * The history a chaos client writes: one JSON object per line, appended (and
 * handed to the kernel) as soon as the client was told something, so a client
 * killed with SIGKILL leaves everything it learned before it died.
 *
 * All three client languages (`clients/ts-client.ts`, `clients/python_client.py`,
 * `go-client/main.go`) write these records; times `t` and `leaseDeadline` are
 * milliseconds since the Unix epoch on the machine's one clock.
 *
 * A worker records `ack-sent` when its handler returned (the SDK acks right
 * after) and `nack-sent` when its handler threw (the lease was lost): the SDKs
 * do not tell a handler whether its ack landed, only report failures to an
 * error callback (`error` records). The checker is written for that: it never
 * takes an `ack-sent` for proof that the ack landed.
 */
import { existsSync, readFileSync } from "node:fs";

/** A producer was told that an enqueue is durable. */
export interface EnqueueOk {
  readonly kind: "enqueue-ok";
  readonly t: number;
  readonly proc: string;
  readonly dedup: string;
  readonly id: string;
  readonly duplicate?: boolean;
}

/** An enqueue attempt failed (the producer tries the same dedup id again). */
export interface EnqueueFail {
  readonly kind: "enqueue-fail";
  readonly t: number;
  readonly proc: string;
  readonly dedup: string;
  readonly error: string;
}

/** A handler started on a delivery. */
export interface Deliver {
  readonly kind: "deliver";
  /** When the handler started (no earlier than the claim). */
  readonly t: number;
  readonly proc: string;
  /** Message id. */
  readonly id: string;
  /** The dedup id the payload names. */
  readonly dedup: string;
  /** The dedup id the SDK's job reports; null when that SDK's job has none. */
  readonly jobDedup: string | null;
  readonly receipt: string;
  readonly attempt: number;
  /** The lease deadline granted with the claim; null when that SDK's job has none. */
  readonly leaseDeadline: number | null;
  /** The lease TTL the worker asked for: the claim was at `leaseDeadline - leaseTtlMs`. */
  readonly leaseTtlMs?: number;
}

/** The handler returned: the SDK acks next. */
export interface AckSent {
  readonly kind: "ack-sent";
  readonly t: number;
  readonly proc: string;
  readonly id: string;
  readonly receipt: string;
}

/** The handler threw (after its lease was reported lost): the SDK nacks next. */
export interface NackSent {
  readonly kind: "nack-sent";
  readonly t: number;
  readonly proc: string;
  readonly id: string;
  readonly receipt: string;
}

/** The SDK said the worker no longer holds the job. */
export interface LeaseLost {
  readonly kind: "lease-lost";
  readonly t: number;
  readonly proc: string;
  readonly id: string;
  readonly receipt: string;
}

/** A failure the SDK reported to the error callback (a failed ack, a broken stream, ...). */
export interface ClientError {
  readonly kind: "error";
  readonly t: number;
  readonly proc: string;
  readonly id?: string;
  readonly receipt?: string;
  readonly error: string;
}

/** A client process started or stopped cleanly. */
export interface Lifecycle {
  readonly kind: "start" | "stop";
  readonly t: number;
  readonly proc: string;
}

/** Any line of a history. */
export type HistoryRecord =
  | EnqueueOk
  | EnqueueFail
  | Deliver
  | AckSent
  | NackSent
  | LeaseLost
  | ClientError
  | Lifecycle;

/**
 * Reads one history file (none: no records). A last line cut short by SIGKILL is dropped; any
 * other unparseable line is an error (the harness itself is broken then).
 */
export function readHistory(path: string): HistoryRecord[] {
  // A client that died before it wrote anything (reported as a crash by the run).
  if (!existsSync(path)) return [];
  const lines = readFileSync(path, "utf8").split("\n");
  const records: HistoryRecord[] = [];
  lines.forEach((line, index) => {
    if (line.trim() === "") return;
    try {
      records.push(JSON.parse(line) as HistoryRecord);
    } catch (error) {
      if (index === lines.length - 1) return; // torn by a kill
      throw new Error(`${path}:${index + 1}: not a history record: ${line.slice(0, 200)}`, { cause: error });
    }
  });
  return records;
}
