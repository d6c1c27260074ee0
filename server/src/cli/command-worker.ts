/**
 * The worker behind `casq work`: runs a command for every job of a
 * subscription. The stream protocol — one Work stream per shard leader,
 * credits, heartbeats, redirects, reconnects, settling by unary call when a
 * stream is gone, graceful stop — is the TypeScript SDK's {@link Worker};
 * this layer only turns a job into a process (job-process.ts, job-env.ts)
 * and the process's exit into the handler's outcome (job-verdict.ts): return
 * to ack, throw {@link DeadLetterError} to dead-letter, throw anything else
 * to retry.
 *
 * Before the SDK worker starts, one LookupShards call checks that the broker
 * answers and the queue exists: the SDK retries outages forever, while a CLI
 * that cannot connect at all must fail with the connection exit code.
 *
 * A lease the broker reports lost aborts `job.signal`: the command gets
 * SIGTERM, since someone else may be running the job by now, and its result
 * is dropped (the handler throws; the broker refuses that nack as LEASE_LOST
 * if another delivery owns the message).
 */
import { CasqError, Code, DeadLetterError, type Job, toCasqError, Worker } from "@casq/sdk";
import { ConnectError } from "@connectrpc/connect";
import { CliError } from "./cli-error.ts";
import { type CasqClient, type ClientOptions, describeRpcError } from "./client.ts";
import { jobEnvironment } from "./job-env.ts";
import { type JobProcess, startJobProcess } from "./job-process.ts";
import { jobVerdict } from "./job-verdict.ts";
import { formatMs } from "./output.ts";
import { sdkClientOptions } from "./sdk-connection.ts";

/** What `casq work` was asked to do. */
export interface CommandWorkerConfig {
  /** Queue to work on. */
  readonly queue: string;
  /** Subscription to work for. */
  readonly subscription: string;
  /** Most jobs running at once (1..1000); also the jobs held at once (prefetch). */
  readonly concurrency: number;
  /** Program and arguments run per job. */
  readonly command: readonly string[];
  /** Worker identity recorded in leases. */
  readonly workerId: string;
  /** Exit code of the command that dead-letters the job. */
  readonly deadLetterExitCode: number;
  /** Stop a job's process after this long (milliseconds). */
  readonly jobTimeoutMs?: number;
  /** Lease TTL to ask for (milliseconds); default: the queue's. */
  readonly leaseTtlMs?: number;
  /** Stop after this many jobs (undefined: run until stopped). */
  readonly maxJobs?: number;
  /** Log every job, not only failures. */
  readonly verbose: boolean;
  /** Where log lines go (default: stderr). */
  readonly log?: (line: string) => void;
}

/** Counts of what happened, printed when the worker stops. */
export interface WorkSummary {
  /** Jobs started. */
  started: number;
  /** Settled as done. */
  acked: number;
  /** Given back for a retry. */
  retried: number;
  /** Moved to dead letters (asked for, or the last attempt failed). */
  deadLettered: number;
  /** Lost their lease while running, or were cut short by the worker (result dropped). */
  lost: number;
  /** Results that could not be delivered to any broker. */
  unsettled: number;
}

type Counted = "acked" | "retried" | "deadLettered";

/** Why the handler fails a job: the SDK nacks it for a retry with this message as the reason. */
class JobFailed extends Error {}

/** Longest wait setTimeout takes: a graceful stop waits for running commands without a limit. */
const NO_LIMIT_MS = 2 ** 31 - 1;

/** Runs a command per job of a subscription; see the module header. */
export class CommandWorker {
  /** What happened so far. */
  readonly summary: WorkSummary = {
    started: 0,
    acked: 0,
    retried: 0,
    deadLettered: 0,
    lost: 0,
    unsettled: 0,
  };
  readonly #client: CasqClient;
  readonly #config: CommandWorkerConfig;
  readonly #log: (line: string) => void;
  readonly #worker: Worker;
  readonly #running = new Set<JobProcess>();
  /** What each finished job was counted as, until its settlement fails (if it does). */
  readonly #counted = new WeakMap<Job, Counted>();
  #stopping = false;

  /** `client` is the CLI's connection (for the start-up check); `connection` its flags, given to the SDK. */
  constructor(client: CasqClient, connection: ClientOptions, config: CommandWorkerConfig) {
    this.#client = client;
    this.#config = config;
    this.#log = config.log ?? ((line) => process.stderr.write(`casq work: ${line}\n`));
    // The command logs failures itself (see #onError and the command's verdicts).
    this.#worker = new Worker({ ...sdkClientOptions(connection), workerId: config.workerId, logger: null });
  }

  /** True once a graceful stop was requested. */
  get stopping(): boolean {
    return this.#stopping;
  }

  /** Stops gracefully: no new jobs; running ones finish and are settled; then {@link run} resolves. */
  stop(): void {
    if (this.#stopping) return;
    this.#stopping = true;
    if (this.#running.size > 0)
      this.#log(`stopping: waiting for ${this.#running.size} running job(s) to finish`);
    else this.#log("stopping");
    this.#stopWorker();
  }

  #stopWorker(): void {
    this.#stopping = true;
    // The SDK takes no new job from here on (synchronously); run() resolves once all are settled.
    void this.#worker.stop({ timeoutMs: NO_LIMIT_MS });
  }

  /** Stops at once: kills running jobs (their leases expire and they run again later). */
  kill(): void {
    this.#stopping = true;
    for (const process of this.#running) process.stop(1000);
  }

  /**
   * Works until stopped (or `maxJobs` have started). Resolves when every job
   * has finished and its result was delivered; throws a {@link CliError} when
   * the worker cannot work at all (no connection at start, no such queue or
   * subscription, refused credentials).
   */
  async run(): Promise<WorkSummary> {
    await this.#checkQueue();
    const { queue, subscription, concurrency, leaseTtlMs } = this.#config;
    try {
      await this.#worker.run(queue, (job) => this.#handle(job), {
        subscription,
        concurrency,
        prefetch: concurrency,
        ...(leaseTtlMs !== undefined && { leaseTtlMs }),
        // Stopping is ours: stop() waits for running commands however long they take.
        stopTimeoutMs: NO_LIMIT_MS,
        onError: (error, job) => this.#onError(error, job),
      });
    } catch (error) {
      throw this.#cliError(error);
    }
    if (this.summary.unsettled > 0) {
      this.#log(
        `${this.summary.unsettled} result(s) could not be delivered; those messages run again after their leases expire`,
      );
    }
    return this.summary;
  }

  /** Fails fast (as the CLI's other commands do) when the broker does not answer or the queue is missing. */
  async #checkQueue(): Promise<void> {
    const { queue, subscription, concurrency } = this.#config;
    const server = this.#client.server;
    const routes = await this.#client.call((c, o) => c.queue.lookupShards({ queue }, o));
    this.#log(
      `working on ${queue}/${subscription} via ${server} (${routes.shards.length} shard(s); concurrency ${concurrency}` +
        `${this.#config.leaseTtlMs === undefined ? "" : `, lease ${formatMs(this.#config.leaseTtlMs)}`})`,
    );
    // The SDK opens a stream to every leader; say where the jobs will come from.
    const byLeader = new Map<string, number[]>();
    for (const route of routes.shards) {
      const address = route.leader?.address;
      if (address === undefined || address === "" || address === server) continue;
      byLeader.set(address, [...(byLeader.get(address) ?? []), route.shard]);
    }
    for (const [leader, shards] of byLeader)
      this.#log(`${server} redirects to the leader ${leader} for shard(s) ${shards.join(",")}`);
  }

  async #handle(job: Job): Promise<void> {
    const { maxJobs } = this.#config;
    this.summary.started++;
    if (maxJobs !== undefined && this.summary.started >= maxJobs && !this.#stopping) {
      // Called while the SDK starts this handler, so it starts no further job.
      this.#log(`started ${this.summary.started} job(s) (--max-jobs): finishing, then exiting`);
      this.#stopWorker();
    }
    const label = `job ${job.id} (attempt ${job.attempt}/${job.maxAttempts})`;
    const process = startJobProcess({
      command: this.#config.command,
      stdin: job.payload,
      env: jobEnvironment(job, this.#config.workerId),
      ...(this.#config.jobTimeoutMs !== undefined && { timeoutMs: this.#config.jobTimeoutMs }),
    });
    this.#running.add(process);
    let cutShort = false;
    const onAbort = () => {
      cutShort = true;
      const reason = job.signal.reason;
      const why =
        reason instanceof CasqError && reason.code === Code.Aborted
          ? reason.message.replace(/^casq: /, "")
          : "the worker stopped";
      this.#log(`${label}: ${why}; stopping its process`);
      process.stop();
    };
    job.signal.addEventListener("abort", onAbort, { once: true });
    if (job.signal.aborted) onAbort();
    const exit = await process.exited;
    job.signal.removeEventListener("abort", onAbort);
    this.#running.delete(process);

    if (cutShort) {
      this.summary.lost++;
      this.#log(`${label}: result dropped`);
      throw new JobFailed("lease lost while running; result dropped");
    }
    const verdict = jobVerdict(exit, {
      program: this.#config.command[0] ?? "",
      deadLetterExitCode: this.#config.deadLetterExitCode,
      ...(this.#config.jobTimeoutMs !== undefined && { jobTimeoutMs: this.#config.jobTimeoutMs }),
    });
    if (verdict.kind === "ack") {
      if (this.#config.verbose) this.#log(`${label}: done in ${formatMs(exit.elapsedMs)}`);
      this.#count(job, "acked");
      return;
    }
    // attempt == maxAttempts is the last try (ClaimedMessage.max_attempts): the broker dead-letters its nack.
    const lastAttempt = job.attempt >= job.maxAttempts;
    const next =
      verdict.kind === "dead-letter"
        ? "dead-lettering"
        : lastAttempt
          ? "attempts used up; dead-lettering"
          : "retrying later";
    const took = exit.timedOut ? "" : ` after ${formatMs(exit.elapsedMs)}`;
    this.#log(`${label}: ${verdict.reason.split("\n")[0]}${took}; ${next}`);
    if (verdict.kind === "dead-letter") {
      this.#count(job, "deadLettered");
      throw new DeadLetterError(verdict.reason);
    }
    this.#count(job, lastAttempt ? "deadLettered" : "retried");
    throw new JobFailed(verdict.reason);
  }

  #count(job: Job, as: Counted): void {
    this.summary[as]++;
    this.#counted.set(job, as);
  }

  /** Failures the SDK rides out: logged; a result it could not deliver is uncounted. */
  #onError(error: unknown, job: Job | undefined): void {
    // The handler's own failures were logged when the command ended.
    if (error instanceof JobFailed || error instanceof DeadLetterError) return;
    const text = error instanceof Error ? error.message : String(error);
    if (job === undefined) {
      this.#log(`connection to a broker failed: ${text}; reconnecting`);
      return;
    }
    const counted = this.#counted.get(job);
    if (counted === undefined) return; // a job given back unstarted, or a dropped result
    this.#counted.delete(job);
    this.summary[counted]--;
    this.summary.unsettled++;
    this.#log(`could not deliver the result of job ${job.id}: ${text}`);
  }

  /** The CLI's message and exit code for a failure the SDK gave up on (NOT_FOUND, refused credentials...). */
  #cliError(error: unknown): CliError {
    if (error instanceof CliError) return error;
    const casq = toCasqError(error);
    const connect =
      casq.cause instanceof ConnectError ? casq.cause : new ConnectError(casq.message, casq.code);
    return describeRpcError(connect, this.#client.server, this.#client.tls);
  }
}
