/**
 * Running handlers, the executor of a run: held jobs wait in arrival order
 * and start while fewer than `concurrency` handlers run (over all streams
 * together); each runs inside an OpenTelemetry `process <queue>` span, and
 * its end (resolved, threw, threw {@link DeadLetterError}) goes to the
 * settler as an ack or a nack.
 */
import type { Tracer } from "@opentelemetry/api";
import { DeadLetterError } from "../errors.ts";
import type { Job } from "../job.ts";
import { runInProcessSpan } from "../tracing.ts";
import type { Held } from "./held-job.ts";
import type { Reporter } from "./reporter.ts";
import type { Outcome, Settler } from "./settler.ts";

/** Handles one job. Resolve: ack. Throw: nack (retry with the queue's backoff). Throw {@link DeadLetterError}: dead-letter. */
export type JobHandler = (job: Job) => Promise<void> | void;

/** What an {@link Executor} works with. */
export interface ExecutorOptions {
  readonly tracer: Tracer;
  readonly handler: JobHandler;
  /** The run's subscription ("" for the default), named in the span when the job does not name its own. */
  readonly subscription: string;
  /** Handlers running at once, at least 1. */
  readonly concurrency: number;
  readonly reporter: Reporter;
  readonly settler: Settler;
  /** True once the run stops: no more handlers start. */
  readonly stopping: () => boolean;
  /** A handler started with `buffered` jobs still waiting behind it (for the credit windows). */
  readonly started?: (buffered: number) => void;
  /** Fewer than `concurrency` handlers run and no job waits: the handlers are starved. */
  readonly starved?: () => void;
}

/** Runs the handler over held jobs, at most `concurrency` at once, and hands each outcome to the settler. */
export class Executor {
  private readonly waiting: Held[] = [];
  private runningCount = 0;
  private readonly tracer: Tracer;
  private readonly handler: JobHandler;
  private readonly subscription: string;
  private readonly concurrency: number;
  private readonly reporter: Reporter;
  private readonly settler: Settler;
  private readonly stopping: () => boolean;
  private readonly started: (buffered: number) => void;
  private readonly starved: () => void;

  /** An executor for one run. */
  constructor(options: ExecutorOptions) {
    this.tracer = options.tracer;
    this.handler = options.handler;
    this.subscription = options.subscription;
    this.concurrency = options.concurrency;
    this.reporter = options.reporter;
    this.settler = options.settler;
    this.stopping = options.stopping;
    this.started = options.started ?? (() => {});
    this.starved = options.starved ?? (() => {});
  }

  /** Handlers running now (abandoned ones included until they return). */
  get running(): number {
    return this.runningCount;
  }

  /** Queues a job that arrived and starts handlers while there is room. */
  enqueue(held: Held): void {
    this.waiting.push(held);
    this.pump();
  }

  /** Takes a job that has not started out of the queue (its lease was lost). */
  withdraw(held: Held): void {
    const index = this.waiting.indexOf(held);
    if (index >= 0) this.waiting.splice(index, 1);
  }

  /** Empties the queue (the run stops): the jobs that had not started. */
  takeWaiting(): Held[] {
    return this.waiting.splice(0);
  }

  private pump(): void {
    if (this.stopping()) return;
    while (this.runningCount < this.concurrency && this.waiting.length > 0) {
      const held = this.waiting.shift() as Held;
      held.started = true;
      this.runningCount++;
      this.started(this.waiting.length);
      void this.execute(held);
    }
    if (this.runningCount < this.concurrency) this.starved();
  }

  private async execute(held: Held): Promise<void> {
    let outcome: Outcome;
    try {
      const subscription = held.job.subscription || this.subscription || "default";
      await runInProcessSpan(this.tracer, held.job, subscription, this.handler);
      outcome = { kind: "ack" };
    } catch (error) {
      outcome = {
        kind: "nack",
        deadLetter: error instanceof DeadLetterError,
        reason: error instanceof Error ? error.message : String(error),
      };
      if (!held.abandoned) {
        this.reporter.logHandlerFailure(error, held.job);
        this.reporter.notify(error, held.job);
      }
    }
    this.runningCount--;
    if (held.abandoned) return; // stopped hard: the lease expires and the job is redelivered
    // The slot is free once the handler finished: the next job starts now, not
    // after this one's ack is durable (a whole commit later on a slow store).
    const settled = this.settler.complete(held, outcome);
    this.pump();
    await settled;
  }
}
