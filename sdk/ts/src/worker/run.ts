/**
 * One `run()` of a worker, wired from its parts (as River splits a worker
 * into producer, executor and completer):
 *
 * - {@link Streams} keep a Work stream to every broker that leads shards of
 *   the queue and deliver its jobs;
 * - the {@link Executor} runs the handler over them, `concurrency` at once;
 * - the {@link Settler} acks or nacks each job once and gives its credit back;
 * - {@link Heartbeats} keep the leases of held jobs.
 *
 * The run holds the jobs (by receipt), drops a job whose lease was lost
 * before it started, and stops: no more jobs, running handlers get a grace
 * period, the rest are abandoned, then every stream ends.
 */

import type { ClaimedMessage } from "@casq/api/casq/v1/message_pb.ts";
import { Code } from "@connectrpc/connect";
import type { Tracer } from "@opentelemetry/api";
import { startTimer } from "../clock.ts";
import { CasqError } from "../errors.ts";
import { sleep } from "../failover.ts";
import { type Job, jobFromClaim } from "../job.ts";
import type { BrokerPool } from "../transport.ts";
import type { Session } from "../work-session.ts";
import { Executor, type JobHandler } from "./executor.ts";
import { Heartbeats } from "./heartbeats.ts";
import type { Held } from "./held-job.ts";
import { LazyAbort } from "./lazy-abort.ts";
import { Reporter, type WorkerLogger } from "./reporter.ts";
import { Settler } from "./settler.ts";
import { Streams } from "./streams.ts";

/** Options of `Worker.run` (worker.ts). */
export interface RunOptions {
  /** Subscription (consumer group). Default "default". */
  readonly subscription?: string;
  /** Handlers running at once. Default 1. */
  readonly concurrency?: number;
  /**
   * A fixed prefetch: jobs held at once per stream (running + waiting +
   * credit the broker has not used yet), concurrency..10 000. Unset (the
   * default): the prefetch adapts, from `concurrency` up to `maxPrefetch`.
   */
  readonly prefetch?: number;
  /**
   * Upper bound of the adaptive prefetch per stream (ignored with `prefetch`).
   * The window grows while handlers wait for jobs the broker would have sent
   * with more credit (fast handlers, slow store: a claim commit per window),
   * and shrinks back when jobs only wait in the buffer. Buffered jobs are
   * heartbeated like running ones, so their leases hold while they wait.
   * Past 20 × concurrency it grows only while it holds fewer jobs than
   * arrive in a few acks' round trips (a slow store). concurrency..10 000;
   * default 100 × concurrency (at most 10 000).
   */
  readonly maxPrefetch?: number;
  /** Lease length of each job, 100 ms..24 h. Default: the queue's (60 s). */
  readonly leaseTtlMs?: number;
  /** Aborting it stops the run gracefully (as `stop()` with `stopTimeoutMs`). */
  readonly signal?: AbortSignal;
  /** Grace period for running handlers when `signal` aborts. Default 30 000 ms. */
  readonly stopTimeoutMs?: number;
  /** Called with failures that do not end the run: handler errors, failed acks, broken streams. */
  readonly onError?: (error: unknown, job?: Job) => void;
}

/** Largest prefetch (fixed or adaptive) per stream. */
export const MAX_PREFETCH = 10_000;

/** The bounds of each stream's credit window for `options` (see {@link RunOptions.prefetch}). */
export function creditWindowBounds(
  concurrency: number,
  options: Pick<RunOptions, "prefetch" | "maxPrefetch">,
): { initial: number; min: number; max: number; growFreelyTo?: number } {
  const clamp = (n: number) => Math.min(MAX_PREFETCH, Math.max(concurrency, Math.floor(n)));
  if (options.prefetch !== undefined) {
    const fixed = clamp(options.prefetch);
    return { initial: fixed, min: fixed, max: fixed };
  }
  return {
    initial: concurrency,
    min: concurrency,
    max: clamp(options.maxPrefetch ?? 100 * concurrency),
    growFreelyTo: 20 * concurrency,
  };
}

/** One `run()`: its streams, held jobs, handlers, settles and heartbeats. */
export class Run {
  private readonly held = new Map<string, Held>();
  private stopping = false;
  private readonly stopController = new AbortController();
  private readonly idleWaiters: (() => void)[] = [];
  private readonly settler: Settler;
  private readonly executor: Executor;
  private readonly heartbeats: Heartbeats;
  private readonly streams: Streams;
  private readonly pool: BrokerPool;
  /** Settles when the run is over: resolves when stopped, rejects with the error that ended it. */
  done: Promise<void>;

  /** Starts working on `queue` at once. */
  constructor(
    pool: BrokerPool,
    workerId: string,
    tracer: Tracer,
    queue: string,
    handler: JobHandler,
    options: RunOptions,
    logger: WorkerLogger | null,
  ) {
    this.pool = pool;
    const subscription = options.subscription ?? "";
    const concurrency = Math.max(1, Math.floor(options.concurrency ?? 1));
    const window = creditWindowBounds(concurrency, options);
    const stopping = () => this.stopping;
    const reporter = new Reporter(queue, logger, options);
    this.settler = new Settler({
      pool,
      queue,
      subscription,
      held: this.held,
      reporter,
      stopping,
      forgotten: () => {
        if (this.executor.running === 0) for (const wake of this.idleWaiters.splice(0)) wake();
      },
    });
    this.executor = new Executor({
      tracer,
      handler,
      subscription,
      concurrency,
      reporter,
      settler: this.settler,
      stopping,
      started: (buffered) => this.streams.noteStarted(buffered),
      starved: () => this.streams.noteStarved(),
    });
    this.heartbeats = new Heartbeats({
      pool,
      queue,
      subscription,
      workerId,
      held: this.held,
      reporter,
      lost: (receipt, reason) => this.lost(receipt, reason),
    });
    this.streams = new Streams({
      pool,
      queue,
      subscription,
      workerId,
      window,
      leaseTtlMs: options.leaseTtlMs,
      reporter,
      stopSignal: this.stopController.signal,
      stopping,
      events: {
        adoptCredits: (session, max) => this.settler.adoptCredits(session, max),
        job: (session, claim) => this.received(session, claim),
        leasesLost: (receipts, reason) => {
          for (const receipt of receipts) this.lost(receipt, reason);
        },
        opened: (heartbeatMs) => this.heartbeats.start(heartbeatMs),
        fatal: async () => {
          this.stopping = true;
          await this.drain(0);
        },
      },
    });
    this.done = this.streams.loop().finally(async () => {
      this.heartbeats.clear();
      this.streams.clearReconcile();
      // The run is over once every stream is: secondaries end with the half-close of the stop.
      await this.streams.allEnded();
      // Jobs that arrived as the streams closed are released by unary call: let that land (briefly).
      let cancel = () => {};
      await Promise.race([
        this.settler.settled(),
        new Promise<void>((resolve) => {
          cancel = startTimer(pool.options.clock, 5_000, resolve, { unref: true });
        }),
      ]);
      cancel();
    });
  }

  /** A job arrived: held, then queued to run (or given back at once while stopping). */
  private received(session: Session, claim: ClaimedMessage): void {
    const abort = new LazyAbort();
    const held: Held = {
      job: jobFromClaim(claim, () => abort.signal),
      abort,
      session,
      creditTo: session,
      creditReturned: false,
      started: false,
      settled: false,
      abandoned: false,
    };
    this.held.set(held.job.receipt, held);
    if (this.stopping) {
      this.settler.release(held);
      return;
    }
    // A window that grew, or waited for the broker's max_credits, grants with the next flush.
    if (session.credit.canGrant) this.settler.creditChanged(session);
    this.executor.enqueue(held);
  }

  /** A job's lease is lost: its handler's signal aborts; a job not started is dropped without settling. */
  private lost(receipt: string, reason: string): void {
    const held = this.held.get(receipt);
    if (!held || held.abort.aborted) return;
    held.abort.abort(new CasqError(Code.Aborted, `casq: lease lost (${reason || "lost"})`));
    if (!held.started) {
      // Never started: drop it without settling; give its credit back.
      this.executor.withdraw(held);
      this.settler.forget(held);
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
    this.streams.clearReconcile();
    // Jobs received but not started go back at once.
    for (const held of this.executor.takeWaiting()) this.settler.release(held);
    const clock = this.pool.options.clock;
    if (this.executor.running > 0) {
      let cancelTimer = () => {};
      await Promise.race([
        new Promise<void>((resolve) => this.idleWaiters.push(resolve)),
        new Promise<void>((resolve) => {
          cancelTimer = startTimer(clock, timeoutMs, resolve);
        }),
      ]);
      cancelTimer();
    }
    for (const held of this.held.values()) {
      if (held.started && !held.settled) {
        held.abandoned = true;
        held.abort.abort(new CasqError(Code.Canceled, "casq: worker stopped"));
      }
    }
    // Let acks of finished jobs land, then half-close every stream and wait briefly for the brokers' OK.
    await Promise.race([this.settler.settled(), sleep(5_000, undefined, clock).catch(() => {})]);
    this.heartbeats.clear();
    await this.streams.close();
  }
}
