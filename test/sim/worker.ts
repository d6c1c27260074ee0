/**
 * A worker actor on one subscription: long-poll claims, works on each
 * delivery for a while, heartbeats what it holds every third of the lease,
 * and settles each job.
 *
 * During the chaos phase a job's fate is drawn: ack (most), nack for a retry
 * (with the queue's backoff or an explicit delay), nack to the dead letters,
 * a "late" job whose heartbeats stop so the lease runs out before the ack
 * (the ack then usually answers `lease_lost`), or a crash: the worker drops
 * everything it holds, never acks, and comes back later under a new worker
 * id. In the drain phase every job is acked and heartbeats are punctual.
 *
 * Acks and nacks whose call gave up are resent a few times (they are
 * idempotent: a repeated ack answers `already_acked`). Each ack/nack is
 * reported to the auditor when SENT (so the history can explain a
 * settlement whose answer was lost) and again when acknowledged.
 */
import type { Delivery } from "../../server/src/broker/broker.ts";
import { expectKind } from "../../server/src/broker/broker.ts";
import type { SimClient } from "./sim-client.ts";
import type { SimRandom } from "./sim-random.ts";
import type { SimContext } from "./sim-world.ts";

type Fate = "ack" | "retry" | "retryDelay" | "dead" | "late" | "crash";

interface Held {
  readonly delivery: Delivery;
  /** Heartbeats stopped for this job (a stuck or paused worker). */
  silent: boolean;
}

/** One worker (see module header). */
export class Worker {
  private generation = 1;
  private readonly held = new Map<string, Held>();
  private crashedUntil = 0;

  constructor(
    private readonly name: string,
    private readonly subscription: string,
    private readonly world: SimContext,
    private readonly random: SimRandom,
    private readonly client: SimClient,
  ) {}

  private get workerId(): string {
    return `${this.name}.${this.generation}`;
  }

  /** Runs until the world stops its workers. */
  async run(): Promise<void> {
    const { clock, config } = this.world;
    void this.heartbeats();
    while (this.world.phase !== "done") {
      if (clock.now() < this.crashedUntil) await clock.sleep(this.crashedUntil - clock.now());
      const generation = this.generation;
      const workerId = this.workerId;
      const waitMs = this.random.int(500, 3_000);
      const result = await this.client.call(
        "claim",
        (broker, signal) =>
          broker.claim(config.queue, {
            subscription: this.subscription,
            workerId,
            max: this.random.int(1, 3),
            waitMs,
            signal,
          }),
        waitMs + 3_000,
      );
      if (!result.ok) {
        await clock.sleep(this.random.int(100, 1_000));
        continue;
      }
      if (result.value.length === 0) continue;
      this.world.auditor.claimAcknowledged(workerId, this.subscription, result.value);
      if (generation !== this.generation) continue; // crashed while the claim was in flight: the jobs are lost
      for (const delivery of result.value) this.held.set(keyOf(delivery), { delivery, silent: false });
      for (const delivery of result.value) {
        if (generation !== this.generation) break;
        await this.work(delivery);
      }
    }
  }

  private async work(delivery: Delivery): Promise<void> {
    const { clock, config } = this.world;
    const ttl = config.queueConfig.leaseTtlMs;
    const generation = this.generation;
    const chaos = this.world.phase === "chaos";
    const fate: Fate = chaos
      ? this.random.weighted<Fate>({ ack: 78, retry: 7, retryDelay: 3, dead: 3, late: 5, crash: 4 })
      : "ack";
    const held = this.held.get(keyOf(delivery));
    // Most jobs are short; a few outlive the lease and need their heartbeats.
    let duration =
      chaos && this.random.chance(0.04)
        ? this.random.int(ttl, 2 * ttl)
        : this.random.exp(chaos ? 150 : 30, 5);
    if (fate === "late") {
      if (held) held.silent = true;
      duration = ttl + this.random.int(200, 3_000);
    }
    await clock.sleep(duration);
    if (generation !== this.generation) return;
    if (fate === "crash") return this.crash();
    this.held.delete(keyOf(delivery));
    if (fate === "ack" || fate === "late") await this.ack(delivery);
    else if (fate === "dead")
      await this.nack(delivery, { deadLetter: true, reason: "simulated poison message" });
    else if (fate === "retryDelay") await this.nack(delivery, { delayMs: this.random.int(0, 2_000) });
    else await this.nack(delivery, {});
  }

  private crash(): void {
    this.world.trace.add(`worker-crash ${this.workerId} holding ${this.held.size}`);
    this.held.clear();
    this.generation += 1;
    this.crashedUntil = this.world.clock.now() + this.random.int(500, 3_000);
  }

  private async ack(delivery: Delivery): Promise<void> {
    const { config, auditor, clock } = this.world;
    const receipt = delivery.message.receipt;
    for (let tries = 1; tries <= 4 && this.world.phase !== "done"; tries++) {
      auditor.markAckSent(delivery.shard, this.subscription, receipt);
      const result = await this.client.call("ack", (broker) =>
        broker.ack(config.queue, this.subscription, [{ shard: delivery.shard, ...receipt }]),
      );
      if (result.ok) {
        for (const part of result.value)
          auditor.ackAcknowledged(part.shard, this.subscription, expectKind(part.result, "ack").results);
        return;
      }
      await clock.sleep(this.random.int(50, 500));
    }
  }

  private async nack(
    delivery: Delivery,
    options: { delayMs?: number; deadLetter?: boolean; reason?: string },
  ) {
    const { config, auditor, clock } = this.world;
    const receipt = delivery.message.receipt;
    for (let tries = 1; tries <= 4 && this.world.phase !== "done"; tries++) {
      auditor.markNackSent(delivery.shard, this.subscription, receipt);
      const result = await this.client.call("nack", (broker) =>
        broker.nack(config.queue, this.subscription, [{ shard: delivery.shard, ...receipt }], options),
      );
      if (result.ok) {
        for (const part of result.value)
          auditor.nackAcknowledged(part.shard, this.subscription, expectKind(part.result, "nack").results);
        return;
      }
      await clock.sleep(this.random.int(50, 500));
    }
  }

  /** Heartbeats every held, non-silent job about every third of the lease. */
  private async heartbeats(): Promise<void> {
    const { clock, config, auditor } = this.world;
    const ttl = config.queueConfig.leaseTtlMs;
    while (this.world.phase !== "done") {
      await clock.sleep(Math.round(ttl / 3) + this.random.int(-100, 100));
      const jobs = [...this.held.values()].filter((h) => !h.silent);
      if (jobs.length === 0) continue;
      const workerId = this.workerId;
      const receipts = jobs.map((h) => ({ shard: h.delivery.shard, ...h.delivery.message.receipt }));
      const result = await this.client.call("heartbeat", (broker) =>
        broker.heartbeat(config.queue, this.subscription, workerId, receipts),
      );
      if (!result.ok) continue;
      for (const part of result.value) {
        const beat = expectKind(part.result, "heartbeat");
        auditor.heartbeatAcknowledged(part.shard, this.subscription, beat.extended, beat.lost);
      }
    }
  }
}

function keyOf(delivery: Delivery): string {
  return `${delivery.shard}/${delivery.message.receipt.offset}/${delivery.message.receipt.attempt}`;
}
