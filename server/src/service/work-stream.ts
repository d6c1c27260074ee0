/**
 * QueueService.Work: the worker's bidirectional stream (protocol in
 * `proto/casq/v1/work.proto` and `docs/protocol.md`).
 *
 * One stream is one session of one worker on one subscription:
 *
 * 1. **Open.** The first message must be `open`. The broker checks it, looks
 *    at every shard of the queue (taking over shards nobody leads), and
 *    answers `opened` with the lease TTL, the heartbeat interval and the
 *    routing: the shards this stream serves (the ones this broker leads) and
 *    every shard's leader. If another broker leads every shard, the stream
 *    ends with a redirect instead.
 * 2. **Jobs.** A claim loop runs while the worker has credit: it claims up to
 *    `credit` messages from the served shards (one operation of each shard's
 *    group commit, so a job is sent only once its lease is durable), sends
 *    each as a `job` (or, to a worker that opened with `batched_jobs`, the
 *    jobs of one claim together in `jobs` messages, see {@link jobBatches})
 *    and uses one credit per job. The claim reads the credit
 *    when its commit is applied and takes what it claimed then, so credit
 *    granted while it waits for the write in flight rides in it. With credit and nothing
 *    runnable it stands a claim on the served shards, which the commit that
 *    makes something runnable applies (the jobs leave with that commit).
 *    After a pass that visited every shard, it claims again only when a look
 *    at the served shards' states in memory finds something runnable (after
 *    a standing claim was filled, or credit came back, usually nothing is;
 *    a shard in the middle of a commit counts as "maybe"), and visits every
 *    shard at least every PROBE_INTERVAL_MS.
 *    Credit is only ever added by `open` and `credit` messages, and given
 *    back by a claim whose write failed (which wakes the loop, see ClaimCredit).
 * 3. **Requests.** `heartbeat`, `ack` and `nack` run concurrently with the
 *    claim loop and with each other; each is answered (by request_id) once
 *    durable, or with `request_failed` carrying the status the unary RPC
 *    would return. A failed request never ends the stream.
 * 4. **Leases lost.** The stream remembers the jobs it sent until they are
 *    acked or nacked. After every commit of a shard it checks them, and a
 *    job the worker no longer holds (expired and swept, purged, subscription
 *    deleted, ...) is reported with `leases_lost`; so are receipts a
 *    heartbeat finds lost.
 * 5. **End.** Half-close: no more jobs, outstanding requests are answered,
 *    then status OK. Graceful server shutdown: no more jobs, `draining` with
 *    the grace period, requests answered until the worker holds nothing from
 *    this stream or the grace ends, then UNAVAILABLE "broker shutting down".
 *    Leases are not released by the end of a stream (the worker may still
 *    run its jobs and ack them at another broker), with one exception: a
 *    worker that has not even taken the `draining` notice by the end of the
 *    grace does not read its stream, so the jobs it holds from this stream
 *    are handed back (a nack with release: no attempt is counted) and the
 *    stream is reset, since its last messages can never be delivered.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import type { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import { ShardLeaderSchema } from "@casq/api/casq/v1/shard_pb.ts";
import type { WorkOpen, WorkRequest, WorkResponseSchema } from "@casq/api/casq/v1/work_pb.ts";
import { AsyncQueue } from "@casq/sdk/async-queue.ts";
import { backoffCap } from "@casq/sdk/backoff.ts";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { type ClaimPass, type Delivery, throwIfNothingServed } from "../broker/shard-claims.ts";
import { type ClaimCredit, returnCredit } from "../broker/shard-leader.ts";
import { CasqError, isCasqError } from "../errors.ts";
import type { ClaimedMessage, Receipt } from "../model/operations.ts";
import { inspectMessage } from "../model/shard-inspect.ts";
import type { ShardState } from "../model/shard-state.ts";
import { recordDeliveries } from "../telemetry/tracing.ts";
import type { Random } from "../util/random.ts";
import { claimedToProto, leaderToProto, receiptText, toDuration } from "./conversions.ts";
import { toRpcStatus } from "./grpc-errors.ts";
import { ackReceipts, heartbeatReceipts, type LeaseTarget, nackReceipts } from "./lease-requests.ts";
import { RESET_CALL } from "./listener.ts";
import { MAX_RECEIPTS } from "./receipts.ts";
import type { ServiceContext } from "./service-context.ts";
import {
  checkLeaseTtl,
  checkNackDelay,
  checkQueueName,
  checkSubscriptionName,
  checkWorkerId,
  nackReason,
} from "./validation.ts";
import type { WorkSessionHandle } from "./work-registry.ts";

/** Most credit a worker may have outstanding. */
export const MAX_CREDITS = 10_000;

/** With credit and nothing runnable, re-visit every shard at least this often (to pick up orphaned shards); without credit, look at it again this often. */
const PROBE_INTERVAL_MS = 5_000;
/** Claim passes that reached no shard (a store outage) retry after 200 ms, doubling, up to 5 s. */
const CLAIM_RETRY_BACKOFF = { immediateRetries: 0, baseDelayMs: 200, maxDelayMs: 5_000 } as const;

/** Held jobs of a shard are checked against its commits at most this often. */
const LEASE_CHECK_MS = 200;

type WorkResponseInit = MessageInitShape<typeof WorkResponseSchema>;

/**
 * The reason of the stream's internal wake-ups and stops (nobody reads it).
 * One object made once: `abort()` without a reason builds a DOMException with
 * a stack trace on every call, and a credit wakes the claim loop once per job.
 */
const WOKEN = new CasqError("cancelled", "woken");

/** The Work handler. */
export function createWorkHandler(ctx: ServiceContext): ServiceImpl<typeof QueueService>["work"] {
  return (requests, call) => workStream(ctx, requests, call);
}

async function* workStream(
  ctx: ServiceContext,
  requests: AsyncIterable<WorkRequest>,
  call: HandlerContext,
): AsyncIterable<WorkResponseInit> {
  if (ctx.work.draining)
    throw new CasqError("unavailable", "broker shutting down: open the Work stream at another broker");
  const iterator = requests[Symbol.asyncIterator]();
  const first = await iterator.next();
  if (first.done) throw invalid("the stream ended before its first message: send open first");
  if (first.value.command.case !== "open")
    throw invalid(
      `the first message of a Work stream must be open, got ${first.value.command.case ?? "nothing"}`,
    );
  const session = await WorkSession.open(ctx, first.value.command.value, first.value.requestId, call);
  yield* session.run(iterator);
}

/** Most jobs in one `jobs` message: as many as a claim takes (the queue's default max_batch); measured, more per message costs less per job. */
export const MAX_JOBS_PER_MESSAGE = 1000;
/** A `jobs` message takes no further job once its payloads reach this many bytes (a bigger job goes alone). */
export const MAX_JOB_BATCH_PAYLOAD_BYTES = 1024 * 1024;

/**
 * `deliveries` cut into the batches of a worker that takes `jobs` messages,
 * in order: each at most {@link MAX_JOBS_PER_MESSAGE} jobs, and a job joins
 * a batch only while the batch's payloads stay within
 * {@link MAX_JOB_BATCH_PAYLOAD_BYTES} (so a message stays far below the 4 MiB
 * that gRPC clients accept by default).
 */
export function jobBatches(deliveries: readonly Delivery[]): Delivery[][] {
  const batches: Delivery[][] = [];
  let batch: Delivery[] = [];
  let bytes = 0;
  for (const d of deliveries) {
    const size = d.message.payload.byteLength;
    if (
      batch.length > 0 &&
      (batch.length >= MAX_JOBS_PER_MESSAGE || bytes + size > MAX_JOB_BATCH_PAYLOAD_BYTES)
    ) {
      batches.push(batch);
      batch = [];
      bytes = 0;
    }
    batch.push(d);
    bytes += size;
  }
  if (batch.length > 0) batches.push(batch);
  return batches;
}

function invalid(message: string): CasqError {
  return new CasqError("invalid_argument", message);
}

/** One open Work stream (see the module header). */
class WorkSession implements WorkSessionHandle {
  readonly sessionId: string;
  private readonly outbox = new AsyncQueue<WorkResponseInit>();
  /** Jobs sent and not yet settled by this worker, per shard, by receipt text. */
  private readonly held = new Map<number, Map<string, Receipt>>();
  private served: number[] = [];
  /** The redirects of the latest claim pass: who leads the shards this stream does not serve. */
  private redirects = new Map<number, CasqError>();
  /** The leader address each shard had in the routing last sent (absent: none named). */
  private readonly toldLeaders = new Map<number, string>();
  private readonly lastLeaseCheck = new Map<number, number>();
  /**
   * Credit not yet used: shared with this stream's claims and standing
   * claims, which take from it as a commit applies them (see
   * ShardLeader.submit and ShardLeader.stand).
   */
  private readonly credit: ClaimCredit;
  private pending = 0;
  private halfClosed = false;
  private claiming = true;
  private readonly claimAbort = new AbortController();
  private wakeController = new AbortController();
  private changeWaiters: (() => void)[] = [];
  private readonly unsubscribers: (() => void)[] = [];
  private claimLoopDone: Promise<void> = Promise.resolve();
  /** The `draining` notice once pushed, and whether the transport took it (the worker reads). */
  private drainingNotice: WorkResponseInit | undefined;
  private drainingTaken = false;
  private endedResolve!: () => void;
  private readonly ended = new Promise<void>((resolve) => {
    this.endedResolve = resolve;
  });

  private constructor(
    private readonly ctx: ServiceContext,
    private readonly call: HandlerContext,
    readonly queue: string,
    readonly subscription: string,
    readonly workerId: string,
    private readonly shardCount: number,
    private readonly leaseTtlOverrideMs: number | undefined,
    credits: number,
    /** The worker takes several jobs per message (`open.batched_jobs`). */
    private readonly batchedJobs: boolean,
  ) {
    this.sessionId = sessionIdFrom(ctx.random);
    // Credit a claim took and gave back (its write failed) must wake a loop parked for want of it.
    this.credit = { available: credits, returned: () => this.wakeClaims() };
  }

  private get credits(): number {
    return this.credit.available;
  }

  private set credits(value: number) {
    this.credit.available = value;
  }

  /** Validates an open, checks the queue and its shards, and answers `opened`. */
  static async open(
    ctx: ServiceContext,
    open: WorkOpen,
    requestId: bigint,
    call: HandlerContext,
  ): Promise<WorkSession> {
    const queue = checkQueueName(open.queue, "open.queue");
    const subscription = checkSubscriptionName(open.subscription, "open.subscription");
    const workerId = checkWorkerId(open.workerId, "open.worker_id");
    if (open.credits > MAX_CREDITS)
      throw invalid(`open.credits must be between 0 and ${MAX_CREDITS}, got ${open.credits}`);
    const leaseTtlMs = checkLeaseTtl(open.leaseTtl, "open.lease_ttl");
    const manifest = await ctx.catalog.require(queue);

    // Look at every shard: which ones this broker serves, and whether the subscription exists.
    const probes = await Promise.all(
      Array.from({ length: manifest.shardCount }, async (_, shard) => {
        try {
          const seen = await ctx.broker.leader(queue, shard).read((state) => ({
            hasSubscription: state.subscriptionNames().includes(subscription),
            leaseTtlMs: state.config.leaseTtlMs,
          }));
          return { shard, seen };
        } catch (error) {
          return { shard, error };
        }
      }),
    );
    const pass: ClaimPass = { deliveries: [], served: [], redirected: new Map(), failed: new Map() };
    let queueLeaseTtlMs: number | undefined;
    let subscriptionFound = false;
    for (const probe of probes) {
      if ("seen" in probe && probe.seen) {
        pass.served.push(probe.shard);
        queueLeaseTtlMs ??= probe.seen.leaseTtlMs;
        if (probe.seen.hasSubscription) subscriptionFound = true;
      } else if (isCasqError(probe.error, "redirect")) pass.redirected.set(probe.shard, probe.error);
      else pass.failed.set(probe.shard, probe.error);
    }
    throwIfNothingServed(pass, manifest.shardCount);
    if (!subscriptionFound)
      throw new CasqError(
        "not_found",
        `subscription "${subscription}" does not exist on queue ${queue}; create it with AdminService.CreateSubscription`,
        { queue },
      );

    const session = new WorkSession(
      ctx,
      call,
      queue,
      subscription,
      workerId,
      manifest.shardCount,
      leaseTtlMs,
      open.credits,
      open.batchedJobs,
    );
    session.served = pass.served;
    session.redirects = pass.redirected;
    const effectiveTtl = leaseTtlMs ?? queueLeaseTtlMs ?? 60_000;
    session.outbox.push({
      requestId,
      event: {
        case: "opened",
        value: {
          sessionId: session.sessionId,
          brokerId: ctx.broker.identity.id,
          queue,
          subscription,
          leaseTtl: toDuration(effectiveTtl),
          heartbeatInterval: toDuration(Math.max(1, Math.floor(effectiveTtl / 3))),
          maxCredits: MAX_CREDITS,
          routing: await session.routing(),
        },
      },
    });
    ctx.logger.debug(
      { session: session.sessionId, queue, subscription, worker: workerId, credits: open.credits },
      "work stream opened",
    );
    return session;
  }

  /** Runs the session: yields every response until the stream ends. */
  async *run(requests: AsyncIterator<WorkRequest>): AsyncIterable<WorkResponseInit> {
    const unregister = this.ctx.work.add(this);
    const onCancel = () => this.finish(new CasqError("cancelled", "the worker cancelled the stream"));
    this.call.signal.addEventListener("abort", onCancel, { once: true });
    for (let shard = 0; shard < this.shardCount; shard++) {
      this.unsubscribers.push(
        this.ctx.broker.leader(this.queue, shard).onCommit((state) => this.checkLeases(state)),
      );
    }
    this.readRequests(requests).catch((error: unknown) => this.finish(error));
    this.claimLoopDone = this.claimLoop().catch((error: unknown) => this.finish(error));
    try {
      for await (const response of this.outbox) {
        if (response === this.drainingNotice) this.drainingTaken = true;
        yield response;
      }
    } finally {
      this.call.signal.removeEventListener("abort", onCancel);
      this.stopClaims();
      for (const off of this.unsubscribers.splice(0)) off();
      unregister();
      this.endedResolve();
    }
  }

  async drain(graceMs: number): Promise<void> {
    if (this.outbox.closed) return this.ended;
    this.stopClaims();
    await this.claimLoopDone;
    this.drainingNotice = { event: { case: "draining", value: { grace: toDuration(graceMs) } } };
    this.outbox.push(this.drainingNotice);
    const deadline = this.ctx.clock.now() + graceMs;
    while (!this.outbox.closed && (this.heldCount() > 0 || this.pending > 0)) {
      const remaining = deadline - this.ctx.clock.now();
      if (remaining <= 0) break;
      const timer = new AbortController();
      await Promise.race([this.changed(), this.ctx.clock.sleep(remaining, timer.signal).catch(() => {})]);
      timer.abort(WOKEN);
    }
    const reading = this.drainingTaken || this.outbox.closed;
    if (!reading) await this.releaseHeld();
    this.finish(new CasqError("unavailable", "broker shutting down: reconnect to another broker"));
    // A worker that does not read never lets the last messages out: reset the stream so the call ends.
    if (!reading) this.call.values.get(RESET_CALL)?.();
    return this.ended;
  }

  /**
   * Hands back every job this stream still holds (a nack with release: the
   * delivery does not count as an attempt), for a worker that stopped reading.
   */
  private async releaseHeld(): Promise<void> {
    const receipts = [...this.held.values()].flatMap((forShard) => [...forShard.keys()]);
    this.held.clear();
    if (receipts.length === 0) return;
    try {
      for (let i = 0; i < receipts.length; i += MAX_RECEIPTS)
        await nackReceipts(this.target(), receipts.slice(i, i + MAX_RECEIPTS), { release: true });
      this.ctx.logger.info(
        { session: this.sessionId, worker: this.workerId, queue: this.queue, released: receipts.length },
        "released the jobs of a Work stream that does not read, for other workers",
      );
    } catch (error) {
      this.ctx.logger.warn(
        { err: error, session: this.sessionId, worker: this.workerId, queue: this.queue },
        "could not release the jobs of a Work stream that does not read; their leases expire instead",
      );
    }
  }

  abort(reason: string): void {
    this.finish(new CasqError("unavailable", reason));
  }

  // ------------------------------------------------------------ requests

  private async readRequests(requests: AsyncIterator<WorkRequest>): Promise<void> {
    for (;;) {
      let next: IteratorResult<WorkRequest>;
      try {
        next = await requests.next();
      } catch (error) {
        // The request side failed (client cancelled or the connection broke).
        this.finish(error);
        return;
      }
      if (this.outbox.closed) return;
      if (next.done) break;
      this.dispatch(next.value);
    }
    // Half-close: no more jobs; answer what is outstanding, then end with OK.
    this.halfClosed = true;
    this.stopClaims();
    while (this.pending > 0 && !this.outbox.closed) await this.changed();
    this.finish(undefined);
  }

  private dispatch(request: WorkRequest): void {
    const command = request.command;
    switch (command.case) {
      case "open":
        throw invalid("open may only be the first message of a Work stream");
      case "credit": {
        const add = command.value.credits;
        if (add < 1) throw invalid("credit.credits must be at least 1");
        if (this.credits + add > MAX_CREDITS)
          throw invalid(
            `credit would raise the outstanding credit to ${this.credits + add}, above max_credits ${MAX_CREDITS}: grant one credit per finished job`,
          );
        this.credits += add;
        this.wakeClaims();
        return;
      }
      case "heartbeat": {
        const receipts = command.value.receipts;
        this.track(request.requestId, async () => {
          const reply = await heartbeatReceipts(this.target(), this.workerId, receipts);
          const lost = reply.lost.map((r) => receiptText(r.shard, r)).filter((text) => this.release(text));
          if (lost.length > 0) this.reportLost(lost, "lease lost (found by a heartbeat)");
          return { case: "heartbeated", value: { results: reply.results } };
        });
        return;
      }
      case "ack": {
        const receipts = command.value.receipts;
        for (const text of receipts) this.release(text);
        this.track(request.requestId, async () => ({
          case: "acked",
          value: { results: await ackReceipts(this.target(), receipts) },
        }));
        return;
      }
      case "nack": {
        const nack = command.value;
        this.track(request.requestId, async () => {
          const delayMs = checkNackDelay(nack.delay, "nack.delay");
          const reason = nackReason(nack.reason);
          for (const text of nack.receipts) this.release(text);
          const results = await nackReceipts(this.target(), nack.receipts, {
            ...(delayMs === undefined ? {} : { delayMs }),
            deadLetter: nack.deadLetter,
            release: nack.release,
            ...(reason === undefined ? {} : { reason }),
          });
          return { case: "nacked", value: { results } };
        });
        return;
      }
      default:
        throw invalid("empty WorkRequest: set one of open, credit, heartbeat, ack or nack");
    }
  }

  /** Runs one request concurrently and answers it by request id. */
  private track(requestId: bigint, work: () => Promise<WorkResponseInit["event"]>): void {
    this.pending += 1;
    work()
      .then(
        (event) => this.outbox.push({ requestId, event }),
        (error: unknown) =>
          this.outbox.push({
            requestId,
            event: { case: "requestFailed", value: { status: toRpcStatus(error, this.call.signal) } },
          }),
      )
      .finally(() => {
        this.pending -= 1;
        this.notifyChange();
      });
  }

  private target(): LeaseTarget {
    return {
      broker: this.ctx.broker,
      queue: this.queue,
      subscription: this.subscription,
      shardCount: this.shardCount,
    };
  }

  // ------------------------------------------------------------ jobs

  private async claimLoop(): Promise<void> {
    const all = Array.from({ length: this.shardCount }, (_, shard) => shard);
    let failures = 0;
    // The shards the last pass served, when it visited every shard and none failed (so they are
    // all the shards led here), and when the next pass is due at the latest.
    let served: readonly number[] = [];
    let passDue = 0;
    while (this.claiming) {
      const wake = this.wakeSignal();
      if (this.credits <= 0) {
        // Credit comes from the worker or back from a claim, and both wake the loop; the bound
        // only caps what a wake-up missed by a future change would cost the worker.
        await this.ctx.clock.sleep(PROBE_INTERVAL_MS, wake).catch(() => {});
        continue;
      }
      // A pass that could only claim nothing is skipped (each claim is a turn of a shard's
      // commit loop, which an enqueue may then wait behind): the claim stands at once. So after
      // a standing claim was filled, or the worker's credit came back, the stream claims only
      // when its shards hold something runnable; every shard is still visited at least every
      // PROBE_INTERVAL_MS.
      if (
        served.length > 0 &&
        this.ctx.clock.now() < passDue &&
        !this.ctx.claimer.mayHaveRunnable(this.queue, served, this.subscription)
      ) {
        await this.waitForJobs(served, wake, passDue);
        continue;
      }
      const pass = await this.ctx.claimer.claimOnce(
        {
          queue: this.queue,
          subscription: this.subscription,
          workerId: this.workerId,
          max: this.credits,
          leaseTtlMs: this.leaseTtlOverrideMs,
          signal: this.claimAbort.signal,
          // Claims what the credit holds when the claim is applied, and takes it then.
          credit: this.credit,
        },
        all,
      );
      this.sendJobs(pass.deliveries);
      if (!this.claiming) return;
      this.updateRouting(pass);
      // A pass that stopped when the credit ran out, or met a failing shard, says nothing of the
      // shards it did not serve: the next one visits them all again.
      const visitedAll = pass.served.length + pass.redirected.size === this.shardCount;
      served = visitedAll ? pass.served : [];
      passDue = this.ctx.clock.now() + PROBE_INTERVAL_MS;
      if (pass.served.length === 0) {
        // Nothing could be asked. A redirect (every shard led elsewhere), a
        // missing queue or subscription, or an unreadable document ends the
        // stream; a store outage is retried with backoff.
        const failed = [...pass.failed.values()];
        const fatal = failed.find(
          (e) => !isCasqError(e) || (e.code !== "unavailable" && e.code !== "cancelled"),
        );
        const redirect = pass.redirected.values().next();
        const ending = fatal ?? (failed.length === 0 && !redirect.done ? redirect.value : undefined);
        if (ending !== undefined) {
          this.stopClaims();
          await this.settleThenFinish(ending);
          return;
        }
        failures += 1;
        await this.ctx.clock.sleep(backoffCap(failures, CLAIM_RETRY_BACKOFF), wake).catch(() => {});
        continue;
      }
      failures = 0;
      if (pass.deliveries.length > 0) continue;
      await this.waitForJobs(pass.served, wake, passDue);
    }
  }

  /**
   * With credit and nothing runnable: stands a claim on each served shard
   * (it rides in the next commit that leaves something runnable: the jobs
   * come with that commit, see {@link sendStanding}), and wakes on such a
   * commit, on a wake-up (credit, stop), or at `deadline`.
   */
  private async waitForJobs(served: readonly number[], wake: AbortSignal, deadline: number): Promise<void> {
    const stop = new AbortController();
    const onWake = () => stop.abort(WOKEN);
    wake.addEventListener("abort", onWake, { once: true });
    const unstand = this.ctx.claimer.stand(this.queue, served, {
      subscription: this.subscription,
      workerId: this.workerId,
      leaseTtlMs: this.leaseTtlOverrideMs,
      credit: this.credit,
      deliver: (shard, messages) => {
        this.sendStanding(shard, messages);
        stop.abort(WOKEN);
      },
    });
    try {
      if (wake.aborted) return;
      await this.ctx.claimer.waitForRunnable(this.queue, served, this.subscription, deadline, stop.signal);
    } finally {
      unstand();
      wake.removeEventListener("abort", onWake);
    }
  }

  /** Sends the jobs a standing claim got (their credit was taken when the claim was applied). */
  private sendStanding(shard: number, messages: readonly ClaimedMessage[]): void {
    const now = this.ctx.clock.now();
    const live = messages.filter((message) => message.leaseDeadline > now);
    // Leases that ran out before their commit was answered are not sent; they are redelivered.
    // Their credit comes back (the loop may have stopped for want of it since the claim stood).
    returnCredit(this.credit, messages.length - live.length);
    this.sendJobs(live.map((message) => ({ shard, message })));
  }

  /** Sends claimed jobs and holds them; false (nothing sent) once the worker half-closed or the stream ended. */
  private sendJobs(deliveries: readonly Delivery[]): boolean {
    if (this.halfClosed || this.outbox.closed) {
      if (deliveries.length > 0)
        this.ctx.logger.debug(
          { session: this.sessionId, claimed: deliveries.length },
          "jobs claimed as the worker half-closed were not sent; their leases will expire",
        );
      return false;
    }
    recordDeliveries(this.call.values, this.queue, deliveries); // Telemetry: tracing
    for (const d of deliveries) this.hold(d.shard, d.message.receipt);
    if (this.batchedJobs && deliveries.length > 1) {
      for (const batch of jobBatches(deliveries))
        this.outbox.push({
          event: {
            case: "jobs",
            value: { jobs: batch.map((d) => claimedToProto(this.queue, d.shard, d.message)) },
          },
        });
    } else {
      for (const d of deliveries)
        this.outbox.push({ event: { case: "job", value: claimedToProto(this.queue, d.shard, d.message) } });
    }
    return true;
  }

  private stopClaims(): void {
    this.claiming = false;
    this.claimAbort.abort();
    this.wakeClaims();
  }

  private wakeClaims(): void {
    this.wakeController.abort(WOKEN);
  }

  /** The signal that the next {@link wakeClaims} aborts (taken before checking state, so no wake-up is missed). */
  private wakeSignal(): AbortSignal {
    if (this.wakeController.signal.aborted) this.wakeController = new AbortController();
    return this.wakeController.signal;
  }

  // ------------------------------------------------------------ routing

  /**
   * Sends `routing` when the served shards changed, or when a redirect names
   * a leader for a shard that the routing last sent did not: the worker opens
   * streams by that routing, and a shard whose leader moved while this
   * stream's served set stayed the same would otherwise never be worked on
   * (e.g. a shard this broker still believed it led, behind a partition,
   * then lost to another broker).
   */
  private updateRouting(pass: ClaimPass): void {
    if (this.claimAbort.signal.aborted) return;
    const served = [...pass.served].sort((a, b) => a - b);
    this.redirects = pass.redirected;
    const sameServed = served.length === this.served.length && served.every((s, i) => s === this.served[i]);
    const moved = [...pass.redirected].some(([shard, redirect]) => {
      const address = redirect.details.leaderAddress;
      return address !== undefined && address !== this.toldLeaders.get(shard);
    });
    if (sameServed && !moved) return;
    this.served = served;
    this.routing().then(
      (routing) => this.outbox.push({ event: { case: "routing", value: routing } }),
      () => {},
    );
  }

  /**
   * The routing to send: the served shards and every shard's leader, from the
   * directory, except where the latest redirect names another leader (the
   * redirect comes from the shard's leader object, which learned it by CAS;
   * the directory may still hold what it read before).
   */
  private async routing() {
    const routes = await this.ctx.directory.routes(this.queue, this.shardCount);
    const shards = routes.map((r) => {
      const redirect = this.redirects.get(r.shard)?.details;
      const recorded = r.live && r.record ? leaderToProto(r.record) : undefined;
      const leader =
        redirect?.leaderAddress !== undefined && redirect.leaderAddress !== recorded?.address
          ? create(ShardLeaderSchema, {
              brokerId: redirect.leaderId ?? "",
              address: redirect.leaderAddress,
              epoch: BigInt(redirect.epoch ?? 0),
            })
          : recorded;
      if (leader === undefined) this.toldLeaders.delete(r.shard);
      else this.toldLeaders.set(r.shard, leader.address);
      return { shard: r.shard, ...(leader ? { leader } : {}) };
    });
    return { servingShards: [...this.served], shards };
  }

  // ------------------------------------------------------------ leases

  private hold(shard: number, receipt: Receipt): void {
    const forShard = this.held.get(shard) ?? new Map<string, Receipt>();
    this.held.set(shard, forShard);
    forShard.set(receiptText(shard, receipt), receipt);
  }

  /** Forgets a job the worker settled or lost; true when it was held by this stream. */
  private release(text: string): boolean {
    for (const forShard of this.held.values()) {
      if (forShard.delete(text)) {
        this.notifyChange();
        return true;
      }
    }
    return false;
  }

  private heldCount(): number {
    let n = 0;
    for (const forShard of this.held.values()) n += forShard.size;
    return n;
  }

  /** After a commit of a shard: reports held jobs whose lease this worker no longer holds. */
  private checkLeases(state: ShardState): void {
    const forShard = this.held.get(state.shard);
    if (!forShard || forShard.size === 0 || this.outbox.closed) return;
    // At most one check per shard every LEASE_CHECK_MS: a skipped commit is covered by a later
    // one (an idle leader still commits a lease renewal every few seconds).
    const now = this.ctx.clock.now();
    if (now - (this.lastLeaseCheck.get(state.shard) ?? 0) < LEASE_CHECK_MS) return;
    this.lastLeaseCheck.set(state.shard, now);
    const lost = new Map<string, string[]>();
    for (const [text, receipt] of forShard) {
      const reason = lostReason(state, this.subscription, receipt);
      if (reason === undefined) continue;
      forShard.delete(text);
      const list = lost.get(reason) ?? [];
      lost.set(reason, list);
      list.push(text);
    }
    if (lost.size === 0) return;
    for (const [reason, receipts] of lost) this.reportLost(receipts, reason);
    this.notifyChange();
  }

  private reportLost(receipts: string[], reason: string): void {
    this.outbox.push({ event: { case: "leasesLost", value: { receipts, reason } } });
  }

  // ------------------------------------------------------------ ending

  /** Ends the stream: OK when `error` is undefined, else with that error's status. */
  private finish(error: unknown): void {
    if (this.outbox.closed) return;
    this.stopClaims();
    if (error === undefined) this.outbox.end();
    else this.outbox.fail(error);
    this.notifyChange();
  }

  /** Waits for outstanding requests to be answered, then ends with `error`. */
  private async settleThenFinish(error: unknown): Promise<void> {
    while (this.pending > 0 && !this.outbox.closed) await this.changed();
    this.finish(error);
  }

  private changed(): Promise<void> {
    return new Promise<void>((resolve) => this.changeWaiters.push(resolve));
  }

  private notifyChange(): void {
    for (const resolve of this.changeWaiters.splice(0)) resolve();
  }
}

/** Why a worker no longer holds a delivery, or undefined when it still does. */
function lostReason(state: ShardState, subscription: string, receipt: Receipt): string | undefined {
  const inspection = inspectMessage(state, receipt.offset);
  if (inspection === undefined) return "the message left the queue (purged, or its queue was deleted)";
  const status = inspection.subscriptions[subscription];
  if (status === undefined) return "the subscription was deleted";
  if (status.state === "in_flight") return status.attempts === receipt.attempt ? undefined : "lease expired";
  if (status.state === "pending") return "lease expired";
  if (status.state === "dead_lettered") return "dead-lettered";
  return "settled elsewhere (acked or purged)";
}

/** A 128-bit session id in hex, drawn from `random` (the engine's, so that a simulation can seed it). */
function sessionIdFrom(random: Random): string {
  let id = "";
  for (let i = 0; i < 4; i++)
    id += Math.floor(random.next() * 2 ** 32)
      .toString(16)
      .padStart(8, "0");
  return id;
}
