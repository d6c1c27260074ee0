/**
 * The brokers of a chaos run: `casq serve` processes on one store, each on a
 * loopback port fixed for the whole run, so a broker restarted after a
 * SIGKILL comes back at the address every client was configured with.
 *
 * A broker can be killed (SIGKILL), restarted, frozen (SIGSTOP) and thawed
 * (SIGCONT); the cluster knows which brokers are up and answering.
 */
import { type CasqServerProcess, closedPort, startServer } from "../e2e/support/processes.ts";

/** One broker slot: its address and the process serving it now (if any). */
export interface BrokerSlot {
  /** `b0`, `b1`, ... */
  readonly name: string;
  /** `127.0.0.1:PORT`, the same after every restart. */
  readonly address: string;
  /** The process now, or undefined while it is down. */
  process: CasqServerProcess | undefined;
  /** True while SIGSTOPped. */
  frozen: boolean;
  /** How often it was started (1 after the first start). */
  starts: number;
}

/** Options of {@link startCluster}. */
export interface ClusterOptions {
  /** Store URL every broker uses. */
  readonly store: string;
  /** Number of brokers. */
  readonly brokers: number;
  /** `--leader-lease`, e.g. `2s`. */
  readonly leaderLease: string;
  /** Environment of the brokers (e.g. AWS credentials for an S3 store). */
  readonly env?: Readonly<Record<string, string>>;
  /** Progress lines. */
  readonly log?: (line: string) => void;
}

/** Tries to start a broker before the run gives up. */
const START_ATTEMPTS = 5;

/** A set of brokers on one store. */
export class Cluster {
  /** Brokers that exited without being told to: name, exit and the end of their output. */
  readonly crashes: { broker: string; code: number | null; signal: string | null; output: string }[] = [];

  private constructor(
    readonly slots: readonly BrokerSlot[],
    private readonly options: ClusterOptions,
  ) {}

  /** Picks the ports and starts every broker. */
  static async start(options: ClusterOptions): Promise<Cluster> {
    const slots: BrokerSlot[] = [];
    for (let i = 0; i < options.brokers; i++) {
      slots.push({
        name: `b${i}`,
        address: `127.0.0.1:${await closedPort()}`,
        process: undefined,
        frozen: false,
        starts: 0,
      });
    }
    const cluster = new Cluster(slots, options);
    for (const slot of slots) await cluster.startBroker(slot);
    return cluster;
  }

  /** Every broker address, as the clients get them. */
  get addresses(): string[] {
    return this.slots.map((s) => s.address);
  }

  /** Brokers that run and are not frozen. */
  get healthy(): BrokerSlot[] {
    return this.slots.filter((s) => s.process !== undefined && !s.frozen);
  }

  /** The slot listening on `address`, if any. */
  byAddress(address: string): BrokerSlot | undefined {
    return this.slots.find((s) => s.address === address);
  }

  /**
   * Starts the broker of `slot` (again) on its port. A start that fails is
   * tried again a few times: the port may not be free yet, and a long run
   * outlives edits to the working tree it runs from.
   */
  async startBroker(slot: BrokerSlot): Promise<void> {
    let process: CasqServerProcess | undefined;
    for (let attempt = 1; process === undefined; attempt++) {
      try {
        process = await startServer({
          store: this.options.store,
          listen: slot.address,
          args: ["--leader-lease", this.options.leaderLease, "--shutdown-timeout", "5s"],
          ...(this.options.env ? { env: this.options.env } : {}),
        });
      } catch (error) {
        if (attempt >= START_ATTEMPTS) throw error;
        this.options.log?.(
          `broker ${slot.name} did not start (attempt ${attempt}): ${String(error).slice(0, 300)}`,
        );
        await new Promise((resolve) => setTimeout(resolve, 2_000 * attempt));
      }
    }
    slot.process = process;
    slot.frozen = false;
    void process.exited.then(({ code, signal }) => {
      // Still the slot's process: nobody here stopped it.
      if (slot.process !== process) return;
      slot.process = undefined;
      this.crashes.push({ broker: slot.name, code, signal, output: process.output().slice(-2000) });
    });
    slot.starts++;
  }

  /** SIGKILLs the broker of `slot` and waits until it is gone. */
  async kill(slot: BrokerSlot): Promise<void> {
    const process = slot.process;
    if (!process) return;
    slot.process = undefined;
    if (slot.frozen) process.child.kill("SIGCONT");
    await process.stop("SIGKILL");
    slot.frozen = false;
  }

  /** SIGSTOPs the broker of `slot`. */
  freeze(slot: BrokerSlot): void {
    if (!slot.process || slot.frozen) return;
    slot.process.child.kill("SIGSTOP");
    slot.frozen = true;
  }

  /** SIGCONTs the broker of `slot`. */
  thaw(slot: BrokerSlot): void {
    if (!slot.process || !slot.frozen) return;
    slot.process.child.kill("SIGCONT");
    slot.frozen = false;
  }

  /** Thaws every frozen broker and restarts every dead one. */
  async heal(): Promise<void> {
    for (const slot of this.slots) {
      if (slot.frozen) this.thaw(slot);
      if (!slot.process) await this.startBroker(slot);
    }
  }

  /** Stops every broker (SIGTERM, SIGKILL after 10 s). */
  async stop(): Promise<void> {
    await Promise.all(
      this.slots.map(async (slot) => {
        if (slot.frozen) this.thaw(slot);
        const process = slot.process;
        slot.process = undefined;
        await process?.stop("SIGTERM", 10_000);
      }),
    );
  }
}
