/**
 * The Work streams of a run, and which broker each goes to.
 *
 * A broker's stream delivers jobs only from the shards that broker leads, so
 * the run keeps one stream per shard leader:
 *
 * - The **primary** stream goes to the preferred broker; {@link Streams.loop}
 *   reconnects it with backoff and follows its redirects, as a one-stream
 *   worker would.
 * - Every `opened` / `routing` event tells which shards the stream serves and
 *   who leads every shard. A shard that no open stream serves and whose
 *   leader is known names a broker; {@link Streams.reconcile} opens a
 *   **secondary** stream there unless one is open or opening. A secondary
 *   that ends is dropped (no reconnect loop of its own); the routing of the
 *   streams still open, or the leader its redirect named, opens it again when
 *   still needed, after a backoff per address.
 * - Each stream has its own credit window (`credit-window.ts`): it opens with
 *   the window's credit less the jobs of ended streams it takes over (see the
 *   settler's credit ledger), and the window adapts as jobs arrive.
 *
 * Jobs, lost leases and the heartbeat interval a stream announces go to the
 * run's {@link StreamEvents}; answers to requests go to the stream's session.
 */
import { durationFromMs, durationMs } from "@bufbuild/protobuf/wkt";
import type { ClaimedMessage } from "@casq/api/casq/v1/message_pb.ts";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import type { WorkResponse } from "@casq/api/casq/v1/work_pb.ts";
import { Code } from "@connectrpc/connect";
import { startTimer } from "../clock.ts";
import { isRetryable, RedirectError, toCasqError } from "../errors.ts";
import { retryDelayMs, sleep } from "../failover.ts";
import type { BrokerPool } from "../transport.ts";
import { Session, StreamClosedError } from "../work-session.ts";
import { CreditWindow } from "./credit-window.ts";
import type { Reporter } from "./reporter.ts";

/** Most credit a stream may have outstanding until `opened` says (the protocol's max_credits). */
const MAX_CREDITS = 1000;

const FATAL = new Set<Code>([
  Code.NotFound,
  Code.InvalidArgument,
  Code.PermissionDenied,
  Code.Unauthenticated,
  Code.FailedPrecondition,
]);

/** What a run does with what its streams deliver. */
export interface StreamEvents {
  /**
   * A stream to `session.address` is opening: the credit of up to `max` held
   * jobs of ended streams goes to it; returns how many (it opens with that
   * much less credit).
   */
  adoptCredits(session: Session, max: number): number;
  /** A job arrived on `session`. */
  job(session: Session, claim: ClaimedMessage): void;
  /** The broker no longer holds these leases for us. */
  leasesLost(receipts: readonly string[], reason: string): void;
  /** A stream opened; the broker wants heartbeats every `ms`. */
  opened(heartbeatMs: number): void;
  /** The primary stream met an error retrying cannot fix: stop the run (the error then ends it). */
  fatal(): Promise<void>;
}

/** What {@link Streams} work with. */
export interface StreamsOptions {
  readonly pool: BrokerPool;
  readonly queue: string;
  /** The run's subscription ("" for the default). */
  readonly subscription: string;
  readonly workerId: string;
  /** Bounds of each stream's credit window: jobs held plus credit outstanding. */
  readonly window: {
    readonly initial: number;
    readonly min: number;
    readonly max: number;
    readonly growFreelyTo?: number;
  };
  /** Lease length asked for in `open`; `undefined`: the queue's. */
  readonly leaseTtlMs: number | undefined;
  readonly reporter: Reporter;
  /** Aborts when the run stops: backoff pauses end early. */
  readonly stopSignal: AbortSignal;
  /** True once the run stops: no stream is opened or reopened. */
  readonly stopping: () => boolean;
  readonly events: StreamEvents;
}

/** The Work streams of one run: the primary's reconnect loop and the secondaries routing asks for. */
export class Streams {
  /** Streams open or opening (closed ones are removed as they end). */
  private readonly sessions = new Set<Session>();
  /** Failures of the primary stream since it last opened. */
  private failures = 0;
  /** Brokers whose primary stream broke (not drained, not redirected) since the last open. */
  private readonly failed = new Set<string>();
  /** Secondary streams that ended: how often in a row, and not to be reopened before when. */
  private readonly secondaryRetry = new Map<string, { failures: number; notBefore: number }>();
  /** Leaders named by redirects of secondary streams, still to be tried. */
  private readonly redirectHints = new Set<string>();
  private cancelReconcile: (() => void) | undefined;
  private reconcileAt = 0;
  private readonly pool: BrokerPool;
  private readonly queue: string;
  private readonly subscription: string;
  private readonly workerId: string;
  private readonly window: StreamsOptions["window"];
  private readonly leaseTtlMs: number | undefined;
  private readonly reporter: Reporter;
  private readonly stopSignal: AbortSignal;
  private readonly stopping: () => boolean;
  private readonly events: StreamEvents;

  /** The streams of one run; none is opened before {@link loop}. */
  constructor(options: StreamsOptions) {
    this.pool = options.pool;
    this.queue = options.queue;
    this.subscription = options.subscription;
    this.workerId = options.workerId;
    this.window = options.window;
    this.leaseTtlMs = options.leaseTtlMs;
    this.reporter = options.reporter;
    this.stopSignal = options.stopSignal;
    this.stopping = options.stopping;
    this.events = options.events;
  }

  /** Keeps the primary stream: reconnects with backoff, follows redirects, ends on a fatal error. */
  async loop(): Promise<void> {
    let address = this.pool.preferred();
    while (!this.stopping()) {
      // A secondary to that broker becomes the primary rather than a second stream to the same broker.
      const session = this.sessionAt(address) ?? this.startSession(address);
      session.primary = true;
      if (session.opened) this.primaryOpened();
      try {
        await session.ended;
        if (this.stopping()) break;
        address = this.pool.rotate(address);
        await this.pause(++this.failures, false);
      } catch (thrown) {
        if (this.stopping()) break;
        const error = toCasqError(thrown);
        if (error instanceof RedirectError) {
          if (this.failed.has(error.leaderAddress)) {
            // The leader died; this broker takes its shards over once the
            // leader's lease runs out. Wait here rather than bounce between the two.
            this.pool.prefer(address);
            await this.pause(++this.failures);
            // Once: a leader that comes back (a restarted process at the same
            // address) keeps its shards, and this broker then redirects there
            // for ever. The next redirect is followed; a leader still dead fails
            // again and lands here again, each time after a longer pause.
            this.failed.delete(error.leaderAddress);
            continue;
          }
          const same = error.leaderAddress === address;
          this.pool.prefer(error.leaderAddress);
          address = error.leaderAddress;
          if (same) await this.pause(++this.failures);
          continue;
        }
        if (FATAL.has(error.code)) {
          await this.events.fatal();
          throw error;
        }
        this.reporter.report(error);
        if (!session.draining) this.failed.add(address);
        address = this.pool.rotate(address);
        // A broker that drained us: go elsewhere at once. Anything else: back off.
        if (!session.draining || !isRetryable(error)) await this.pause(++this.failures);
      }
    }
    // Stopped: stop() drives the rest.
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
    const session = new Session(
      address,
      this.pool.options.timeoutMs,
      this.pool.options.clock,
      new CreditWindow({ ...this.window, maxOutstanding: MAX_CREDITS, now: () => this.now() }),
    );
    // Jobs of streams that ended give their credit to this one, so the worker
    // holds no more than before the other stream ended.
    this.events.adoptCredits(session, session.credit.size);
    this.sessions.add(session);
    session.ended = this.consume(session, session.credit.takeGrant());
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
        batchedJobs: true,
        ...(this.leaseTtlMs === undefined ? {} : { leaseTtl: durationFromMs(this.leaseTtlMs) }),
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
    if (this.stopping()) return;
    const retry = this.secondaryRetry.get(session.address) ?? { failures: 0, notBefore: 0 };
    retry.failures++;
    // Back off before this broker is tried again: the routing that sent us
    // there may be stale, and a routing event that corrects it may never come.
    retry.notBefore = this.now() + this.delayMs(retry.failures);
    this.secondaryRetry.set(session.address, retry);
    if (session.primary) {
      // The reconnect loop reopens the primary, but it may move on to a
      // stream already open to another broker and stay there: the shards the
      // ended stream served are then unserved, and the other streams' routing
      // still names their leader at the same address (a restarted broker), so
      // no routing event would ever ask for it again. Look once the backoff
      // has passed; a stream the loop opened by then is found and kept.
      this.reconcile();
      return;
    }
    const error = thrown === undefined ? undefined : toCasqError(thrown);
    if (error instanceof RedirectError) {
      // That broker leads none of the queue's shards any more; the one it
      // names leads one. Tried no sooner than this broker, so that two brokers
      // with stale views cannot bounce us between them without a pause.
      const target = this.secondaryRetry.get(error.leaderAddress) ?? { failures: 0, notBefore: 0 };
      target.notBefore = Math.max(target.notBefore, retry.notBefore);
      this.secondaryRetry.set(error.leaderAddress, target);
      this.redirectHints.add(error.leaderAddress);
    } else if (error !== undefined) this.reporter.report(error);
    this.reconcile();
  }

  /**
   * Opens a secondary stream to every broker that leads a shard no open
   * stream serves (by the streams' latest routing, or named by a redirect),
   * unless a stream to it is open or opening, or it failed too recently.
   */
  private reconcile(): void {
    if (this.stopping()) return;
    const served = new Set<number>();
    for (const session of this.sessions)
      if (!session.closed && !session.draining)
        for (const shard of session.routing?.servingShards ?? []) served.add(shard);
    const wanted = new Set(this.redirectHints);
    for (const session of this.sessions)
      for (const route of session.routing?.shards ?? [])
        if (!served.has(route.shard) && route.leader?.address) wanted.add(route.leader.address);
    const now = this.now();
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
    const at = this.now() + Math.max(0, ms);
    // An earlier look is enough: it schedules the next one itself.
    if (this.cancelReconcile && this.reconcileAt <= at) return;
    this.clearReconcile();
    this.reconcileAt = at;
    this.cancelReconcile = startTimer(
      this.pool.options.clock,
      Math.max(0, ms),
      () => {
        this.cancelReconcile = undefined;
        this.reconcile();
      },
      { unref: true },
    );
  }

  /** Cancels a reconcile scheduled for later. */
  clearReconcile(): void {
    this.cancelReconcile?.();
    this.cancelReconcile = undefined;
  }

  private primaryOpened(): void {
    this.failures = 0;
    this.failed.clear();
  }

  /**
   * Waits the backoff delay after `failures` failures (ends early when the run
   * stops); `quiet: false` rethrows that abort, as the reconnect loop expects.
   */
  private async pause(failures: number, quiet = true): Promise<void> {
    try {
      await sleep(this.delayMs(failures), this.stopSignal, this.pool.options.clock);
    } catch (error) {
      // stopped while waiting
      if (!quiet) throw error;
    }
  }

  /** The client's backoff delay after `failures` failures, with its jitter source. */
  private delayMs(failures: number): number {
    return retryDelayMs(failures, this.pool.options, this.pool.options.random);
  }

  private now(): number {
    return this.pool.options.clock.now();
  }

  private onResponse(session: Session, response: WorkResponse): void {
    const event = response.event;
    switch (event.case) {
      case "opened": {
        session.opened = true;
        if (event.value.maxCredits > 0) session.credit.maxOutstanding = event.value.maxCredits;
        this.secondaryRetry.delete(session.address);
        if (session.primary) this.primaryOpened();
        const ms = event.value.heartbeatInterval ? durationMs(event.value.heartbeatInterval) : 0;
        this.events.opened(ms > 0 ? ms : 20_000);
        session.routing = event.value.routing;
        this.reconcile();
        return;
      }
      case "routing":
        session.routing = event.value;
        this.reconcile();
        return;
      case "job":
        session.credit.arrived();
        this.events.job(session, event.value);
        return;
      case "jobs":
        for (const job of event.value.jobs) {
          session.credit.arrived();
          this.events.job(session, job);
        }
        return;
      case "leasesLost":
        this.events.leasesLost(event.value.receipts, event.value.reason);
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

  /** Half-closes every open stream and waits for them to end; aborts the ones still open after 2 s. */
  async close(): Promise<void> {
    const open = [...this.sessions].filter((s) => !s.closed);
    for (const session of open) session.requests.end();
    const cancel = startTimer(this.pool.options.clock, 2_000, () => {
      for (const session of open) session.abort.abort();
    });
    await Promise.allSettled(open.map((s) => s.ended));
    cancel();
  }

  /** The handlers sat idle with nothing buffered: every stream's window hears of it. */
  noteStarved(): void {
    for (const session of this.sessions) session.credit.noteStarved();
  }

  /** A handler started with `buffered` jobs still waiting: every stream's window hears of it. */
  noteStarted(buffered: number): void {
    for (const session of this.sessions) session.credit.noteStarted(buffered);
  }

  /** Settles when every stream open or opening now has ended. */
  async allEnded(): Promise<void> {
    await Promise.allSettled([...this.sessions].map((s) => s.ended));
  }
}
