/**
 * Claims across the shards of a queue, for the Claim RPC and the Work stream.
 *
 * A claim visits the queue's shards round-robin and asks each shard's
 * leader for what is still wanted; each shard's claim is one operation of
 * that shard's group commit, so a message is returned only once its lease is
 * durable. Shards led by another broker answer with a redirect and are
 * skipped: the claim serves the shards this broker leads (taking over shards
 * whose leader is gone), and fails with a redirect only when every shard is
 * led elsewhere. A shard that fails otherwise (store outage, unreadable
 * document) does not hide the others; its error is raised only when no shard
 * could be asked at all.
 *
 * Long poll: when nothing is runnable, {@link ShardClaimer.waitForRunnable}
 * listens to the commits of the served shards and wakes as soon as one
 * leaves a runnable message for the subscription (an enqueue, a nack, an
 * expired lease, a delayed message coming due — the leader's timer commits
 * then), or when the wait ends. A Work stream also stands a claim on them
 * ({@link ShardClaimer.stand}): it is applied in the commit that makes
 * something runnable, so the job leaves with that commit, not the next.
 *
 * A pass with the consumer's credit (a Work stream's) claims on each shard
 * what the credit holds when that shard's claim is applied (see
 * ShardLeader.submit), not what it held when the pass began.
 *
 * Deliveries whose lease ran out before the pass returned (a slow store, an
 * ambiguous write resolved late, a slow shard later in the walk) are
 * dropped: the worker could no longer hold them, and the message may even
 * have been redelivered and acked meanwhile. They are redelivered, exactly
 * as if the answer had been lost (found by the simulation, seed 2971).
 *
 * `Broker.claim` (the engine's API), the Claim RPC and the Work stream all
 * claim through this one walker.
 */
import { CasqError, isCasqError } from "../errors.ts";
import type { ClaimedMessage } from "../model/operations.ts";
import type { ShardState } from "../model/shard-state.ts";
import { hasRunnable } from "../model/shard-stats.ts";
import { type Clock, TIMER_STOPPED } from "../util/clock.ts";
import { expectKind } from "./operation-effects.ts";
import { type ClaimCredit, returnCredit, type ShardLeader, type StandingClaim } from "./shard-leader.ts";

/** A claimed message and the shard it came from. */
export interface Delivery {
  readonly shard: number;
  readonly message: ClaimedMessage;
}

/** What the claimer needs from the broker: the leader object of a shard. */
export interface ShardLeaders {
  leader(queue: string, shard: number): ShardLeader;
}

/** What to claim. */
export interface ClaimParams {
  readonly queue: string;
  readonly subscription: string;
  readonly workerId: string;
  /** Most messages, at least 1 (with `credit`: what it held when the pass started). */
  readonly max: number;
  /** Lease TTL; undefined means the queue's. */
  readonly leaseTtlMs: number | undefined;
  readonly signal?: AbortSignal;
  /**
   * The consumer's credit (a Work stream's): each shard's claim claims what
   * it holds when that claim is applied and takes it from it then (see
   * ShardLeader.submit), so credit gained while the pass waits on a write is
   * used by it. Deliveries dropped for a lease already run out give theirs back.
   */
  readonly credit?: ClaimCredit;
}

/** The result of one pass over the shards. */
export interface ClaimPass {
  readonly deliveries: Delivery[];
  /** Shards that answered (this broker leads them now). */
  readonly served: number[];
  /** Shards led by another broker, with the redirect each answered. */
  readonly redirected: Map<number, CasqError>;
  /** Shards that failed otherwise, with their errors. */
  readonly failed: Map<number, unknown>;
}

/** Claims from shard leaders (see the module header). */
export class ShardClaimer {
  private readonly broker: ShardLeaders;
  private readonly clock: Clock;
  private readonly cursor = new Map<string, number>();

  constructor(broker: ShardLeaders, clock: Clock) {
    this.broker = broker;
    this.clock = clock;
  }

  /** One pass over `shards`, starting round-robin, until `max` messages are claimed. */
  async claimOnce(params: ClaimParams, shards: readonly number[]): Promise<ClaimPass> {
    const pass: ClaimPass = { deliveries: [], served: [], redirected: new Map(), failed: new Map() };
    if (shards.length === 0) return pass;
    const start = this.nextStart(params.queue, shards.length);
    const credit = params.credit;
    const wanted = () =>
      credit === undefined ? params.max - pass.deliveries.length : Math.floor(credit.available);
    for (let i = 0; i < shards.length && wanted() > 0; i++) {
      const shard = shards[(start + i) % shards.length] as number;
      try {
        const result = expectKind(
          await this.broker.leader(params.queue, shard).submit(
            {
              kind: "claim",
              subscription: params.subscription,
              workerId: params.workerId,
              max: wanted(),
              ...(params.leaseTtlMs === undefined ? {} : { leaseTtlMs: params.leaseTtlMs }),
            },
            {
              ...(params.signal ? { signal: params.signal } : {}),
              ...(credit ? { credit } : {}),
            },
          ),
          "claim",
        );
        pass.served.push(shard);
        for (const message of result.messages) pass.deliveries.push({ shard, message });
      } catch (error) {
        if (isCasqError(error, "redirect")) pass.redirected.set(shard, error);
        else pass.failed.set(shard, error);
        // A cancelled call stops the pass.
        if (params.signal?.aborted) break;
      }
    }
    const now = this.clock.now();
    const live = pass.deliveries.filter((delivery) => delivery.message.leaseDeadline > now);
    if (credit) returnCredit(credit, pass.deliveries.length - live.length);
    pass.deliveries.splice(0, pass.deliveries.length, ...live);
    return pass;
  }

  /**
   * The Claim RPC: claim from every shard; when nothing is runnable, wait up
   * to `waitMs` for a commit that makes something runnable, then claim again.
   */
  async claim(params: ClaimParams, shardCount: number, waitMs: number): Promise<Delivery[]> {
    const all = Array.from({ length: shardCount }, (_, shard) => shard);
    const deadline = this.clock.now() + waitMs;
    for (;;) {
      const pass = await this.claimOnce(params, all);
      if (pass.deliveries.length > 0) return pass.deliveries;
      throwIfNothingServed(pass, shardCount);
      if (params.signal?.aborted) throw cancelled();
      if (this.clock.now() >= deadline) return [];
      await this.waitForRunnable(params.queue, pass.served, params.subscription, deadline, params.signal);
      if (params.signal?.aborted) throw cancelled();
    }
  }

  /**
   * Resolves when a commit on one of `shards` leaves a runnable message for
   * `subscription`, at `deadline`, or when `signal` aborts (never rejects).
   */
  waitForRunnable(
    queue: string,
    shards: readonly number[],
    subscription: string,
    deadline: number,
    signal?: AbortSignal,
  ): Promise<void> {
    return new Promise<void>((resolve) => {
      const timer = new AbortController();
      const unsubscribers: (() => void)[] = [];
      let done = false;
      const finish = () => {
        if (done) return;
        done = true;
        for (const off of unsubscribers) off();
        timer.abort(TIMER_STOPPED);
        signal?.removeEventListener("abort", finish);
        resolve();
      };
      if (signal?.aborted) return finish();
      signal?.addEventListener("abort", finish, { once: true });
      this.clock.sleep(Math.max(0, deadline - this.clock.now()), timer.signal).then(finish, () => {});
      const onCommit = (state: ShardState) => {
        if (hasRunnable(state, subscription, this.clock.now())) finish();
      };
      for (const shard of shards) {
        let leader: ShardLeader;
        try {
          leader = this.broker.leader(queue, shard);
        } catch {
          return finish();
        }
        unsubscribers.push(leader.onCommit(onCommit));
        // A commit may have landed between the claim and this subscription: look once more,
        // at the state in memory when there is one (a turn of the commit loop costs more).
        const runnable = leader.runnableNow(subscription);
        if (runnable === true) return finish();
        if (runnable === false) continue;
        leader
          .read((state) => hasRunnable(state, subscription, this.clock.now()))
          .then(
            (found) => {
              if (found) finish();
            },
            () => finish(),
          );
      }
    });
  }

  /**
   * Whether a claim on `shards` may find something for `subscription` now:
   * false only when every one of them is led here with its state in memory
   * and has nothing runnable (see ShardLeader.runnableNow), so a consumer
   * that would only claim nothing can stand its claim at once instead.
   */
  mayHaveRunnable(queue: string, shards: readonly number[], subscription: string): boolean {
    for (const shard of shards) {
      let runnable: boolean | undefined;
      try {
        runnable = this.broker.leader(queue, shard).runnableNow(subscription);
      } catch {
        return true; // the claim says what is wrong
      }
      if (runnable !== false) return true;
    }
    return false;
  }

  /**
   * Stands `claim` on each of `shards` (see {@link StandingClaim}); their
   * `credit` is shared, so together they never claim more than it holds.
   * Returns the function that withdraws them all.
   */
  stand(
    queue: string,
    shards: readonly number[],
    claim: Omit<StandingClaim, "deliver"> & {
      deliver(shard: number, messages: readonly ClaimedMessage[]): void;
    },
  ): () => void {
    const withdraw: (() => void)[] = [];
    for (const shard of shards) {
      let leader: ShardLeader;
      try {
        leader = this.broker.leader(queue, shard);
      } catch {
        continue;
      }
      withdraw.push(leader.stand({ ...claim, deliver: (messages) => claim.deliver(shard, messages) }));
    }
    return () => {
      for (const off of withdraw) off();
    };
  }

  private nextStart(queue: string, count: number): number {
    const next = this.cursor.get(queue) ?? 0;
    this.cursor.set(queue, (next + 1) % 1_000_000);
    return next % count;
  }
}

/**
 * Throws when a pass served no shard at all: the first non-redirect failure
 * if there was one, else a redirect (every shard is led elsewhere).
 */
export function throwIfNothingServed(pass: ClaimPass, shardCount: number): void {
  if (pass.served.length > 0) return;
  const failure = pass.failed.values().next();
  if (!failure.done) throw failure.value;
  const redirect = pass.redirected.values().next();
  if (!redirect.done && pass.redirected.size >= shardCount) throw redirect.value;
}

function cancelled(): CasqError {
  return new CasqError("cancelled", "the call was cancelled while waiting for messages");
}
