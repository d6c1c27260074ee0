/**
 * Settling held jobs, the completer of a run: each job is acked or nacked
 * exactly once, on the stream that delivered it or, that stream gone or the
 * request redirected, by unary call to the shard's leader; an answer that did
 * not do what was asked is reported. Also the credit ledger: a job's credit
 * goes back to its stream once, when its handler finished (its ack or nack
 * then rides with the next claims, instead of holding a slot for a commit) or
 * when it is dropped unstarted; a stream opened after another ended takes
 * over the credit of that stream's jobs.
 *
 * Batching: acks, releases and credit grants are not sent one per job. They
 * collect until the event loop has handled what is ready now (a
 * `setImmediate`), then each stream gets one `ack` request per 500 receipts,
 * one release `nack` per 500 and one `credit` message for everything its
 * window allows. A batch of handlers that finished together (the jobs of one
 * claim) thus costs a few stream messages and one reply, not three messages
 * per job. Nacks of failed handlers carry their own reason and go one by one.
 */

import type { AckResult, NackResult } from "@casq/api/casq/v1/message_pb.ts";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import type { SettleOperation } from "../errors.ts";
import { isRetryable, RedirectError, toCasqError } from "../errors.ts";
import { callWithFailover } from "../failover.ts";
import { settleError } from "../settle-outcome.ts";
import type { BrokerPool } from "../transport.ts";
import { type Command, type Session, StreamClosedError } from "../work-session.ts";
import type { Held } from "./held-job.ts";
import type { Reporter } from "./reporter.ts";

/** What a handler's end asks for: an ack, or a nack (dead-letter when the handler threw `DeadLetterError`). */
export type Outcome = { kind: "ack" } | { kind: "nack"; deadLetter: boolean; reason: string };

/** What a {@link Settler} works with. */
export interface SettlerOptions {
  readonly pool: BrokerPool;
  readonly queue: string;
  /** The run's subscription ("" for the default). */
  readonly subscription: string;
  /** The run's held jobs, by receipt; a job leaves it when it is settled or dropped. */
  readonly held: Map<string, Held>;
  readonly reporter: Reporter;
  /** True once the run stops: credits no longer go back (no more jobs are wanted). */
  readonly stopping: () => boolean;
  /** Called after a job left the held set. */
  readonly forgotten: () => void;
}

/** Receipts per batched ack or release (as heartbeats; within the default max_batch of 1000). */
const BATCH = 500;

type SettleCommand = Extract<Command, { case: "ack" | "nack" }>;

/** A job waiting in a batch, and the end of its settle. */
interface Pending {
  readonly held: Held;
  readonly done: () => void;
}

/** What one stream has waiting for the next flush. */
interface StreamBatch {
  acks: Pending[];
  releases: Pending[];
  /** Its window may allow more credit. */
  credit: boolean;
}

/** Acks, nacks and releases held jobs, and gives their credits back. */
export class Settler {
  private readonly settles = new Set<Promise<void>>();
  private readonly batches = new Map<Session, StreamBatch>();
  private flushScheduled = false;
  private readonly pool: BrokerPool;
  private readonly queue: string;
  private readonly subscription: string;
  private readonly held: Map<string, Held>;
  private readonly reporter: Reporter;
  private readonly stopping: () => boolean;
  private readonly forgotten: () => void;

  /** A settler for one run. */
  constructor(options: SettlerOptions) {
    this.pool = options.pool;
    this.queue = options.queue;
    this.subscription = options.subscription;
    this.held = options.held;
    this.reporter = options.reporter;
    this.stopping = options.stopping;
    this.forgotten = options.forgotten;
  }

  /**
   * Settles a job whose handler finished: gives its credit back at once, then
   * acks or nacks it; resolves when that is done (or failed and reported).
   */
  complete(held: Held, outcome: Outcome): Promise<void> {
    this.returnCredit(held);
    // A lost lease does not stop the ack: the broker accepts it if nobody claimed the message since.
    if (outcome.kind === "ack") return this.batched(held, "acks");
    return this.track(
      this.settle(held, {
        case: "nack",
        value: {
          receipts: [held.job.receipt],
          deadLetter: outcome.deadLetter,
          reason: outcome.reason.slice(0, 2048),
        },
      }),
    );
  }

  /** Settles when every ack and nack begun so far has. */
  settled(): Promise<unknown> {
    return Promise.allSettled([...this.settles]);
  }

  private track(p: Promise<void>): Promise<void> {
    this.settles.add(p);
    return p.finally(() => this.settles.delete(p));
  }

  /**
   * Gives a job back unprocessed (one that was buffered or arrived while
   * stopping): a release is claimable again at once and does not count as an
   * attempt.
   */
  release(held: Held): void {
    void this.batched(held, "releases");
  }

  /** The window of `session` may allow more credit: grant it with the next flush. */
  creditChanged(session: Session): void {
    this.batchOf(session).credit = true;
    this.scheduleFlush();
  }

  private batchOf(session: Session): StreamBatch {
    let batch = this.batches.get(session);
    if (!batch) {
      batch = { acks: [], releases: [], credit: false };
      this.batches.set(session, batch);
    }
    return batch;
  }

  /** Puts `held` in its stream's next ack or release batch; resolves when it is settled. */
  private batched(held: Held, kind: "acks" | "releases"): Promise<void> {
    if (held.settled) return Promise.resolve();
    held.settled = true;
    return this.track(
      new Promise<void>((done) => {
        this.batchOf(held.session)[kind].push({ held, done });
        this.scheduleFlush();
      }),
    );
  }

  private scheduleFlush(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    setImmediate(() => this.flush());
  }

  /** Sends what collected: per stream its acks, its releases, then its credit. */
  private flush(): void {
    this.flushScheduled = false;
    const batches = [...this.batches];
    this.batches.clear();
    for (const [session, batch] of batches) {
      // Acks before the credit: the broker queues them first, so they ride in the commit of the claims.
      for (let i = 0; i < batch.acks.length; i += BATCH)
        void this.sendBatch(session, "ack", batch.acks.slice(i, i + BATCH));
      for (let i = 0; i < batch.releases.length; i += BATCH)
        void this.sendBatch(session, "release", batch.releases.slice(i, i + BATCH));
      if (batch.credit && !this.stopping() && session.usable) {
        const credits = session.credit.takeGrant();
        if (credits > 0) session.send({ case: "credit", value: { credits } });
      }
    }
  }

  private commandOf(kind: "ack" | "release", receipts: string[]): SettleCommand {
    return kind === "ack"
      ? { case: "ack", value: { receipts } }
      : { case: "nack", value: { receipts, release: true, reason: "worker stopping" } };
  }

  /**
   * Settles one batch of jobs delivered by `session`: one request on the
   * stream; that stream gone, broken or redirected, by unary call per shard
   * (to the redirect's leader when there was one).
   */
  private async sendBatch(session: Session, kind: "ack" | "release", batch: Pending[]): Promise<void> {
    let leader: string | undefined;
    let sentOnStream = false;
    try {
      if (session.usable) {
        const command = this.commandOf(
          kind,
          batch.map((p) => p.held.job.receipt),
        );
        try {
          const reply = await session.request(command);
          const event = reply.event;
          const results = event.case === "acked" || event.case === "nacked" ? event.value.results : [];
          this.checkBatch(batch, command.case, results, false);
          return;
        } catch (thrown) {
          const error = toCasqError(thrown);
          if (error instanceof RedirectError) leader = error.leaderAddress;
          else if (!(error instanceof StreamClosedError) && !isRetryable(error)) throw error;
          else sentOnStream = true;
        }
      }
      const byShard = new Map<number, Pending[]>();
      for (const p of batch) {
        const part = byShard.get(p.held.job.shard);
        if (part) part.push(p);
        else byShard.set(p.held.job.shard, [p]);
      }
      await Promise.all(
        [...byShard.values()].map(async (part) => {
          try {
            const command = this.commandOf(
              kind,
              part.map((p) => p.held.job.receipt),
            );
            const { results, uncertain } = await this.unary(command, leader, sentOnStream);
            this.checkBatch(part, command.case, results, uncertain);
          } catch (error) {
            // Not settled: the leases expire and the jobs are redelivered (at-least-once).
            for (const p of part) this.reporter.report(error, p.held.job, "error");
          }
        }),
      );
    } catch (error) {
      for (const p of batch) this.reporter.report(error, p.held.job, "error");
    } finally {
      for (const p of batch) {
        this.forget(p.held);
        p.done();
      }
    }
  }

  /** Reports, per job of a batch, an answer that did not do what was asked. */
  private checkBatch(
    batch: readonly Pending[],
    operation: SettleOperation,
    results: readonly (AckResult | NackResult)[],
    resent: boolean,
  ): void {
    const byReceipt = new Map<string, AckResult | NackResult>();
    for (const r of results) byReceipt.set(r.receipt, r);
    for (const { held } of batch) {
      const result = byReceipt.get(held.job.receipt);
      this.checkSettled(held, operation, result ? [result] : [], resent);
    }
  }

  /**
   * Acks or nacks one held job exactly once: on the stream that delivered it,
   * or (that stream gone, or the request redirected) by unary call to the leader.
   */
  private async settle(held: Held, command: SettleCommand): Promise<void> {
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
      const { results, uncertain } = await this.unary(command, leader, sentOnStream);
      this.checkSettled(held, command.case, results, uncertain);
    } catch (error) {
      // Not settled: the lease expires and the job is redelivered (at-least-once).
      this.reporter.report(error, held.job, "error");
    } finally {
      this.forget(held);
    }
  }

  /**
   * Sends an ack or nack by unary call through failover (to `leader` first
   * when a redirect named one); `uncertain` in the answer: it answers a
   * resend after an attempt that may have been applied (`sentOnStream`: the
   * request went out on a stream that then broke).
   */
  private async unary(
    command: SettleCommand,
    leader: string | undefined,
    sentOnStream: boolean,
  ): Promise<{ results: (AckResult | NackResult)[]; uncertain: boolean }> {
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
    return { results: response.results, uncertain };
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
    if (error) this.reporter.report(error, held.job);
  }

  /** Drops a job from the held set and grants its credit back to its stream if it has not yet. */
  forget(held: Held): void {
    if (!this.held.delete(held.job.receipt)) return;
    this.returnCredit(held);
    this.forgotten();
  }

  /** Gives a job's credit back to its stream's window, once; the next flush grants what the window allows. */
  private returnCredit(held: Held): void {
    if (held.creditReturned) return;
    held.creditReturned = true;
    const session = held.creditTo;
    session.credit.returned();
    // Not while stopping: no more jobs are wanted.
    if (!this.stopping() && session.usable) this.creditChanged(session);
  }

  /**
   * Gives a new stream the credit of up to `max` held jobs of streams that
   * ended (their credit not back yet); returns how many it took over.
   */
  adoptCredits(session: Session, max: number): number {
    let adopted = 0;
    for (const held of this.held.values()) {
      if (adopted >= max) break;
      if (held.creditTo.closed && !held.creditReturned) {
        held.creditTo = session;
        adopted++;
      }
    }
    session.credit.adopt(adopted);
    return adopted;
  }
}
