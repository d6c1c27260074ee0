/**
 * What the end-to-end benchmark needs from a queue system (casq or a peer):
 * start its server(s) on loopback, make a fresh queue, enqueue one job or a
 * batch through the client a user would use, and run workers over it. Every
 * system is driven through the same shapes (`shapes.ts`), so the numbers of one
 * run compare as ratios.
 */

/** One queue of a system under test, fresh for each measured run. */
export interface BenchQueue {
  /** Enqueues one job; resolves when the system acknowledged it. */
  enqueue(payload: Buffer): Promise<void>;
  /** Enqueues a batch in one request (or the system's bulk API). */
  enqueueBatch(payloads: Buffer[]): Promise<void>;
  /**
   * Starts workers with `concurrency` handlers at once; `onJob` runs as each
   * handler starts, and the job is acknowledged when it returns.
   */
  work(concurrency: number, onJob: (payload: Buffer) => void): Promise<BenchWorkers>;
  /** Releases the queue's clients (not the server). */
  close(): Promise<void>;
}

/** Running workers of {@link BenchQueue.work}. */
export interface BenchWorkers {
  stop(): Promise<void>;
}

/** A system under test. */
export interface QueueSystem {
  /** Short name used in tables and JSON (`casq`, `bullmq`, ...). */
  readonly name: string;
  /** What an acknowledged enqueue survives, in a few words (printed beside the ratios). */
  readonly durability: string;
  /** Starts the server(s); throws {@link SkipSystem} when a needed program is not installed. */
  start(): Promise<void>;
  /** Stops the server(s) and removes their data. */
  stop(): Promise<void>;
  /** Process ids of the server(s), for their CPU time. */
  serverPids(): number[];
  /** A fresh, empty queue. */
  newQueue(): Promise<BenchQueue>;
  /** Store writes so far (casq only: PUTs to the object store), for PUTs per job. */
  storeWrites?(): Promise<number>;
}

/** Thrown by {@link QueueSystem.start} when the system cannot run here; the benchmark prints the reason and goes on. */
export class SkipSystem extends Error {}
