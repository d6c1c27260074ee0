/**
 * A worker thread that runs simulation seeds for `sim-threads.ts`: one
 * {@link SimThreadJob} in, one {@link SimThreadAnswer} out.
 */
import { parentPort } from "node:worker_threads";
import { runSimulation, type SimResult } from "./run-simulation.ts";
import type { SimConfigOverrides } from "./sim-config.ts";

/** A seed to run. */
export interface SimThreadJob {
  /** Unique per pool. */
  readonly id: number;
  readonly seed: number;
  /** Plain data, as `runSimulation` takes it. */
  readonly overrides: SimConfigOverrides;
}

/** The seed's result, or the error its run threw (a bug of the simulation, not a broken invariant). */
export type SimThreadAnswer =
  | { readonly id: number; readonly result: SimResult }
  | { readonly id: number; readonly error: string };

const port = parentPort;
if (port !== null)
  port.on("message", (job: SimThreadJob) => {
    runSimulation(job.seed, job.overrides).then(
      (result) => port.postMessage({ id: job.id, result } satisfies SimThreadAnswer),
      (error: unknown) =>
        port.postMessage({
          id: job.id,
          error: error instanceof Error ? (error.stack ?? error.message) : String(error),
        } satisfies SimThreadAnswer),
    );
  });
