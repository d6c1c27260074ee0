/**
 * The worker behind `casq work`: runs a command for every job of a
 * subscription, over the bidirectional `Work` stream (see
 * proto/casq/v1/work.proto).
 *
 * Flow control: the stream is opened with as many credits as free slots
 * (`concurrency` minus jobs still running from an earlier stream), and one
 * credit is granted back each time a job finishes, so at most `concurrency`
 * jobs run at once.
 *
 * Leases: every running job is heartbeated at the interval the broker
 * announces in Opened (lease TTL / 3), in one batched request. A lease the
 * broker reports lost (leases_lost, or a LOST heartbeat) stops its process:
 * someone else may be running the job by now, so its result is dropped.
 *
 * Results: exit 0 acks; the dead-letter exit code (default 65, EX_DATAERR:
 * "this input is bad, retrying will not help") nacks with dead_letter; any
 * other exit, a signal, a timeout or a failure to start nacks for a retry
 * under the queue's backoff policy. The reason (exit status and the tail of
 * stderr) is kept with the dead letter. Acks and nacks are idempotent per
 * receipt, so a settlement that was not answered before a stream broke is
 * simply sent again on the next stream; one the broker redirects is resent as
 * the unary RPC to the leader.
 *
 * Reconnects: when the stream breaks after it was open (broker restart,
 * draining, network), the worker reconnects with backoff and keeps its
 * running jobs (receipts stay valid across streams); heartbeats go out as
 * unary calls meanwhile. A redirect (UNAVAILABLE with a leader address) moves
 * it to the leader. Failing to connect the very first time is an error.
 *
 * Graceful stop: no more credit; running jobs finish and are settled; then
 * the stream is half-closed and the broker ends it with OK.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { anyUnpack, durationFromMs, durationMs, timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  AckOutcome,
  type ClaimedMessage,
  HeartbeatOutcome,
  LeaderRedirectSchema,
  NackOutcome,
  WorkRequestSchema,
  type WorkResponse,
} from "./api.ts";
import { CliError, ExitCode } from "./cli-error.ts";
import { type CasqClient, describeRpcError, leaderAddressOf } from "./client.ts";
import { type JobExit, type JobProcess, startJobProcess } from "./job-process.ts";
import { formatMs } from "./output.ts";
import { RequestQueue } from "./request-queue.ts";

/** What `casq work` was asked to do. */
export interface CommandWorkerConfig {
  /** Queue to work on. */
  readonly queue: string;
  /** Subscription to work for. */
  readonly subscription: string;
  /** Most jobs running at once (1..1000). */
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
  /** Moved to dead letters. */
  deadLettered: number;
  /** Lost their lease before they were settled (result dropped). */
  lost: number;
  /** Results that could not be delivered to any broker. */
  unsettled: number;
}

interface RunningJob {
  readonly job: ClaimedMessage;
  readonly process: JobProcess;
  lost: boolean;
}

interface Settlement {
  readonly receipt: string;
  readonly messageId: string;
  readonly kind: "ack" | "retry" | "dead-letter";
  readonly reason: string;
  /** Request id of the send on the current stream, if sent. */
  requestId?: bigint;
}

interface StreamState {
  readonly address: string;
  readonly requests: RequestQueue<MessageInitShape<typeof WorkRequestSchema>>;
  readonly abort: AbortController;
  opened: boolean;
  credit: number;
  draining: boolean;
  halfClosed: boolean;
  readonly pending: Map<bigint, { kind: "settle"; settlement: Settlement } | { kind: "heartbeat" }>;
}

const RECONNECT_MIN_MS = 250;
const RECONNECT_MAX_MS = 10_000;

/** Runs a command per job of a subscription; see the module header. */
export class CommandWorker {
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
  readonly #running = new Map<string, RunningJob>();
  readonly #unsettled = new Map<string, Settlement>();
  #address: string;
  #stream: StreamState | undefined;
  #stopping = false;
  #nextRequestId = 1n;
  #heartbeatMs = 20_000;
  #heartbeatTimer: NodeJS.Timeout | undefined;
  #wake: (() => void) | undefined;
  readonly #settling = new Set<Promise<void>>();
  #streamWasOpened = false;

  constructor(client: CasqClient, config: CommandWorkerConfig) {
    this.#client = client;
    this.#config = config;
    this.#address = client.server;
    this.#log = config.log ?? ((line) => process.stderr.write(`casq work: ${line}\n`));
    if (config.leaseTtlMs !== undefined) this.#heartbeatMs = Math.max(50, Math.floor(config.leaseTtlMs / 3));
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
    this.#maybeHalfClose();
    this.#wake?.();
  }

  /** Stops at once: kills running jobs (their leases expire and they run again later). */
  kill(): void {
    this.#stopping = true;
    for (const running of this.#running.values()) running.process.stop(1000);
    this.#stream?.abort.abort();
    this.#wake?.();
  }

  /**
   * Works until stopped (or `maxJobs` are done). Resolves when every job has
   * finished and its result was delivered; throws a {@link CliError} when the
   * worker cannot work at all (no connection at start, no such queue).
   */
  async run(): Promise<WorkSummary> {
    this.#heartbeatTimer = setInterval(() => this.#heartbeat(), this.#heartbeatMs);
    let everOpened = false;
    let failures = 0;
    let redirects = 0;
    let fatal: CliError | undefined;
    try {
      for (;;) {
        if (this.#stopping && this.#running.size === 0 && this.#unsettled.size === 0) break;
        if (fatal !== undefined && this.#running.size === 0) break;
        // Nothing left but results to deliver, and the broker is not answering: unary calls below.
        if (this.#stopping && this.#running.size === 0 && failures > 0) break;
        if (fatal !== undefined) {
          await this.#sleep(500);
          continue;
        }
        const address = this.#address;
        const outcome = await this.#session(address);
        if (this.#streamWasOpened) {
          everOpened = true;
          failures = 0;
          redirects = 0;
        }
        if (outcome.ok) {
          if (this.#stopping && this.#running.size === 0 && this.#unsettled.size === 0) break;
          if (!this.#stopping) {
            failures++;
            this.#log(`${address} ended the stream; reconnecting`);
            await this.#sleep(this.#backoff(failures));
          }
          continue;
        }
        const error = outcome.error;
        if (error instanceof ConnectError && error.code === Code.Canceled && this.#stopping) break;
        const leader = leaderAddressOf(error);
        if (leader !== undefined && leader !== address) {
          redirects++;
          this.#log(`${address} redirects to the leader ${leader}`);
          this.#address = leader;
          if (redirects > 3) await this.#sleep(this.#backoff(redirects - 3));
          continue;
        }
        const described = describeRpcError(error, address, this.#client.tls);
        if (!everOpened) throw described;
        if (described.exitCode === ExitCode.notFound || described.exitCode === ExitCode.usage) {
          this.#log(`${described.message}; finishing running jobs, then exiting`);
          fatal = described;
          continue;
        }
        failures++;
        const wait = this.#backoff(failures);
        this.#log(`stream to ${address} ended: ${described.message}; reconnecting in ${formatMs(wait)}`);
        if (this.#address !== this.#client.server && failures >= 3) this.#address = this.#client.server;
        await this.#sleep(wait);
      }
      if (this.#unsettled.size > 0) await this.#settleUnary();
    } finally {
      clearInterval(this.#heartbeatTimer);
      await Promise.allSettled([...this.#settling]);
    }
    if (this.#unsettled.size > 0) {
      this.summary.unsettled += this.#unsettled.size;
      this.#log(
        `${this.#unsettled.size} result(s) could not be delivered; those messages run again after their leases expire`,
      );
      this.#unsettled.clear();
    }
    if (fatal !== undefined) throw fatal;
    return this.summary;
  }

  #backoff(failures: number): number {
    const base = Math.min(RECONNECT_MAX_MS, RECONNECT_MIN_MS * 2 ** Math.min(failures - 1, 10));
    return Math.round(base * (0.8 + Math.random() * 0.4));
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      function done() {
        clearTimeout(timer);
        resolve();
      }
      this.#wake = () => {
        this.#wake = undefined;
        done();
      };
    });
  }

  /** Free slots that may be granted as credit now. */
  #wantedCredit(current: number): number {
    if (this.#stopping) return 0;
    let want = this.#config.concurrency - this.#running.size;
    if (this.#config.maxJobs !== undefined)
      want = Math.min(want, this.#config.maxJobs - this.summary.started);
    return Math.max(0, Math.min(1000, want) - current);
  }

  async #session(address: string): Promise<{ ok: true } | { ok: false; error: unknown }> {
    this.#streamWasOpened = false;
    const requests = new RequestQueue<MessageInitShape<typeof WorkRequestSchema>>();
    const state: StreamState = {
      address,
      requests,
      abort: new AbortController(),
      opened: false,
      credit: 0,
      draining: false,
      halfClosed: false,
      pending: new Map(),
    };
    const credits = this.#wantedCredit(0);
    state.credit = credits;
    requests.push({
      requestId: 0n,
      command: {
        case: "open",
        value: {
          queue: this.#config.queue,
          subscription: this.#config.subscription,
          workerId: this.#config.workerId,
          credits,
          ...(this.#config.leaseTtlMs !== undefined && { leaseTtl: durationFromMs(this.#config.leaseTtlMs) }),
        },
      },
    });
    this.#stream = state;
    try {
      const responses = this.#client.clients(address).queue.work(requests, { signal: state.abort.signal });
      for await (const response of responses) this.#handle(state, response);
      return { ok: true };
    } catch (error) {
      return { ok: false, error };
    } finally {
      this.#stream = undefined;
      requests.end();
      // Whatever was sent but not answered is sent again on the next stream (idempotent per receipt).
      for (const settlement of this.#unsettled.values()) delete settlement.requestId;
    }
  }

  #send(state: StreamState, command: MessageInitShape<typeof WorkRequestSchema>["command"]): bigint {
    const requestId = this.#nextRequestId++;
    state.requests.push(create(WorkRequestSchema, { requestId, command }));
    return requestId;
  }

  #handle(state: StreamState, response: WorkResponse): void {
    const event = response.event;
    switch (event.case) {
      case "opened": {
        state.opened = true;
        this.#streamWasOpened = true;
        const opened = event.value;
        const interval = opened.heartbeatInterval === undefined ? 0 : durationMs(opened.heartbeatInterval);
        if (interval > 0 && interval !== this.#heartbeatMs) {
          this.#heartbeatMs = interval;
          clearInterval(this.#heartbeatTimer);
          this.#heartbeatTimer = setInterval(() => this.#heartbeat(), interval);
        }
        const shards = opened.routing?.servingShards.join(",") ?? "?";
        const lease = opened.leaseTtl === undefined ? "?" : formatMs(durationMs(opened.leaseTtl));
        this.#log(
          `working on ${opened.queue}/${opened.subscription} at ${state.address} (shards ${shards}; ` +
            `concurrency ${this.#config.concurrency}, lease ${lease}, heartbeat every ${formatMs(this.#heartbeatMs)})`,
        );
        const total = opened.routing?.shards.length ?? 0;
        const serving = opened.routing?.servingShards.length ?? 0;
        if (total > serving) {
          this.#log(
            `note: shards not led by ${state.address} are not worked on by this stream (${serving}/${total})`,
          );
        }
        for (const settlement of this.#unsettled.values()) {
          if (settlement.requestId === undefined) this.#sendSettlement(state, settlement);
        }
        this.#maybeHalfClose();
        return;
      }
      case "job":
        state.credit = Math.max(0, state.credit - 1);
        this.#startJob(event.value);
        return;
      case "leasesLost":
        for (const receipt of event.value.receipts) this.#leaseLost(receipt, event.value.reason);
        return;
      case "heartbeated":
        state.pending.delete(response.requestId);
        for (const result of event.value.results) {
          if (result.outcome === HeartbeatOutcome.LOST)
            this.#leaseLost(result.receipt, "heartbeat: lease lost");
        }
        return;
      case "acked": {
        const entry = state.pending.get(response.requestId);
        state.pending.delete(response.requestId);
        if (entry?.kind !== "settle") return;
        const outcome = event.value.results[0]?.outcome;
        this.#settled(entry.settlement, outcome === AckOutcome.LEASE_LOST ? "lost" : "acked");
        return;
      }
      case "nacked": {
        const entry = state.pending.get(response.requestId);
        state.pending.delete(response.requestId);
        if (entry?.kind !== "settle") return;
        const outcome = event.value.results[0]?.outcome;
        this.#settled(
          entry.settlement,
          outcome === NackOutcome.DEAD_LETTERED
            ? "dead"
            : outcome === NackOutcome.LEASE_LOST
              ? "lost"
              : "retried",
        );
        return;
      }
      case "requestFailed": {
        const entry = state.pending.get(response.requestId);
        state.pending.delete(response.requestId);
        const status = event.value.status;
        let leader: string | undefined;
        for (const detail of status?.details ?? []) {
          const redirect = anyUnpack(detail, LeaderRedirectSchema);
          if (redirect !== undefined && redirect.leaderAddress !== "") leader = redirect.leaderAddress;
        }
        if (entry?.kind === "settle") {
          this.#settleViaUnary(entry.settlement, leader, status?.message ?? "request failed");
        }
        return;
      }
      case "routing":
        return;
      case "draining":
        state.draining = true;
        this.#log(`${state.address} is shutting down: no new jobs from it; will reconnect`);
        return;
      default:
        return;
    }
  }

  #startJob(job: ClaimedMessage): void {
    const message = job.message;
    const env: Record<string, string> = {
      CASQ_QUEUE: message?.queue ?? this.#config.queue,
      CASQ_SUBSCRIPTION: job.subscription,
      CASQ_MESSAGE_ID: message?.id ?? "",
      CASQ_RECEIPT: job.receipt,
      CASQ_ATTEMPT: String(job.attempt),
      CASQ_MAX_ATTEMPTS: String(job.maxAttempts),
      CASQ_SHARD: String(message?.shard ?? 0),
      CASQ_OFFSET: String(message?.offset ?? 0n),
      CASQ_KEY: message?.key ?? "",
      CASQ_PRIORITY: String(message?.priority ?? 0),
      CASQ_DEDUP_ID: message?.dedupId ?? "",
      CASQ_HEADERS: JSON.stringify(message?.headers ?? {}),
      CASQ_ENQUEUED_AT:
        message?.enqueuedAt === undefined ? "" : timestampDate(message.enqueuedAt).toISOString(),
      CASQ_LEASE_DEADLINE:
        job.leaseDeadline === undefined ? "" : timestampDate(job.leaseDeadline).toISOString(),
      CASQ_WORKER_ID: this.#config.workerId,
    };
    if (message?.traceContext?.traceparent) env.TRACEPARENT = message.traceContext.traceparent;
    if (message?.traceContext?.tracestate) env.TRACESTATE = message.traceContext.tracestate;
    const process = startJobProcess({
      command: this.#config.command,
      stdin: message?.payload ?? new Uint8Array(),
      env,
      ...(this.#config.jobTimeoutMs !== undefined && { timeoutMs: this.#config.jobTimeoutMs }),
    });
    const running: RunningJob = { job, process, lost: false };
    this.#running.set(job.receipt, running);
    this.summary.started++;
    void process.exited.then((exit) => this.#finished(running, exit));
  }

  #finished(running: RunningJob, exit: JobExit): void {
    const { job } = running;
    this.#running.delete(job.receipt);
    const id = job.message?.id ?? "?";
    const label = `job ${id} (attempt ${job.attempt}/${job.maxAttempts})`;
    if (running.lost) {
      this.summary.lost++;
      this.#log(`${label}: lease lost while running; result dropped`);
    } else {
      const settlement = this.#settlementFor(job, exit);
      if (settlement.kind === "ack") {
        if (this.#config.verbose) this.#log(`${label}: done in ${formatMs(exit.elapsedMs)}`);
      } else {
        const next = settlement.kind === "dead-letter" ? "dead-lettering" : "retrying later";
        const took = exit.timedOut ? "" : ` after ${formatMs(exit.elapsedMs)}`;
        this.#log(`${label}: ${settlement.reason.split("\n")[0]}${took}; ${next}`);
      }
      this.#unsettled.set(settlement.receipt, settlement);
      const stream = this.#stream;
      if (stream?.opened && !stream.halfClosed) this.#sendSettlement(stream, settlement);
    }
    this.#topUpCredit();
    if (
      this.#config.maxJobs !== undefined &&
      this.summary.started >= this.#config.maxJobs &&
      this.#running.size === 0 &&
      !this.#stopping
    ) {
      this.#log(`done ${this.summary.started} job(s) (--max-jobs)`);
      this.stop();
    }
    this.#maybeHalfClose();
  }

  #settlementFor(job: ClaimedMessage, exit: JobExit): Settlement {
    const base = { receipt: job.receipt, messageId: job.message?.id ?? "" };
    const tail = exit.stderrTail.trim();
    const withTail = (reason: string) => (tail === "" ? reason : `${reason}; stderr: ${tail}`).slice(0, 2048);
    if (exit.spawnError !== undefined) {
      return {
        ...base,
        kind: "retry",
        reason: `cannot run ${this.#config.command[0]}: ${exit.spawnError.message}`,
      };
    }
    if (exit.timedOut) {
      return {
        ...base,
        kind: "retry",
        reason: withTail(`timed out after ${formatMs(this.#config.jobTimeoutMs ?? 0)}`),
      };
    }
    if (exit.code === 0) return { ...base, kind: "ack", reason: "" };
    if (exit.code === this.#config.deadLetterExitCode) {
      return {
        ...base,
        kind: "dead-letter",
        reason: withTail(`exit code ${exit.code} (dead-letter requested)`),
      };
    }
    if (exit.code !== null) return { ...base, kind: "retry", reason: withTail(`exit code ${exit.code}`) };
    return { ...base, kind: "retry", reason: withTail(`killed by ${exit.signal ?? "a signal"}`) };
  }

  #sendSettlement(state: StreamState, settlement: Settlement): void {
    const receipts = [settlement.receipt];
    const requestId =
      settlement.kind === "ack"
        ? this.#send(state, { case: "ack", value: { receipts } })
        : this.#send(state, {
            case: "nack",
            value: { receipts, deadLetter: settlement.kind === "dead-letter", reason: settlement.reason },
          });
    settlement.requestId = requestId;
    state.pending.set(requestId, { kind: "settle", settlement });
  }

  #settled(settlement: Settlement, outcome: "acked" | "retried" | "dead" | "lost"): void {
    if (!this.#unsettled.delete(settlement.receipt)) return;
    switch (outcome) {
      case "acked":
        this.summary.acked++;
        break;
      case "retried":
        this.summary.retried++;
        break;
      case "dead":
        this.summary.deadLettered++;
        if (settlement.kind !== "dead-letter")
          this.#log(`job ${settlement.messageId}: attempts used up; dead-lettered`);
        break;
      case "lost":
        this.summary.lost++;
        this.#log(
          `job ${settlement.messageId}: lease was lost before the result arrived; another delivery owns it`,
        );
        break;
    }
    this.#maybeHalfClose();
  }

  /** Resends a settlement as the unary RPC (to `leader` when given, else following redirects from --server). */
  #settleViaUnary(settlement: Settlement, leader: string | undefined, why: string): void {
    const call = async () => {
      const { queue, subscription } = this.#config;
      const receipts = [settlement.receipt];
      const run = async (clients: ReturnType<CasqClient["clients"]>, o: { timeoutMs: number }) => {
        if (settlement.kind === "ack") {
          const r = await clients.queue.ack({ queue, subscription, receipts }, o);
          return r.results[0]?.outcome === AckOutcome.LEASE_LOST ? "lost" : "acked";
        }
        const r = await clients.queue.nack(
          {
            queue,
            subscription,
            receipts,
            deadLetter: settlement.kind === "dead-letter",
            reason: settlement.reason,
          },
          o,
        );
        const outcome = r.results[0]?.outcome;
        return outcome === NackOutcome.DEAD_LETTERED
          ? "dead"
          : outcome === NackOutcome.LEASE_LOST
            ? "lost"
            : "retried";
      };
      try {
        const outcome =
          leader !== undefined
            ? await run(this.#client.clients(leader), { timeoutMs: this.#client.timeoutMs })
            : await this.#client.call(run);
        this.#settled(settlement, outcome);
      } catch (error) {
        const message =
          error instanceof CliError ? error.message : describeRpcError(error, leader ?? "", false).message;
        this.#log(`could not deliver the result of job ${settlement.messageId} (${why}): ${message}`);
        if (this.#unsettled.delete(settlement.receipt)) this.summary.unsettled++;
        this.#maybeHalfClose();
      }
    };
    const promise = call().finally(() => this.#settling.delete(promise));
    this.#settling.add(promise);
  }

  /** Delivers every remaining result with unary calls (used when the stream is gone for good). */
  async #settleUnary(): Promise<void> {
    for (const settlement of this.#unsettled.values())
      this.#settleViaUnary(settlement, undefined, "no stream");
    await Promise.allSettled([...this.#settling]);
  }

  #leaseLost(receipt: string, reason: string): void {
    const running = this.#running.get(receipt);
    if (running === undefined || running.lost) return;
    running.lost = true;
    this.#log(`job ${running.job.message?.id ?? "?"}: ${reason || "lease lost"}; stopping its process`);
    running.process.stop();
  }

  #topUpCredit(): void {
    const state = this.#stream;
    if (state === undefined || !state.opened || state.draining || state.halfClosed) return;
    const want = this.#wantedCredit(state.credit);
    if (want <= 0) return;
    state.credit += want;
    state.requests.push(create(WorkRequestSchema, { command: { case: "credit", value: { credits: want } } }));
  }

  #maybeHalfClose(): void {
    const state = this.#stream;
    if (state === undefined || state.halfClosed || !this.#stopping) return;
    if (this.#running.size > 0) return;
    if (state.opened && [...this.#unsettled.values()].some((s) => s.requestId === undefined)) return;
    if (state.pending.size > 0 && [...state.pending.values()].some((p) => p.kind === "settle")) return;
    state.halfClosed = true;
    if (!state.opened) {
      state.abort.abort();
      return;
    }
    state.requests.end();
  }

  #heartbeat(): void {
    const receipts = [...this.#running.values()].filter((r) => !r.lost).map((r) => r.job.receipt);
    if (receipts.length === 0) return;
    const state = this.#stream;
    if (state?.opened && !state.halfClosed) {
      for (let i = 0; i < receipts.length; i += 1000) {
        const requestId = this.#send(state, {
          case: "heartbeat",
          value: { receipts: receipts.slice(i, i + 1000) },
        });
        state.pending.set(requestId, { kind: "heartbeat" });
      }
      return;
    }
    // No stream right now: keep the leases alive with the unary call.
    const { queue, subscription, workerId } = this.#config;
    const promise = this.#client
      .call((c, o) => c.queue.heartbeat({ queue, subscription, workerId, receipts }, o))
      .then((response) => {
        for (const result of response.results) {
          if (result.outcome === HeartbeatOutcome.LOST)
            this.#leaseLost(result.receipt, "heartbeat: lease lost");
        }
      })
      .catch(() => {})
      .finally(() => this.#settling.delete(promise));
    this.#settling.add(promise);
  }
}
