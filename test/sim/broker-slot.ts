/**
 * A broker "machine": its network link to the store, the broker process
 * currently running on it, and the connection clients make to it.
 *
 * - The **link** is a {@link FaultInjectingStore} over the shared truth store,
 *   one per machine and kept across restarts, with seeded latencies and fault
 *   rules (a partition is a rule that fails every call, checked first). With
 *   `retryingStore` a {@link RetryingStore} sits on top, as in production.
 * - A **process** is a {@link Broker} with a fresh identity (`<slot>-<n>`)
 *   behind a {@link KillSwitchStore}. `crash()` kills it: its store calls fail
 *   from then on (requests already on the wire may still land), every client
 *   call in flight is cut ("connection reset"), and the dead process's shard
 *   leaders are reaped so that their timers stop. `stop()` is a graceful stop
 *   that hands the leadership leases back.
 * - **Clients** reach the process through {@link BrokerSlot.invoke}: a few ms
 *   of network each way; refused while the process is down or stopping; an
 *   answer still on the wire when the process dies is lost. SDK clients reach
 *   the process's real service handlers ({@link BrokerSlot.services}, see
 *   `broker-services.ts`) through `sim-connections.ts`, with the same rules.
 *   A graceful stop first drains the process's Work streams, as the server does.
 */
import { Broker, NO_MANIFESTS } from "../../server/src/broker/broker.ts";
import { CasqError } from "../../server/src/errors.ts";
import type { ObjectStore } from "../../server/src/store/object-store.ts";
import { RetryingStore } from "../../server/src/store/retrying-store.ts";
import { FaultInjectingStore, type FaultRule } from "../../server/testing/fault-injecting-store.ts";
import type { ManualClock } from "../../server/testing/manual-clock.ts";
import { BrokerServices } from "./broker-services.ts";
import { KillSwitchStore } from "./kill-switch-store.ts";
import type { LinkFaultRates, SimConfig } from "./sim-config.ts";
import type { SimRandom } from "./sim-random.ts";
import type { Trace } from "./trace.ts";

/** Counters of one slot. */
export interface SlotStats {
  crashes: number;
  restarts: number;
  gracefulStops: number;
  partitions: number;
  storms: number;
}

type Settled<T> = { ok: true; value: T } | { ok: false; error: unknown };

/** One broker machine (see module header). */
export class BrokerSlot {
  readonly address: string;
  readonly link: FaultInjectingStore;
  readonly stats: SlotStats = { crashes: 0, restarts: 0, gracefulStops: 0, partitions: 0, storms: 0 };

  private broker: Broker | undefined;
  private rpc: BrokerServices | undefined;
  private killSwitch: KillSwitchStore | undefined;
  private incarnation = 0;
  /** Bumped whenever client connections are cut. */
  private connectionEpoch = 0;
  private state: "down" | "up" | "stopping" = "down";
  private readonly cuts = new Set<(error: CasqError) => void>();
  private faults: LinkFaultRates | undefined;
  private partitioned = false;
  private storm = 1;

  constructor(
    readonly name: string,
    private readonly config: SimConfig,
    private readonly clock: ManualClock,
    private readonly random: SimRandom,
    truth: ObjectStore,
    private readonly trace: Trace,
  ) {
    this.address = `${name}.sim:50051`;
    this.link = new FaultInjectingStore(truth, {
      random: random.fork(),
      clock,
      latency: {
        get: { kind: "exponential", meanMs: 12, minMs: 3, maxMs: 300 },
        list: { kind: "exponential", meanMs: 12, minMs: 3, maxMs: 300 },
        put: { kind: "exponential", meanMs: 30, minMs: 8, maxMs: 600 },
        delete: { kind: "exponential", meanMs: 20, minMs: 5, maxMs: 400 },
      },
    });
  }

  /** True while a process runs and accepts requests. */
  get isUp(): boolean {
    return this.state === "up";
  }

  /** The running process's service handlers; undefined while it is down or stopping (connections are refused). */
  get services(): BrokerServices | undefined {
    return this.state === "up" ? this.rpc : undefined;
  }

  /** Bumped whenever client connections are cut (a crash, the end of a graceful stop). */
  get connection(): number {
    return this.connectionEpoch;
  }

  /** Calls `cut` when client connections are cut next; returns the function that unregisters it. */
  onCut(cut: () => void): () => void {
    const listener = () => cut();
    this.cuts.add(listener);
    return () => {
      this.cuts.delete(listener);
    };
  }

  /** True while a graceful stop is in progress. */
  get isStopping(): boolean {
    return this.state === "stopping";
  }

  /** True while the link is cut. */
  get isPartitioned(): boolean {
    return this.partitioned;
  }

  /** Starts a new broker process with a new identity (no-op when one runs or is stopping). */
  start(): void {
    if (this.state !== "down") return;
    this.incarnation += 1;
    if (this.incarnation > 1) this.stats.restarts += 1;
    const base: ObjectStore = this.config.retryingStore
      ? new RetryingStore(this.link, { clock: this.clock, random: this.random.fork() })
      : this.link;
    this.killSwitch = new KillSwitchStore(base);
    this.broker = new Broker({
      store: this.killSwitch,
      identity: { id: `${this.name}-${this.incarnation}`, address: this.address },
      clock: this.clock,
      random: this.random.fork(),
      commit: {
        leaseMs: this.config.leadershipLeaseMs,
        ...this.config.commit,
        warmSealedMessages: this.config.warmSealedMessages,
        residentDedupIdBytes: this.config.residentDedupIdBytes,
        indexSegmentSize: this.config.indexSegmentSize,
      },
      shardsFor: () => this.config.shards,
      initialConfig: this.config.queueConfig,
      documentExpected: NO_MANIFESTS,
      segmentCacheBytes: this.config.segmentCacheBytes,
    });
    this.rpc = new BrokerServices(this.broker, this.killSwitch, this.clock);
    this.state = "up";
    this.trace.add(`start ${this.name}-${this.incarnation}`);
  }

  /** Kills the process without any goodbye (see module header). */
  crash(): void {
    if (this.state === "down") return;
    this.stats.crashes += 1;
    this.trace.add(`crash ${this.name}-${this.incarnation}`);
    this.killSwitch?.kill();
    const zombie = this.broker;
    this.broker = undefined;
    this.rpc = undefined;
    this.killSwitch = undefined;
    this.state = "down";
    this.cutConnections("connection reset: the broker process died");
    // Reap the dead process: with its store killed it can write nothing, but
    // its shard leaders' timers would keep firing for the rest of the run.
    zombie?.stop({ release: false }).catch(() => {});
  }

  /** Graceful stop: commits what is buffered and hands the leases back. */
  async stop(): Promise<void> {
    if (this.state !== "up" || !this.broker) return;
    this.stats.gracefulStops += 1;
    const incarnation = this.incarnation;
    this.trace.add(`stop ${this.name}-${incarnation}`);
    this.state = "stopping";
    const rpc = this.rpc;
    const broker = this.broker;
    try {
      // As the server's close: Work streams drain first, then the broker hands its leases back.
      if (rpc !== undefined && rpc.work.openStreams > 0)
        await rpc.drain(this.random.int(300, 3_000), this.clock.now());
      if (this.incarnation !== incarnation || this.state !== "stopping") return;
      await broker.stop({ release: true });
    } catch (error) {
      this.trace.add(`stop ${this.name}-${incarnation} failed: ${String(error)}`);
    }
    if (this.incarnation !== incarnation || this.state !== "stopping") return;
    this.killSwitch?.kill();
    this.broker = undefined;
    this.rpc = undefined;
    this.killSwitch = undefined;
    this.state = "down";
    this.cutConnections("connection closed: the broker stopped");
    this.trace.add(`stopped ${this.name}-${incarnation}`);
  }

  /** Cuts the link: every store call fails until {@link heal}. */
  partition(): void {
    if (this.partitioned) return;
    this.partitioned = true;
    this.stats.partitions += 1;
    this.trace.add(`partition ${this.name}`);
    this.applyRules();
  }

  /** Restores the link after a partition. */
  heal(): void {
    if (!this.partitioned) return;
    this.partitioned = false;
    this.trace.add(`heal ${this.name}`);
    this.applyRules();
  }

  /** Multiplies the fault rates (1 = normal). */
  setStorm(factor: number): void {
    if (factor > 1) this.stats.storms += 1;
    this.storm = factor;
    this.trace.add(`storm ${this.name} x${factor}`);
    this.applyRules();
  }

  /** Sets the base fault rates (`undefined`: no faults, latency only). */
  setFaults(rates: LinkFaultRates | undefined): void {
    this.faults = rates;
    this.applyRules();
  }

  /**
   * Sends one request to the running process and returns its answer, or
   * throws: `unavailable` when the process is down, stopping, or dies before
   * the answer gets back; `cancelled` when the client's deadline passes first
   * (the call's signal is aborted, as gRPC does); any error of the broker
   * itself.
   */
  async invoke<T>(call: (broker: Broker, signal: AbortSignal) => Promise<T>, deadlineMs: number): Promise<T> {
    const deadline = this.clock.now() + deadlineMs;
    await this.clock.sleep(this.random.int(1, 3));
    const broker = this.broker;
    if (this.state !== "up" || broker === undefined)
      throw new CasqError(
        "unavailable",
        `broker ${this.name} is ${this.state === "stopping" ? "shutting down" : "not running"} (connection refused)`,
      );
    const connection = this.connectionEpoch;
    const abort = new AbortController();
    const timer = new AbortController();
    const outcome = await new Promise<Settled<T>>((resolve) => {
      const cut = (error: CasqError) => resolve({ ok: false, error });
      this.cuts.add(cut);
      this.clock.sleep(Math.max(0, deadline - this.clock.now()), timer.signal).then(
        () => {
          this.cuts.delete(cut);
          abort.abort(new CasqError("cancelled", "deadline exceeded"));
          resolve({ ok: false, error: new CasqError("cancelled", `broker ${this.name}: deadline exceeded`) });
        },
        () => {},
      );
      call(broker, abort.signal).then(
        (value) => {
          this.cuts.delete(cut);
          resolve({ ok: true, value });
        },
        (error: unknown) => {
          this.cuts.delete(cut);
          resolve({ ok: false, error });
        },
      );
    });
    timer.abort();
    await this.clock.sleep(this.random.int(1, 3));
    if (connection !== this.connectionEpoch)
      throw new CasqError("unavailable", `broker ${this.name}: connection lost before the answer arrived`);
    if (!outcome.ok) throw outcome.error;
    return outcome.value;
  }

  private cutConnections(reason: string): void {
    this.connectionEpoch += 1;
    const cuts = [...this.cuts];
    this.cuts.clear();
    for (const cut of cuts) cut(new CasqError("unavailable", `broker ${this.name}: ${reason}`));
  }

  private applyRules(): void {
    this.link.clearRules();
    // A partition fails every call, so it is checked before any other rule.
    if (this.partitioned) this.link.addRule({ id: "partition", fault: "unavailable", rate: 1 });
    const f = this.faults;
    if (f === undefined) return;
    const s = this.storm;
    const rules: FaultRule[] = [
      { id: "unavailable", fault: "unavailable", rate: f.unavailable * s },
      { id: "timeout", fault: "timeout_before_send", rate: f.timeoutBeforeSend * s },
      { id: "conflict", fault: "conflict", rate: f.conflict * s, ops: ["put"] },
      { id: "applied-lost", fault: "ambiguous_applied", rate: f.ambiguousApplied * s, ops: ["put"] },
      { id: "lost", fault: "ambiguous_not_applied", rate: f.ambiguousNotApplied * s, ops: ["put"] },
      {
        id: "slow",
        fault: "delay",
        rate: f.delay * s,
        latency: { kind: "uniform", minMs: 500, maxMs: 2_500 },
      },
      // Last, and skipped at rate 0 (no draw): runs without late landings draw as before it existed.
      {
        id: "late",
        fault: "ambiguous_late",
        rate: f.ambiguousLate * s,
        ops: ["put", "delete"],
        latency: { kind: "uniform", minMs: 20, maxMs: 2_000 },
      },
    ];
    for (const rule of rules) this.link.addRule({ ...rule, rate: Math.min(1, rule.rate) });
  }
}
