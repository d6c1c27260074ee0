/**
 * The worker: `worker.run(queue, handler)` over `QueueService.Work`
 * bidirectional streams — one per broker that leads shards of the queue —
 * with credits (prefetch per stream), heartbeats, ack / nack / dead-letter by
 * the handler's outcome, lost-lease signalling, reconnects with backoff that
 * follow redirects, and graceful shutdown.
 */

import { hostname } from "node:os";
import { durationFromMs, durationMs } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import type { Tracer, TracerProvider } from "@opentelemetry/api";
import { type ClientOptions, resolveClientOptions } from "./client-options.ts";
import {
  CasqError,
  DeadLetterError,
  isRetryable,
  RedirectError,
  type SettleOperation,
  toCasqError,
} from "./errors.ts";
import { callWithFailover, retryDelayMs, sleep } from "./failover.ts";
import {
  type AckResult,
  HeartbeatOutcome,
  type HeartbeatResult,
  type NackResult,
} from "./gen/casq/v1/message_pb.ts";
import { QueueService } from "./gen/casq/v1/queue_service_pb.ts";
import type { WorkResponse } from "./gen/casq/v1/work_pb.ts";
import { type Job, jobFromClaim } from "./job.ts";
import { settleError } from "./settle-outcome.ts";
import { casqTracer, runInProcessSpan } from "./tracing.ts";
import { BrokerPool } from "./transport.ts";
import { type Command, Session, StreamClosedError } from "./work-session.ts";

/** Handles one job. Resolve: ack. Throw: nack (retry with the queue's backoff). Throw {@link DeadLetterError}: dead-letter. */
export type JobHandler = (job: Job) => Promise<void> | void;

/**
 * Where a {@link Worker} logs failures: any object with `warn` and `error`
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

/** Options of {@link Worker.run}. */
export interface RunOptions {
  /** Subscription (consumer group). Default "default". */
  readonly subscription?: string;
  /** Handlers running at once. Default 1. */
  readonly concurrency?: number;
  /** Jobs held at once (running + waiting), ≥ concurrency, ≤ 1000. Default = concurrency. */
  readonly prefetch?: number;
  /** Lease length of each job, 100 ms..24 h. Default: the queue's (60 s). */
  readonly leaseTtlMs?: number;
  /** Aborting it stops the run gracefully (as `stop()` with `stopTimeoutMs`). */
  readonly signal?: AbortSignal;
  /** Grace period for running handlers when `signal` aborts. Default 30 000 ms. */
  readonly stopTimeoutMs?: number;
  /** Called with failures that do not end the run: handler errors, failed acks, broken streams. */
  readonly onError?: (error: unknown, job?: Job) => void;
}

/** Options of {@link Worker.stop}. */
export interface StopOptions {
  /** How long to wait for running handlers before aborting them. Default 30 000 ms. */
  readonly timeoutMs?: number;
}

/** A held job. */
interface Held {
  readonly job: Job;
  readonly controller: AbortController;
  /** The stream that delivered it: its ack, nack and heartbeats go there while that stream is usable. */
  readonly session: Session;
  /**
   * The stream that gets this job's credit back when the job is done: the one
   * that delivered it, or, once that one ended, a stream opened since (which
   * opened with that much less credit).
   */
  creditTo: Session;
  /** Its credit went back (when its handler finished, before the ack is answered). */
  creditReturned: boolean;
  started: boolean;
  settled: boolean;
  abandoned: boolean;
}

const FATAL = new Set<Code>([
  Code.NotFound,
  Code.InvalidArgument,
  Code.PermissionDenied,
  Code.Unauthenticated,
  Code.FailedPrecondition,
]);

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/**
 * One `run()`: its Work streams, held jobs and handlers.
 *
 * A broker's stream delivers jobs only from the shards that broker leads, so
 * the run keeps one stream per shard leader:
 *
 * - The **primary** stream goes to the preferred broker; {@link loop}
 *   reconnects it with backoff and follows its redirects, as a one-stream
 *   worker would.
 * - Every `opened` / `routing` event tells which shards the stream serves and
 *   who leads every shard. A shard that no open stream serves and whose
 *   leader is known names a broker; {@link reconcile} opens a **secondary**
 *   stream there unless one is open or opening. A secondary that ends is
 *   dropped (no reconnect loop of its own); the routing of the streams still
 *   open, or the leader its redirect named, opens it again when still
 *   needed, after a backoff per address.
 * - Each stream opens with `prefetch` credits (less the jobs of ended streams
 *   it takes over) and gets a credit back when a job it delivered is done:
 *   when its handler finished (its ack or nack then rides with the next
 *   claims, instead of holding a slot for a commit), or when it is dropped
 *   unstarted. `concurrency` bounds the handlers of all streams together.
 */
class Run {
  /** Streams open or opening (closed ones are removed as they end). */
  private readonly sessions = new Set<Session>();
  private readonly held = new Map<string, Held>();
  private readonly waiting: Held[] = [];
  private running = 0;
  private stopping = false;
  private readonly stopController = new AbortController();
  private heartbeatTimer: NodeJS.Timeout | undefined;
  private heartbeatMs = 0;
  private readonly idleWaiters: (() => void)[] = [];
  private readonly settles = new Set<Promise<void>>();
  private readonly subscription: string;
  private readonly concurrency: number;
  private readonly prefetch: number;
  /** Failures of the primary stream since it last opened. */
  private failures = 0;
  /** Brokers whose primary stream broke (not drained, not redirected) since the last open. */
  private readonly failed = new Set<string>();
  /** Secondary streams that ended: how often in a row, and not to be reopened before when. */
  private readonly secondaryRetry = new Map<string, { failures: number; notBefore: number }>();
  /** Leaders named by redirects of secondary streams, still to be tried. */
  private readonly redirectHints = new Set<string>();
  private reconcileTimer: NodeJS.Timeout | undefined;
  private reconcileAt = 0;
  done: Promise<void>;

  constructor(
    private readonly pool: BrokerPool,
    private readonly workerId: string,
    private readonly tracer: Tracer,
    private readonly queue: string,
    private readonly handler: JobHandler,
    private readonly options: RunOptions,
    private readonly logger: WorkerLogger | null,
  ) {
    this.subscription = options.subscription ?? "";
    this.concurrency = Math.max(1, Math.floor(options.concurrency ?? 1));
    this.prefetch = Math.min(
      1000,
      Math.max(this.concurrency, Math.floor(options.prefetch ?? this.concurrency)),
    );
    this.done = this.loop().finally(async () => {
      this.clearHeartbeat();
      this.clearReconcile();
      // The run is over once every stream is: secondaries end with the half-close of the stop.
      await Promise.allSettled([...this.sessions].map((s) => s.ended));
    });
  }

  private report(error: unknown, job?: Job, level: "warn" | "error" = "warn"): void {
    this.log(
      level,
      `casq: ${job ? `job ${job.id} of queue ${this.queue}: ` : ""}${messageOf(error)}`,
      error,
      job,
    );
    this.notify(error, job);
  }

  /** Calls `onError`; its own failure is not ours to handle. */
  private notify(error: unknown, job?: Job): void {
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
  private logHandlerFailure(error: unknown, job: Job): void {
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

  /** The open (or opening) stream to `address`, if any. */
  private sessionAt(address: string, includeDraining = false): Session | undefined {
    for (const session of this.sessions)
      if (session.address === address && !session.closed && (includeDraining || !session.draining))
        return session;
    return undefined;
  }

  /** Opens a Work stream to `address`; {@link sessionEnded} runs when it ends. */
  private startSession(address: string): Session {
    // Stream requests get the deadline of a unary attempt.
    const session = new Session(address, this.pool.options.timeoutMs);
    // Jobs of streams that ended give their credit to this one, so the worker
    // holds no more than before the other stream ended.
    let adopted = 0;
    for (const held of this.held.values()) {
      if (adopted >= this.prefetch) break;
      if (held.creditTo.closed && !held.creditReturned) {
        held.creditTo = session;
        adopted++;
      }
    }
    this.sessions.add(session);
    session.ended = this.consume(session, this.prefetch - adopted);
    session.ended.then(
      () => this.sessionEnded(session, undefined),
      (thrown: unknown) => this.sessionEnded(session, thrown),
    );
    return session;
  }

  private async consume(session: Session, credits: number): Promise<void> {
    const responses = this.pool
      .client(QueueService, session.address)
      .work(session.requests, { signal: session.abort.signal });
    session.send({
      case: "open",
      value: {
        queue: this.queue,
        subscription: this.subscription,
        workerId: this.workerId,
        credits,
        ...(this.options.leaseTtlMs === undefined
          ? {}
          : { leaseTtl: durationFromMs(this.options.leaseTtlMs) }),
      },
    });
    try {
      for await (const response of responses) this.onResponse(session, response);
    } catch (thrown) {
      // Broken by us (an unanswered request): say that, not "aborted".
      throw session.brokenBy ?? thrown;
    }
    if (session.brokenBy) throw session.brokenBy;
  }

  /** A stream ended: fails its open requests; a secondary is dropped and its broker retried later if still needed. */
  private sessionEnded(session: Session, thrown: unknown): void {
    session.close(
      thrown === undefined
        ? new StreamClosedError("casq: work stream ended")
        : new StreamClosedError("casq: work stream broke", { cause: thrown }),
    );
    this.sessions.delete(session);
    // The primary is the reconnect loop's business.
    if (session.primary || this.stopping) return;
    const error = thrown === undefined ? undefined : toCasqError(thrown);
    const retry = this.secondaryRetry.get(session.address) ?? { failures: 0, notBefore: 0 };
    retry.failures++;
    // Back off before this broker is tried again: the routing that sent us
    // there may be stale, and a routing event that corrects it may never come.
    retry.notBefore = Date.now() + retryDelayMs(retry.failures, this.pool.options);
    this.secondaryRetry.set(session.address, retry);
    if (error instanceof RedirectError) {
      // That broker leads none of the queue's shards any more; the one it
      // names leads one. Tried no sooner than this broker, so that two brokers
      // with stale views cannot bounce us between them without a pause.
      const target = this.secondaryRetry.get(error.leaderAddress) ?? { failures: 0, notBefore: 0 };
      target.notBefore = Math.max(target.notBefore, retry.notBefore);
      this.secondaryRetry.set(error.leaderAddress, target);
      this.redirectHints.add(error.leaderAddress);
    } else if (error !== undefined) this.report(error);
    this.reconcile();
  }

  /**
   * Opens a secondary stream to every broker that leads a shard no open
   * stream serves (by the streams' latest routing, or named by a redirect),
   * unless a stream to it is open or opening, or it failed too recently.
   */
  private reconcile(): void {
    if (this.stopping) return;
    const served = new Set<number>();
    for (const session of this.sessions)
      if (!session.closed && !session.draining)
        for (const shard of session.routing?.servingShards ?? []) served.add(shard);
    const wanted = new Set(this.redirectHints);
    for (const session of this.sessions)
      for (const route of session.routing?.shards ?? [])
        if (!served.has(route.shard) && route.leader?.address) wanted.add(route.leader.address);
    const now = Date.now();
    let wakeAt = Number.POSITIVE_INFINITY;
    for (const address of wanted) {
      if (this.sessionAt(address, true)) {
        this.redirectHints.delete(address);
        continue;
      }
      const notBefore = this.secondaryRetry.get(address)?.notBefore ?? 0;
      if (notBefore > now) {
        wakeAt = Math.min(wakeAt, notBefore);
        continue;
      }
      this.redirectHints.delete(address);
      this.startSession(address);
    }
    if (wakeAt !== Number.POSITIVE_INFINITY) this.scheduleReconcile(wakeAt - now);
  }

  private scheduleReconcile(ms: number): void {
    const at = Date.now() + Math.max(0, ms);
    // An earlier look is enough: it schedules the next one itself.
    if (this.reconcileTimer && this.reconcileAt <= at) return;
    this.clearReconcile();
    this.reconcileAt = at;
    this.reconcileTimer = setTimeout(
      () => {
        this.reconcileTimer = undefined;
        this.reconcile();
      },
      Math.max(0, ms),
    );
    this.reconcileTimer.unref();
  }

  private clearReconcile(): void {
    if (this.reconcileTimer) clearTimeout(this.reconcileTimer);
    this.reconcileTimer = undefined;
  }

  /** Keeps the primary stream: reconnects with backoff, follows redirects, ends on a fatal error. */
  private async loop(): Promise<void> {
    let address = this.pool.preferred();
    while (!this.stopping) {
      // A secondary to that broker becomes the primary rather than a second stream to the same broker.
      const session = this.sessionAt(address) ?? this.startSession(address);
      session.primary = true;
      if (session.opened) this.primaryOpened();
      try {
        await session.ended;
        if (this.stopping) break;
        address = this.pool.rotate(address);
        await sleep(retryDelayMs(++this.failures, this.pool.options), this.stopController.signal);
      } catch (thrown) {
        if (this.stopping) break;
        const error = toCasqError(thrown);
        if (error instanceof RedirectError) {
          if (this.failed.has(error.leaderAddress)) {
            // The leader died; this broker takes its shards over once the
            // leader's lease runs out. Wait here rather than bounce between the two.
            this.pool.prefer(address);
            await this.pause(++this.failures);
            continue;
          }
          const same = error.leaderAddress === address;
          this.pool.prefer(error.leaderAddress);
          address = error.leaderAddress;
          if (same) await this.pause(++this.failures);
          continue;
        }
        if (FATAL.has(error.code)) {
          this.stopping = true;
          await this.drain(0);
          throw error;
        }
        this.report(error);
        if (!session.draining) this.failed.add(address);
        address = this.pool.rotate(address);
        // A broker that drained us: go elsewhere at once. Anything else: back off.
        if (!session.draining || !isRetryable(error)) await this.pause(++this.failures);
      }
    }
    // Stopped: stop() drives the rest.
  }

  private primaryOpened(): void {
    this.failures = 0;
    this.failed.clear();
  }

  private async pause(failures: number): Promise<void> {
    try {
      await sleep(retryDelayMs(failures, this.pool.options), this.stopController.signal);
    } catch {
      // stopped while waiting
    }
  }

  private onResponse(session: Session, response: WorkResponse): void {
    const event = response.event;
    switch (event.case) {
      case "opened": {
        session.opened = true;
        this.secondaryRetry.delete(session.address);
        if (session.primary) this.primaryOpened();
        const ms = event.value.heartbeatInterval ? durationMs(event.value.heartbeatInterval) : 0;
        this.startHeartbeat(ms > 0 ? ms : 20_000);
        session.routing = event.value.routing;
        this.reconcile();
        return;
      }
      case "routing":
        session.routing = event.value;
        this.reconcile();
        return;
      case "job": {
        const controller = new AbortController();
        const held: Held = {
          job: jobFromClaim(event.value, controller.signal),
          controller,
          session,
          creditTo: session,
          creditReturned: false,
          started: false,
          settled: false,
          abandoned: false,
        };
        this.held.set(held.job.receipt, held);
        if (this.stopping) {
          this.release(held);
          return;
        }
        this.waiting.push(held);
        this.pump();
        return;
      }
      case "leasesLost":
        for (const receipt of event.value.receipts) this.lost(receipt, event.value.reason);
        return;
      case "draining":
        session.draining = true;
        return;
      case "heartbeated":
      case "acked":
      case "nacked":
      case "requestFailed":
        session.reply(response);
        return;
      default:
        return;
    }
  }

  private lost(receipt: string, reason: string): void {
    const held = this.held.get(receipt);
    if (!held || held.controller.signal.aborted) return;
    held.controller.abort(new CasqError(Code.Aborted, `casq: lease lost (${reason || "lost"})`));
    if (!held.started) {
      // Never started: drop it without settling; give its credit back.
      const index = this.waiting.indexOf(held);
      if (index >= 0) this.waiting.splice(index, 1);
      this.forget(held);
    }
  }

  private pump(): void {
    while (!this.stopping && this.running < this.concurrency && this.waiting.length > 0) {
      const held = this.waiting.shift() as Held;
      held.started = true;
      this.running++;
      void this.execute(held);
    }
  }

  private async execute(held: Held): Promise<void> {
    let outcome: { kind: "ack" } | { kind: "nack"; deadLetter: boolean; reason: string };
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
        this.logHandlerFailure(error, held.job);
        this.notify(error, held.job);
      }
    }
    this.running--;
    if (held.abandoned) return; // stopped hard: the lease expires and the job is redelivered
    this.returnCredit(held);
    // A lost lease does not stop the ack: the broker accepts it if nobody claimed the message since.
    await this.track(
      outcome.kind === "ack"
        ? this.settle(held, { case: "ack", value: { receipts: [held.job.receipt] } })
        : this.settle(held, {
            case: "nack",
            value: {
              receipts: [held.job.receipt],
              deadLetter: outcome.deadLetter,
              reason: outcome.reason.slice(0, 2048),
            },
          }),
    );
    this.pump();
  }

  private track(p: Promise<void>): Promise<void> {
    this.settles.add(p);
    return p.finally(() => this.settles.delete(p));
  }

  /**
   * Gives a job back unprocessed (e.g. one that arrived while stopping): a
   * release is claimable again at once and does not count as an attempt.
   */
  private release(held: Held): void {
    void this.track(
      this.settle(held, {
        case: "nack",
        value: { receipts: [held.job.receipt], release: true, reason: "worker stopping" },
      }),
    );
  }

  /**
   * Acks or nacks one held job exactly once: on the stream that delivered it,
   * or (that stream gone, or the request redirected) by unary call to the leader.
   */
  private async settle(held: Held, command: Extract<Command, { case: "ack" | "nack" }>): Promise<void> {
    if (held.settled) return;
    held.settled = true;
    let leader: string | undefined;
    // The request went out on the stream, which then broke or hung: it may have been applied.
    let sentOnStream = false;
    try {
      const session = held.session;
      if (session.usable) {
        try {
          const reply = await session.request(command);
          const event = reply.event;
          this.checkSettled(
            held,
            command.case,
            event.case === "acked" || event.case === "nacked" ? event.value.results : [],
          );
          return;
        } catch (thrown) {
          const error = toCasqError(thrown);
          if (error instanceof RedirectError) leader = error.leaderAddress;
          else if (!(error instanceof StreamClosedError) && !isRetryable(error)) throw error;
          else sentOnStream = true;
        }
      }
      const client = (address: string) => this.pool.client(QueueService, address);
      // Set when the answer comes from a resend after an attempt that may have been applied.
      let uncertain = sentOnStream;
      const response = await callWithFailover<{ results: (AckResult | NackResult)[] }>(
        this.pool,
        ({ address, timeoutMs, uncertain: resent }) => {
          uncertain = sentOnStream || resent;
          return command.case === "ack"
            ? client(address).ack(
                {
                  queue: this.queue,
                  subscription: this.subscription,
                  receipts: command.value.receipts ?? [],
                },
                { timeoutMs },
              )
            : client(address).nack(
                {
                  queue: this.queue,
                  subscription: this.subscription,
                  receipts: command.value.receipts ?? [],
                  deadLetter: command.value.deadLetter ?? false,
                  release: command.value.release ?? false,
                  reason: command.value.reason ?? "",
                  ...(command.value.delay ? { delay: command.value.delay } : {}),
                },
                { timeoutMs },
              );
        },
        leader ? { address: leader } : {},
      );
      this.checkSettled(held, command.case, response.results, uncertain);
    } catch (error) {
      // Not settled: the lease expires and the job is redelivered (at-least-once).
      this.report(error, held.job, "error");
    } finally {
      this.forget(held);
    }
  }

  /**
   * Reports a settle that did not do what the worker asked (see
   * {@link settleError}); `resent`: answered to a resend after an attempt
   * that may have been applied.
   */
  private checkSettled(
    held: Held,
    operation: SettleOperation,
    results: readonly (AckResult | NackResult)[],
    resent = false,
  ): void {
    const error = settleError(held.job, operation, results, resent);
    if (error) this.report(error, held.job);
  }

  /** Drops a job from the held set and grants its credit back to its stream if it has not yet. */
  private forget(held: Held): void {
    if (!this.held.delete(held.job.receipt)) return;
    this.returnCredit(held);
    if (this.running === 0) for (const wake of this.idleWaiters.splice(0)) wake();
  }

  /** Grants a job's credit back to its stream, once (not while stopping: no more jobs are wanted). */
  private returnCredit(held: Held): void {
    if (held.creditReturned) return;
    held.creditReturned = true;
    const session = held.creditTo;
    if (!this.stopping && session.usable) session.send({ case: "credit", value: { credits: 1 } });
  }

  private startHeartbeat(ms: number): void {
    if (this.heartbeatMs === ms && this.heartbeatTimer) return;
    this.clearHeartbeat();
    this.heartbeatMs = ms;
    this.heartbeatTimer = setInterval(() => void this.heartbeat(), ms);
    this.heartbeatTimer.unref();
  }

  private clearHeartbeat(): void {
    if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
    this.heartbeatTimer = undefined;
  }

  /** Heartbeats every running job, each on the stream that delivered it (or by unary call). */
  private async heartbeat(): Promise<void> {
    const bySession = new Map<Session, string[]>();
    for (const held of this.held.values()) {
      if (held.settled || held.abandoned) continue;
      const receipts = bySession.get(held.session) ?? [];
      receipts.push(held.job.receipt);
      bySession.set(held.session, receipts);
    }
    await Promise.all(
      [...bySession].map(async ([session, receipts]) => {
        for (let i = 0; i < receipts.length; i += 500)
          await this.heartbeatChunk(session, receipts.slice(i, i + 500));
      }),
    );
  }

  private async heartbeatChunk(session: Session, chunk: string[]): Promise<void> {
    try {
      let results: HeartbeatResult[] | undefined;
      let leader: string | undefined;
      if (session.usable) {
        try {
          const reply = await session.request({ case: "heartbeat", value: { receipts: chunk } });
          if (reply.event.case === "heartbeated") results = reply.event.value.results;
        } catch (thrown) {
          const error = toCasqError(thrown);
          if (error instanceof RedirectError) leader = error.leaderAddress;
          else if (!(error instanceof StreamClosedError) && !isRetryable(error)) throw error;
        }
      }
      if (!results) {
        const response = await callWithFailover(
          this.pool,
          ({ address, timeoutMs }) =>
            this.pool.client(QueueService, address).heartbeat(
              {
                queue: this.queue,
                subscription: this.subscription,
                workerId: this.workerId,
                receipts: chunk,
              },
              { timeoutMs },
            ),
          { ...(leader ? { address: leader } : {}), maxAttempts: 3 },
        );
        results = response.results;
      }
      for (const r of results)
        if (r.outcome === HeartbeatOutcome.LOST) this.lost(r.receipt, "heartbeat: lease lost");
    } catch (error) {
      this.report(error);
    }
  }

  /** Graceful stop: no new jobs, wait for handlers up to `timeoutMs`, abort the rest, end every stream. */
  async stop(timeoutMs: number): Promise<void> {
    this.stopping = true;
    this.stopController.abort();
    await this.drain(timeoutMs);
    await this.done.catch(() => {});
  }

  private async drain(timeoutMs: number): Promise<void> {
    this.clearReconcile();
    // Jobs received but not started go back at once.
    for (const held of this.waiting.splice(0)) this.release(held);
    if (this.running > 0) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        new Promise<void>((resolve) => this.idleWaiters.push(resolve)),
        new Promise<void>((resolve) => {
          timer = setTimeout(resolve, timeoutMs);
        }),
      ]);
      clearTimeout(timer);
    }
    for (const held of this.held.values()) {
      if (held.started && !held.settled) {
        held.abandoned = true;
        held.controller.abort(new CasqError(Code.Canceled, "casq: worker stopped"));
      }
    }
    // Let acks of finished jobs land, then half-close every stream and wait briefly for the brokers' OK.
    await Promise.race([Promise.allSettled([...this.settles]), sleep(5_000).catch(() => {})]);
    this.clearHeartbeat();
    const open = [...this.sessions].filter((s) => !s.closed);
    for (const session of open) session.requests.end();
    const timer = setTimeout(() => {
      for (const session of open) session.abort.abort();
    }, 2_000);
    await Promise.allSettled(open.map((s) => s.ended));
    clearTimeout(timer);
  }
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
