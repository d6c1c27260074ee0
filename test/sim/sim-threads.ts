/**
 * Simulation seeds run on worker threads, one seed per thread at a time. A
 * seed is CPU-bound and single-threaded; on a two-core machine two threads
 * use both cores, shared with the test file vitest runs beside this one.
 * Each seed stays deterministic: its world
 * lives in one thread, with its own seeded clock and randomness, and every
 * module the simulation uses is that thread's own copy.
 */
import { Worker } from "node:worker_threads";
import type { SimResult } from "./run-simulation.ts";
import type { SimConfigOverrides } from "./sim-config.ts";
import type { SimThreadAnswer, SimThreadJob } from "./sim-thread.ts";

/** One seed asked for, until its thread answers. */
interface Pending {
  readonly seed: number;
  readonly overrides: SimConfigOverrides;
  readonly resolve: (result: SimResult) => void;
  readonly reject: (error: Error) => void;
}

/** One thread and the seed it runs, if any. */
interface Lane {
  readonly worker: Worker;
  current: (Pending & { readonly id: number }) | undefined;
  /** Seeds it answered: a thread that dies before its first answer counts as one that cannot start. */
  answered: number;
}

/** Threads that die before answering once, in a row, before the pool gives up (they cannot start). */
const MAX_START_FAILURES = 3;

/**
 * The thread's script: it loads tsx, then the TypeScript module (Node 20 gives
 * a worker neither the parent's loader hooks nor those of an `--import` in its
 * execArgv; server/src/store/file-store/put-threads.ts does the same).
 */
function threadEntry(): string {
  const tsx = JSON.stringify(import.meta.resolve("tsx/esm/api"));
  const module = JSON.stringify(new URL("./sim-thread.ts", import.meta.url).href);
  return `import(${tsx}).then((tsx) => { tsx.register(); return import(${module}); });`;
}

/** A pool of simulation threads, started by the first seed asked for. */
export class SimThreads {
  private readonly lanes: Lane[] = [];
  private readonly waiting: Pending[] = [];
  private nextId = 1;
  private startFailures = 0;
  /** Set once the pool cannot run seeds (closed, or threads that cannot start): every later seed fails with it. */
  private broken: Error | undefined;

  constructor(private readonly threads: number) {}

  /** Runs `seed` (with `overrides`, as `runSimulation` takes them) on the next free thread. */
  run(seed: number, overrides: SimConfigOverrides = {}): Promise<SimResult> {
    return new Promise((resolve, reject) => {
      if (this.broken !== undefined) {
        reject(this.broken);
        return;
      }
      this.waiting.push({ seed, overrides, resolve, reject });
      while (this.lanes.length < this.threads) this.startLane();
      this.dispatch();
    });
  }

  /** Ends the threads; seeds still queued or running fail. */
  async close(): Promise<void> {
    this.breakWith(new Error("the simulation threads were closed"));
    await Promise.all(this.lanes.map((lane) => lane.worker.terminate()));
  }

  private startLane(): void {
    const worker = new Worker(threadEntry(), { eval: true });
    const lane: Lane = { worker, current: undefined, answered: 0 };
    worker.on("message", (answer: SimThreadAnswer) => {
      const job = lane.current;
      if (job === undefined || job.id !== answer.id) return;
      lane.current = undefined;
      lane.answered += 1;
      this.startFailures = 0;
      if ("error" in answer) job.reject(new Error(`seed ${job.seed}: ${answer.error}`));
      else job.resolve(answer.result);
      this.dispatch();
    });
    // `error` then `exit` for a thread that threw: the first one ends the lane.
    worker.on("error", (error) => this.lost(lane, error));
    worker.on("exit", (code) => this.lost(lane, new Error(`the simulation thread exited (code ${code})`)));
    this.lanes.push(lane);
  }

  private dispatch(): void {
    for (const lane of this.lanes) {
      if (lane.current !== undefined) continue;
      const job = this.waiting.shift();
      if (job === undefined) return;
      lane.current = { ...job, id: this.nextId++ };
      lane.worker.postMessage({
        id: lane.current.id,
        seed: job.seed,
        overrides: job.overrides,
      } satisfies SimThreadJob);
    }
  }

  /** A thread died: its seed fails, and another thread takes its place (unless threads cannot start at all). */
  private lost(lane: Lane, error: Error): void {
    const at = this.lanes.indexOf(lane);
    if (at < 0) return;
    this.lanes.splice(at, 1);
    const job = lane.current;
    lane.current = undefined;
    job?.reject(
      new Error(`seed ${job.seed}: its simulation thread died: ${error.message}`, { cause: error }),
    );
    if (this.broken !== undefined) return;
    if (lane.answered === 0) this.startFailures += 1;
    if (this.startFailures >= MAX_START_FAILURES) {
      this.breakWith(new Error(`simulation threads cannot start: ${error.message}`, { cause: error }));
      return;
    }
    if (this.waiting.length > 0) {
      this.startLane();
      this.dispatch();
    }
  }

  private breakWith(error: Error): void {
    this.broken ??= error;
    for (const job of this.waiting.splice(0)) job.reject(this.broken);
  }
}
