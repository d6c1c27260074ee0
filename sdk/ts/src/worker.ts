/**
 * The worker: `worker.run(queue, handler)` over `QueueService.Work`
 * bidirectional streams — one per broker that leads shards of the queue —
 * with credits (prefetch per stream), heartbeats, ack / nack / dead-letter by
 * the handler's outcome, lost-lease signalling, reconnects with backoff that
 * follow redirects, and graceful shutdown. This file is the public face; a
 * run's parts are in worker/ (worker/run.ts wires them).
 */

import { hostname } from "node:os";
import type { Tracer, TracerProvider } from "@opentelemetry/api";
import { type ClientOptions, resolveClientOptions } from "./client-options.ts";
import { casqTracer } from "./tracing.ts";
import { BrokerPool } from "./transport.ts";
import type { JobHandler } from "./worker/executor.ts";
import { consoleLogger, type WorkerLogger } from "./worker/reporter.ts";
import { Run, type RunOptions } from "./worker/run.ts";

// Part of the Worker's API, defined beside the part that uses them (a part
// importing this file would make an import cycle).
export type { JobHandler } from "./worker/executor.ts";
export { consoleLogger, type WorkerLogger } from "./worker/reporter.ts";
export type { RunOptions } from "./worker/run.ts";

/** Options of a {@link Worker}: where casq is, plus the worker's identity. */
export interface WorkerOptions extends ClientOptions {
  /**
   * Where failures are logged: each handler that throws (warn, or error when
   * the job is dead-lettered), each failed or lease-lost ack / nack and each
   * broken stream (warn). Default {@link consoleLogger}; `null` logs nothing
   * (`onError` still hears of everything).
   */
  readonly logger?: WorkerLogger | null;
  /** Worker identity recorded in leases and logs. Default `<hostname>/<pid>`. */
  readonly workerId?: string;
  /**
   * Where the `process <queue>` spans of handlers go (see the Tracing section
   * of the docs). Default: the global provider (`trace.getTracer("casq")`),
   * a no-op until an OpenTelemetry SDK registers one.
   */
  readonly tracerProvider?: TracerProvider;
}

/** Options of {@link Worker.stop}. */
export interface StopOptions {
  /** How long to wait for running handlers before aborting them. Default 30 000 ms. */
  readonly timeoutMs?: number;
}

/**
 * Runs handlers for jobs of a queue. Each handler runs inside an
 * OpenTelemetry `process <queue>` span that continues the producer's trace.
 *
 * @example
 * const worker = new Worker({ brokers: ["127.0.0.1:50051"] });
 * const done = worker.run("emails", async (job) => send(job.json()), { concurrency: 8 });
 * process.on("SIGTERM", () => worker.stop({ timeoutMs: 10_000 }));
 * await done;
 */
export class Worker {
  private readonly pool: BrokerPool;
  private readonly workerId: string;
  private readonly tracer: Tracer;
  private readonly logger: WorkerLogger | null;
  private readonly runs = new Set<Run>();

  constructor(options: WorkerOptions) {
    this.logger = options.logger === undefined ? consoleLogger : options.logger;
    this.pool = new BrokerPool(resolveClientOptions(options));
    this.workerId = options.workerId ?? `${hostname()}/${process.pid}`;
    this.tracer = casqTracer(options.tracerProvider);
  }

  /**
   * Works on `queue` until {@link stop} (or `options.signal`); resolves when
   * stopped. Rejects with a {@link CasqError} on a failure retrying cannot
   * fix: NOT_FOUND (queue or subscription), INVALID_ARGUMENT, PERMISSION_DENIED,
   * UNAUTHENTICATED. Outages, redirects and broken streams are retried.
   */
  async run(queue: string, handler: JobHandler, options: RunOptions = {}): Promise<void> {
    const run = new Run(this.pool, this.workerId, this.tracer, queue, handler, options, this.logger);
    this.runs.add(run);
    const onAbort = () => void run.stop(options.stopTimeoutMs ?? 30_000);
    options.signal?.addEventListener("abort", onAbort, { once: true });
    if (options.signal?.aborted) onAbort();
    try {
      await run.done;
    } finally {
      options.signal?.removeEventListener("abort", onAbort);
      this.runs.delete(run);
    }
  }

  /**
   * Stops every run gracefully: no more jobs are taken, running handlers get
   * `timeoutMs` (default 30 s) to finish and are acked or nacked; handlers
   * still running then are aborted (`job.signal`) and never acked — their
   * leases expire and the jobs are redelivered.
   */
  async stop(options: StopOptions = {}): Promise<void> {
    await Promise.all([...this.runs].map((run) => run.stop(options.timeoutMs ?? 30_000)));
  }
}
