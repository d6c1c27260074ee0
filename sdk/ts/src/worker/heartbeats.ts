/**
 * Heartbeats of a run: every interval the broker asked for, each held job
 * not yet settled is heartbeated on the stream that delivered it (or, that
 * stream gone or redirected, by unary call per shard), in chunks of 500; a
 * lease the broker reports lost is passed on.
 */

import { HeartbeatOutcome, type HeartbeatResult } from "@casq/api/casq/v1/message_pb.ts";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import { startInterval } from "../clock.ts";
import { isRetryable, RedirectError, toCasqError } from "../errors.ts";
import { callWithFailover } from "../failover.ts";
import type { BrokerPool } from "../transport.ts";
import { type Session, StreamClosedError } from "../work-session.ts";
import type { Held } from "./held-job.ts";
import type { Reporter } from "./reporter.ts";

/** What {@link Heartbeats} work with. */
export interface HeartbeatsOptions {
  readonly pool: BrokerPool;
  readonly queue: string;
  /** The run's subscription ("" for the default). */
  readonly subscription: string;
  readonly workerId: string;
  /** The run's held jobs, by receipt. */
  readonly held: ReadonlyMap<string, Held>;
  readonly reporter: Reporter;
  /** Called for each job whose lease a heartbeat found lost. */
  readonly lost: (receipt: string, reason: string) => void;
}

/** The heartbeat timer of one run. */
export class Heartbeats {
  private stopTimer: (() => void) | undefined;
  private ms = 0;
  private readonly pool: BrokerPool;
  private readonly queue: string;
  private readonly subscription: string;
  private readonly workerId: string;
  private readonly held: ReadonlyMap<string, Held>;
  private readonly reporter: Reporter;
  private readonly lost: (receipt: string, reason: string) => void;

  /** Heartbeats for one run; none are sent before {@link start}. */
  constructor(options: HeartbeatsOptions) {
    this.pool = options.pool;
    this.queue = options.queue;
    this.subscription = options.subscription;
    this.workerId = options.workerId;
    this.held = options.held;
    this.reporter = options.reporter;
    this.lost = options.lost;
  }

  /** Heartbeats every `ms` from now (a no-op when already at that interval). */
  start(ms: number): void {
    if (this.ms === ms && this.stopTimer) return;
    this.clear();
    this.ms = ms;
    this.stopTimer = startInterval(this.pool.options.clock, ms, () => void this.heartbeat(), { unref: true });
  }

  /** Stops the timer (a heartbeat under way still finishes). */
  clear(): void {
    this.stopTimer?.();
    this.stopTimer = undefined;
  }

  /** Heartbeats every running job, each on the stream that delivered it (or by unary call). */
  private async heartbeat(): Promise<void> {
    const bySession = new Map<Session, Held[]>();
    for (const held of this.held.values()) {
      if (held.settled || held.abandoned) continue;
      const helds = bySession.get(held.session) ?? [];
      helds.push(held);
      bySession.set(held.session, helds);
    }
    await Promise.all(
      [...bySession].map(async ([session, helds]) => {
        for (let i = 0; i < helds.length; i += 500)
          await this.heartbeatChunk(session, helds.slice(i, i + 500));
      }),
    );
  }

  private async heartbeatChunk(session: Session, chunk: readonly Held[]): Promise<void> {
    let leader: string | undefined;
    if (session.usable) {
      try {
        const receipts = chunk.map((held) => held.job.receipt);
        const reply = await session.request({ case: "heartbeat", value: { receipts } });
        if (reply.event.case === "heartbeated") return this.passOn(reply.event.value.results);
      } catch (thrown) {
        const error = toCasqError(thrown);
        if (error instanceof RedirectError) leader = error.leaderAddress;
        else if (!(error instanceof StreamClosedError) && !isRetryable(error))
          return this.reporter.report(error);
      }
    }
    // By unary call, one per shard (as settles go): a broker heartbeats the receipts of the
    // shards it leads and redirects for the rest, so one call over shards of two leaders
    // would bounce between them and extend no lease.
    const byShard = new Map<number, string[]>();
    for (const held of chunk) {
      const receipts = byShard.get(held.job.shard) ?? [];
      receipts.push(held.job.receipt);
      byShard.set(held.job.shard, receipts);
    }
    await Promise.all([...byShard.values()].map((receipts) => this.heartbeatByCall(receipts, leader)));
  }

  private async heartbeatByCall(receipts: string[], leader: string | undefined): Promise<void> {
    try {
      const response = await callWithFailover(
        this.pool,
        ({ address, timeoutMs }) =>
          this.pool
            .client(QueueService, address)
            .heartbeat(
              { queue: this.queue, subscription: this.subscription, workerId: this.workerId, receipts },
              { timeoutMs },
            ),
        { ...(leader ? { address: leader } : {}), maxAttempts: 3 },
      );
      this.passOn(response.results);
    } catch (error) {
      this.reporter.report(error);
    }
  }

  /** Passes on the leases a heartbeat found lost. */
  private passOn(results: readonly HeartbeatResult[]): void {
    for (const r of results)
      if (r.outcome === HeartbeatOutcome.LOST) this.lost(r.receipt, "heartbeat: lease lost");
  }
}
