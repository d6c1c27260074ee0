/**
 * Settling held jobs, the completer of a run: each job is acked or nacked
 * exactly once, on the stream that delivered it or, that stream gone or the
 * request redirected, by unary call to the shard's leader; an answer that did
 * not do what was asked is reported. Also the credit ledger: a job's credit
 * goes back to its stream once, when its handler finished (its ack or nack
 * then rides with the next claims, instead of holding a slot for a commit) or
 * when it is dropped unstarted; a stream opened after another ended takes
 * over the credit of that stream's jobs.
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

/** Acks, nacks and releases held jobs, and gives their credits back. */
export class Settler {
  private readonly settles = new Set<Promise<void>>();
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
    return this.track(
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
   * Gives a job back unprocessed (e.g. one that arrived while stopping): a
   * release is claimable again at once and does not count as an attempt.
   */
  release(held: Held): void {
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
      this.reporter.report(error, held.job, "error");
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
    if (error) this.reporter.report(error, held.job);
  }

  /** Drops a job from the held set and grants its credit back to its stream if it has not yet. */
  forget(held: Held): void {
    if (!this.held.delete(held.job.receipt)) return;
    this.returnCredit(held);
    this.forgotten();
  }

  /** Grants a job's credit back to its stream, once (not while stopping: no more jobs are wanted). */
  private returnCredit(held: Held): void {
    if (held.creditReturned) return;
    held.creditReturned = true;
    const session = held.creditTo;
    if (!this.stopping() && session.usable) session.send({ case: "credit", value: { credits: 1 } });
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
    return adopted;
  }
}
