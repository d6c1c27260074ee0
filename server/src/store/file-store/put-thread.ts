/**
 * The entry point of a file-store put thread (a `worker_threads` Worker that
 * put-threads.ts starts): it runs one {@link syncPut} at a time and answers
 * with its outcome.
 *
 * Messages (the types below): the store sends a {@link PutThreadJob}, with
 * the body's bytes in a shared scratch buffer (a new buffer rides along when
 * it had to grow), and gets back a {@link PutThreadAnswer} with the same id.
 * The thread says {@link PutThreadReady} once it listens: a thread that fails
 * before that has run nothing. It answers a put as soon as its outcome is
 * known and then releases the key's lock (see sync-put.ts), so a thread that
 * died may have left the lock of the put it answered last. Asked to
 * (`stageNext`), it then stages the lock of its next put, which that put
 * (named by its `stagedDir`) only renames into place. An abort is a job id written into the shared
 * control word, which the put reads before taking the lock and before its
 * commit point.
 */

import { rmSync } from "node:fs";
import { isMainThread, parentPort, workerData } from "node:worker_threads";
import {
  type SyncPutOutcome,
  type SyncPutRequest,
  type SyncPutRun,
  stageAfresh,
  syncPut,
} from "./sync-put.ts";

/** What the store passes a put thread as its `workerData`. */
export interface PutThreadData {
  /** Marks the worker as a put thread. */
  readonly casqPutThread: true;
  /** One Int32: the id of a job to abort (0: none). */
  readonly control: SharedArrayBuffer;
  /** How long a lock may be held and still be handed on whole (sync-put.ts; tests change it). */
  readonly recycleWithinMs?: number;
}

/** One put for the thread. */
export interface PutThreadJob {
  /** At least 1, unique per thread. */
  readonly id: number;
  readonly request: SyncPutRequest;
  /** The body is the first `length` bytes of the scratch buffer. */
  readonly length: number;
  /** The scratch buffer from now on, when it is new. */
  readonly scratch?: SharedArrayBuffer;
}

/** The outcome of one job, or the message of an error that is not a file-system error (a bug). */
export type PutThreadAnswer =
  | { readonly id: number; readonly outcome: SyncPutOutcome }
  | { readonly id: number; readonly error: string };

/** Sent once, when the thread listens for jobs. */
export interface PutThreadReady {
  readonly ready: true;
}

function serve(data: PutThreadData): void {
  const port = parentPort;
  if (port === null) return;
  const control = new Int32Array(data.control);
  let scratch: Uint8Array<ArrayBufferLike> = new Uint8Array(0);
  /** The lock this thread staged ahead after its last put, and when (performance.now()). */
  let staged: { readonly dir: string; readonly at: number } | undefined;
  port.on("message", (job: PutThreadJob) => {
    if (job.scratch !== undefined) scratch = new Uint8Array(job.scratch);
    const { request } = job;
    // The lock staged ahead is used when the put names it (else the run stages its own).
    const stagedAt = staged?.dir === request.stagedDir ? staged.at : undefined;
    // A lock staged for another store (or no longer wanted): remove it, nobody else knows of it.
    if (staged !== undefined && stagedAt === undefined) {
      try {
        rmSync(staged.dir, { recursive: true, force: true });
      } catch {
        // best effort: a staging directory of this live process is harmless, swept once it is gone
      }
    }
    staged = undefined;
    let answer: PutThreadAnswer;
    let finish: SyncPutRun["finish"] | undefined;
    try {
      const aborted = () => Atomics.load(control, 0) === job.id;
      const run = syncPut(request, scratch.subarray(0, job.length), aborted, stagedAt, data.recycleWithinMs);
      answer = { id: job.id, outcome: run.outcome };
      finish = run.finish;
    } catch (error) {
      answer = { id: job.id, error: error instanceof Error ? (error.stack ?? error.message) : String(error) };
    }
    port.postMessage(answer);
    // The lock is released, and the next one staged (the released lock itself, when it can),
    // after the answer is on its way: the caller does not wait for them.
    const next = request.stageNext;
    const nextStaged = finish !== undefined ? finish(next) : stageAfresh(next);
    if (next !== undefined && nextStaged) staged = { dir: next.stagedDir, at: performance.now() };
  });
  port.postMessage({ ready: true } satisfies PutThreadReady);
}

const data = workerData as Partial<PutThreadData> | undefined;
if (!isMainThread && data?.casqPutThread === true && data.control !== undefined) serve(data as PutThreadData);
