/**
 * A job the worker holds: delivered by a stream, waiting or running, until it
 * is settled (acked or nacked) or dropped.
 */
import type { Job } from "../job.ts";
import type { Session } from "../work-session.ts";
import type { LazyAbort } from "./lazy-abort.ts";

/** A held job. */
export interface Held {
  readonly job: Job;
  /** Aborts `job.signal` (made on first read). */
  readonly abort: LazyAbort;
  /** The stream that delivered it: its ack, nack and heartbeats go there while that stream is usable. */
  readonly session: Session;
  /**
   * The stream that gets this job's credit back when the job is done: the one
   * that delivered it, or, once that one ended, a stream opened since (which
   * opened with that much less credit).
   */
  creditTo: Session;
  /** Its credit went back (when its handler finished, before the ack is answered). */
  creditReturned: boolean;
  started: boolean;
  settled: boolean;
  abandoned: boolean;
}
