/**
 * A worker actor that is the real TypeScript SDK `Worker` (`sdk/ts/src/worker.ts`):
 * its Work streams, credits, heartbeats, settles, reconnects, redirects and
 * failover all run, on the run's ManualClock and seeded randomness, against
 * the brokers' real service handlers (`broker-services.ts`) over simulated
 * connections (`sim-connections.ts`). The auditor hears what crossed the
 * wire (`sdk-wire-audit.ts`), so it judges what the SDK was told, not what
 * the SDK believes.
 *
 * The handler draws each job's fate during the chaos phase: ack (most),
 * throw for a retry, throw `DeadLetterError`, a long job that outlives the
 * lease (the SDK's heartbeats must keep it), or a crash of the worker
 * process (its connections are reset and refused, the Worker is stopped
 * with no grace, nothing it held is settled). A process also lives only so
 * long: then it crashes or stops gracefully (unstarted jobs are released,
 * running ones get a grace period), and a new process with a new worker id
 * starts a little later. In the drain phase every job is acked.
 *
 * The SDK giving up (`run()` rejecting) on a queue and subscription that
 * exist, or reporting an internal error, is a violation.
 */
import { Code } from "@connectrpc/connect";
import { CasqError, DeadLetterError, type Job, Worker } from "../../sdk/ts/src/index.ts";
import { SdkWireAudit } from "./sdk-wire-audit.ts";
import { SimConnections } from "./sim-connections.ts";
import type { SimRandom } from "./sim-random.ts";
import type { SimContext } from "./sim-world.ts";

type Fate = "ack" | "retry" | "dead" | "long" | "crash";

/**
 * Error codes that are a server bug whenever they reach a worker (UNKNOWN is
 * not one: the SDK reports a settle whose outcome it cannot know with it).
 */
const BUGS = new Set<Code>([Code.Internal, Code.DataLoss]);

/** One SDK worker, over its successive processes (see module header). */
export class SdkWorker {
  private generation = 0;
  /** Ends the current process at once (set while one runs). */
  private crashCurrent: (() => void) | undefined;

  constructor(
    private readonly name: string,
    private readonly subscription: string,
    private readonly world: SimContext,
    private readonly random: SimRandom,
  ) {}

  /** Runs processes one after another until the world stops its workers. */
  async run(): Promise<void> {
    const { clock } = this.world;
    while (this.phase() !== "done") {
      await this.process();
      if (this.phase() === "done") break;
      await clock.sleep(this.random.int(300, 3_000));
    }
  }

  /** One worker process: starts an SDK Worker and ends it by a crash or a graceful stop. */
  private async process(): Promise<void> {
    const { clock, config, auditor, slots, trace } = this.world;
    this.generation += 1;
    const generation = this.generation;
    const workerId = `${this.name}.${generation}`;
    const connections = new SimConnections(
      slots,
      clock,
      this.random.fork(),
      new SdkWireAudit(auditor, this.subscription, workerId),
    );
    // Each process knows the brokers in its own order, sometimes only some of them.
    const addresses = this.shuffled(slots.map((s) => s.address));
    const known = addresses.slice(0, this.random.int(1, addresses.length));
    const worker = new Worker({
      brokers: known,
      workerId,
      logger: null,
      timeoutMs: 5_000,
      retryTimeoutMs: 20_000,
      backoffInitialMs: 50,
      backoffMaxMs: 2_000,
      keepaliveMs: 0,
      clock,
      random: this.random.fork(),
      transportFactory: (address) => connections.transport(address),
    });
    const concurrency = this.random.int(1, 3);
    trace.add(`sdk-worker start ${workerId} brokers=${known.join(",")} concurrency=${concurrency}`);
    let alive = true;
    const crash = () => {
      if (!alive) return;
      alive = false;
      trace.add(`sdk-worker crash ${workerId}`);
      connections.kill();
      void worker.stop({ timeoutMs: 0 });
    };
    this.crashCurrent = crash;
    const running = worker
      .run(config.queue, (job) => this.handle(job, generation), {
        subscription: this.subscription,
        concurrency,
        prefetch: concurrency + this.random.int(0, 3),
        onError: (error) => {
          if (error instanceof CasqError && BUGS.has(error.code))
            auditor.violation("no-internal-errors", `SDK worker ${workerId}: ${error.message}`);
        },
      })
      .then(
        () => trace.add(`sdk-worker ended ${workerId}`),
        (error: unknown) => {
          alive = false;
          auditor.violation("sdk-worker", `SDK worker ${workerId} gave up: ${String(error)}`);
        },
      );
    const endOfLife = clock.now() + this.random.exp(15_000, 2_000);
    while (alive && this.phase() !== "done" && (this.phase() !== "chaos" || clock.now() < endOfLife))
      await clock.sleep(250);
    if (!alive) return;
    if (this.phase() === "chaos" && this.random.chance(0.5)) return crash();
    alive = false;
    trace.add(`sdk-worker stop ${workerId}`);
    const stopped = worker.stop({ timeoutMs: this.random.int(0, 3_000) });
    // At the end of the run nobody waits: the world stops advancing the clock.
    if (this.phase() !== "done") await Promise.all([stopped, running]);
  }

  private async handle(job: Job, generation: number): Promise<void> {
    const { clock, config } = this.world;
    const ttl = config.queueConfig.leaseTtlMs;
    const chaos = this.world.phase === "chaos";
    const fate: Fate = chaos
      ? this.random.weighted<Fate>({ ack: 80, retry: 8, dead: 3, long: 5, crash: 4 })
      : "ack";
    const duration = fate === "long" ? this.random.int(ttl, 2 * ttl) : this.random.exp(chaos ? 150 : 30, 5);
    try {
      await clock.sleep(duration, job.signal);
    } catch {
      // The lease was lost or the worker stopped: stop working, as a handler should.
      throw new Error("simulated handler: gave up, the job's signal aborted");
    }
    if (generation !== this.generation) return;
    if (fate === "crash") {
      this.crashCurrent?.();
      return;
    }
    if (fate === "retry") throw new Error("simulated failure");
    if (fate === "dead") throw new DeadLetterError("simulated poison message");
  }

  /** The world's phase (read through a call: it changes while we await). */
  private phase(): SimContext["phase"] {
    return this.world.phase;
  }

  private shuffled<T>(items: readonly T[]): T[] {
    const out = [...items];
    for (let i = out.length - 1; i > 0; i--) {
      const j = this.random.int(0, i);
      [out[i], out[j]] = [out[j] as T, out[i] as T];
    }
    return out;
  }
}
