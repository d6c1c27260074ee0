/**
 * Child process of the scenario step `crashWorker` (test/scenarios/README.md):
 * an SDK worker whose handler prints `STARTED <payload>` on its own stdout
 * line and never returns, so the runner can SIGKILL it mid-job.
 *
 * Usage: `node --import tsx test/sdk-ts/scenario-crash-worker.ts '<json>'`
 * with `{"brokers": [...], "queue": "...", "subscription": "...", "jobs": n}`.
 */
import { Worker } from "@casq/sdk";

interface CrashWorkerConfig {
  readonly brokers: string[];
  readonly queue: string;
  readonly subscription: string;
  readonly jobs: number;
}

const config = JSON.parse(process.argv[2] ?? "{}") as CrashWorkerConfig;
const worker = new Worker({ brokers: config.brokers, workerId: `scenario-crash-worker/${process.pid}` });

await worker.run(
  config.queue,
  async (job) => {
    process.stdout.write(`STARTED ${job.text()}\n`);
    // Never settles: the job must stay leased until the runner kills this process.
    await new Promise<never>(() => {});
  },
  {
    subscription: config.subscription,
    concurrency: config.jobs,
    prefetch: config.jobs,
    onError: (error) => process.stderr.write(`worker error: ${String(error)}\n`),
  },
);
