/**
 * The simulated world of one run: one {@link ManualClock}, one seeded random
 * source split into a stream per component, the truth store (observed by the
 * auditor), the broker machines with their links, and the actors.
 *
 * Phases: `setup` (brokers start, the second subscription is created, no
 * faults) -> `chaos` (producers, workers, faults and the nemesis) -> `drain`
 * (faults off, every machine healthy, producers stopped, workers ack
 * everything) -> `done` (actors stop).
 */

import { encodeManifest, manifestKey } from "../../server/src/broker/queue-catalog.ts";
import { DEFAULT_QUEUE_CONFIG } from "../../server/src/model/queue-config.ts";
import { ManualClock } from "../../server/testing/manual-clock.ts";
import { Auditor } from "./auditor.ts";
import { BrokerSlot } from "./broker-slot.ts";
import { Nemesis } from "./nemesis.ts";
import { ObservedStore } from "./observed-store.ts";
import { DirectEnqueue, Producer } from "./producer.ts";
import { SdkEnqueue } from "./sdk-producer.ts";
import { SdkWorker } from "./sdk-worker.ts";
import { SimClient } from "./sim-client.ts";
import { drawConfig, type SimConfig, type SimConfigOverrides } from "./sim-config.ts";
import { SimRandom } from "./sim-random.ts";
import { Trace } from "./trace.ts";
import { Worker } from "./worker.ts";

/** The phase of a run. */
export type SimPhase = "setup" | "chaos" | "drain" | "done";

/** What actors see of the world. */
export interface SimContext {
  readonly config: SimConfig;
  readonly clock: ManualClock;
  readonly auditor: Auditor;
  readonly trace: Trace;
  readonly slots: readonly BrokerSlot[];
  readonly phase: SimPhase;
}

/** One run's world (see module header). */
export class SimWorld implements SimContext {
  readonly config: SimConfig;
  readonly clock: ManualClock;
  readonly trace: Trace;
  readonly auditor: Auditor;
  readonly slots: BrokerSlot[];
  phase: SimPhase = "setup";
  private producersRunning = 0;
  private readonly random: SimRandom;
  private readonly truth: ObservedStore;

  constructor(seed: number, overrides: SimConfigOverrides = {}) {
    const root = new SimRandom(seed);
    this.config = drawConfig(seed, root.fork(), overrides);
    this.random = root.fork();
    this.clock = new ManualClock({ settleTurns: this.config.settleTurns });
    this.trace = new Trace(
      () => this.clock.now(),
      process.env.CASQ_SIM_TRACE === "1" ? Number.MAX_SAFE_INTEGER : 200,
    );
    this.auditor = new Auditor(
      () => this.clock.now(),
      this.trace,
      this.config.subscriptions,
      this.config.queueConfig.leaseTtlMs,
    );
    const truth = new ObservedStore(
      (key, body, etag, condition) =>
        this.auditor.history.record(key, body, etag, condition, this.clock.now()),
      (key) => this.auditor.history.recordDelete(key),
    );
    this.truth = truth;
    this.slots = Array.from(
      { length: this.config.brokers },
      (_, i) =>
        new BrokerSlot(
          String.fromCharCode(97 + i),
          this.config,
          this.clock,
          this.random.fork(),
          truth,
          this.trace,
        ),
    );
  }

  /** Starts the brokers and creates the extra subscriptions on every shard, with faults off. */
  async setup(): Promise<void> {
    // The service handlers SDK workers call look the queue up in its manifest (the engine does not).
    if (this.config.sdkWorkers !== "off")
      await this.truth.preload(
        manifestKey(this.config.queue),
        encodeManifest({
          queue: this.config.queue,
          shardCount: this.config.shards,
          createdAt: this.clock.now(),
          state: "ready",
          config: { ...DEFAULT_QUEUE_CONFIG, ...this.config.queueConfig },
        }),
      );
    for (const slot of this.slots) slot.start();
    const client = this.client();
    for (const name of this.config.subscriptions) {
      if (name === "default") continue;
      const result = await this.settled(
        client.call("createSubscription", (broker) =>
          broker.adminAll(this.config.queue, { kind: "createSubscription", name, from: "earliest" }),
        ),
      );
      if (!result.ok) throw new Error(`setup: cannot create subscription ${name}: ${String(result.error)}`);
    }
  }

  /**
   * Producers still running: after the chaos a producer finishes its last
   * call (an SDK call may retry for many seconds), and the drain is not over
   * while a message may still land.
   */
  get producing(): number {
    return this.producersRunning;
  }

  /** Turns faults on and starts every actor (not awaited: they run on the clock). */
  startChaos(): void {
    this.phase = "chaos";
    const faults = this.config.lateLanding ? this.config.faults : { ...this.config.faults, ambiguousLate: 0 };
    for (const slot of this.slots) slot.setFaults(faults);
    const config = this.config;
    for (let i = 0; i < config.producers; i++) {
      const name = `p${i}`;
      const random = this.random.fork();
      // With SDK workers, producers are the SDK's too (all of them, or the first one beside
      // direct ones); either channel takes one fork, so the other actors' streams stay the same.
      const sdk = config.sdkWorkers === "instead" || (config.sdkWorkers === "beside" && i === 0);
      const channel = sdk
        ? new SdkEnqueue(name, this, this.random.fork())
        : new DirectEnqueue(this, this.client());
      this.producersRunning += 1;
      void new Producer(name, this, random, channel).run().finally(() => {
        this.producersRunning -= 1;
      });
    }
    for (const sub of config.subscriptions)
      for (let i = 0; i < config.workersPerSubscription; i++) {
        // Forked either way, so that the other actors' streams do not depend on the mode.
        const random = this.random.fork();
        if (config.sdkWorkers !== "instead")
          void new Worker(`${sub}-w${i}`, sub, this, random, this.client()).run();
      }
    if (config.sdkWorkers !== "off")
      for (const sub of config.subscriptions)
        for (let i = 0; i < (config.sdkWorkers === "instead" ? config.workersPerSubscription : 1); i++)
          void new SdkWorker(`${sub}-sdk${i}`, sub, this, this.random.fork()).run();
    void new Nemesis(this, this.random.fork()).run();
  }

  /** Ends the chaos: faults off, links healed, every machine running; workers now ack everything. */
  calm(): void {
    this.phase = "drain";
    this.trace.add("calm");
    for (const slot of this.slots) {
      slot.setFaults(undefined);
      slot.setStorm(1);
      slot.heal();
      slot.start();
    }
  }

  /** Stops the actors. */
  finish(): void {
    this.phase = "done";
    this.trace.add("done");
  }

  /** Moves virtual time forward by `ms`, in steps. */
  async advance(ms: number, stepMs = 1_000): Promise<void> {
    const end = this.clock.now() + ms;
    while (this.clock.now() < end) await this.clock.runUntil(Math.min(end, this.clock.now() + stepMs));
  }

  /** A new client with its own random stream. */
  client(): SimClient {
    return new SimClient(this.slots, this.clock, this.random.fork(), this.auditor);
  }

  /** Drives the clock until `promise` settles (at most 60 virtual seconds). */
  private async settled<T>(promise: Promise<T>): Promise<T> {
    let done = false;
    const watched = promise.finally(() => {
      done = true;
    });
    for (let i = 0; i < 600 && !done; i++) await this.clock.runUntil(this.clock.now() + 100);
    if (!done) throw new Error("setup did not finish within 60 virtual seconds");
    return watched;
  }
}
