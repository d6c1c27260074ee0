/**
 * Where a run's failures go: the worker's logger (one line each, with the
 * job's id, queue and attempt for structured loggers) and the run's
 * `onError` callback. A failing logger or callback never fails a job.
 */
import { DeadLetterError } from "../errors.ts";
import type { Job } from "../job.ts";

/**
 * Where a `Worker` logs failures: any object with `warn` and `error`
 * (the `console`, or an adapter to your logger). `details` carries the job's
 * id, queue, attempt and the error, for structured loggers.
 */
export interface WorkerLogger {
  /** A failure casq retries: a handler that threw (the job comes again), a broken stream, a lost lease. */
  warn(message: string, details?: Record<string, unknown>): void;
  /** A failure that loses work: a job dead-lettered by its handler's failure, a result that could not be stored. */
  error(message: string, details?: Record<string, unknown>): void;
}

/** The default {@link WorkerLogger}: one line per failure on stderr (`console.warn` / `console.error`). */
export const consoleLogger: WorkerLogger = {
  warn: (message) => console.warn(message),
  error: (message) => console.error(message),
};

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** Reports one run's failures to its logger and its `onError`. */
export class Reporter {
  /** Reports for `queue` to `logger` (`null`: log nothing) and to `options.onError`. */
  constructor(
    private readonly queue: string,
    private readonly logger: WorkerLogger | null,
    private readonly options: { readonly onError?: (error: unknown, job?: Job) => void },
  ) {}

  /** Logs a failure (of `job`, if given) at `level` and passes it to `onError`. */
  report(error: unknown, job?: Job, level: "warn" | "error" = "warn"): void {
    this.log(
      level,
      `casq: ${job ? `job ${job.id} of queue ${this.queue}: ` : ""}${messageOf(error)}`,
      error,
      job,
    );
    this.notify(error, job);
  }

  /** Calls `onError`; its own failure is not ours to handle. */
  notify(error: unknown, job?: Job): void {
    try {
      this.options.onError?.(error, job);
    } catch {
      // the callback's own failure is not ours to handle
    }
  }

  private log(level: "warn" | "error", message: string, error: unknown, job?: Job): void {
    try {
      this.logger?.[level](message, {
        queue: this.queue,
        ...(job ? { jobId: job.id, attempt: job.attempt } : {}),
        error,
      });
    } catch {
      // a failing logger must not fail the job
    }
  }

  /** Logs a handler's failure: what happens to the job next. */
  logHandlerFailure(error: unknown, job: Job): void {
    const deadLetter =
      error instanceof DeadLetterError || (job.maxAttempts > 0 && job.attempt >= job.maxAttempts);
    const attempts =
      job.maxAttempts > 0 ? `attempt ${job.attempt} of ${job.maxAttempts}` : `attempt ${job.attempt}`;
    this.log(
      deadLetter ? "error" : "warn",
      `casq: job ${job.id} of queue ${this.queue} failed (${attempts}), ` +
        `${deadLetter ? "dead-lettered" : "will be retried"}: ${messageOf(error)}`,
      error,
      job,
    );
  }
}
