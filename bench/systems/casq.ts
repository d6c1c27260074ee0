/**
 * casq as the benchmark runs it: one `casq serve` process of this checkout on
 * the file store (every acknowledged operation fsync'd), driven through the
 * TypeScript SDK's Producer and Worker with their default options.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { Admin, Producer, Worker } from "../../sdk/ts/src/index.ts";
import type { BenchQueue, QueueSystem } from "../lib/queue-system.ts";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** Options of {@link CasqSystem}. */
export interface CasqSystemOptions {
  /**
   * Delay of every store PUT in ms (the S3-like profile): the server then runs
   * from `slow-store-server.ts`, the file store behind the fault-injecting wrapper.
   */
  readonly putLatencyMs?: number;
  /**
   * With `putLatencyMs`: that server compiled to JavaScript, run by plain node
   * (`BuiltServer.slowStoreServer`); default the source through tsx.
   */
  readonly slowStoreServer?: string;
  /**
   * The `casq` launcher to run (without `putLatencyMs`): default this
   * checkout's `server/bin/casq.js`, which runs the source through tsx;
   * `bench/lib/built-server.ts` gives an installed build's.
   */
  readonly serverBin?: string;
  /** Node options for the server process (before any from `CASQ_BENCH_BROKER_NODE_ARGS`). */
  readonly nodeArgs?: readonly string[];
}

/** Waits for a line matching `pattern` on the child's stdout. */
function waitForLine(child: ChildProcess, pattern: RegExp, what: string): Promise<RegExpExecArray> {
  return new Promise((resolveLine, reject) => {
    let seen = "";
    const onData = (chunk: Buffer) => {
      seen += chunk.toString();
      const match = pattern.exec(seen);
      if (match) {
        child.stdout?.off("data", onData);
        resolveLine(match);
      }
    };
    child.stdout?.on("data", onData);
    child.once("exit", (code) =>
      reject(new Error(`${what} exited (${code}) before printing ${pattern}:\n${seen}`)),
    );
  });
}

/** casq under test (see module header). */
export class CasqSystem implements QueueSystem {
  readonly name: string;
  readonly durability: string = "fsync before every answer";
  private child: ChildProcess | undefined;
  private dir: string | undefined;
  private address = "";
  private metricsUrl = "";
  private queues = 0;

  constructor(private readonly options: CasqSystemOptions = {}) {
    this.name = options.putLatencyMs ? `casq-put${options.putLatencyMs}ms` : "casq";
    if (options.putLatencyMs) this.durability = `as casq, every PUT delayed ${options.putLatencyMs} ms`;
  }

  async start(): Promise<void> {
    this.dir = mkdtempSync(join(tmpdir(), "casq-bench-"));
    const args = this.options.putLatencyMs
      ? [
          ...(this.options.slowStoreServer
            ? [this.options.slowStoreServer]
            : ["--import", "tsx", join(ROOT, "bench", "systems", "slow-store-server.ts")]),
          this.dir,
          String(this.options.putLatencyMs),
        ]
      : [
          this.options.serverBin ?? join(ROOT, "server", "bin", "casq.js"),
          "serve",
          "--store",
          `file:${this.dir}`,
          "--listen",
          "127.0.0.1:0",
          "--metrics-listen",
          "127.0.0.1:0",
          "--log-level",
          "warn",
        ];
    // For profiling the broker under a shape, e.g.
    // CASQ_BENCH_BROKER_NODE_ARGS="--cpu-prof --cpu-prof-dir=/tmp/prof".
    const nodeArgs = [
      ...(this.options.nodeArgs ?? []),
      ...(process.env.CASQ_BENCH_BROKER_NODE_ARGS ?? "").split(" ").filter(Boolean),
    ];
    const child = spawn(process.execPath, [...nodeArgs, ...args], {
      stdio: ["ignore", "pipe", "inherit"],
      cwd: ROOT,
    });
    this.child = child;
    const metrics = waitForLine(child, /metrics on (http:\/\/\S+\/metrics)/, "casq serve");
    this.address = (await waitForLine(child, /listening on (\S+)/, "casq serve"))[1] as string;
    this.metricsUrl = (await metrics)[1] as string;
  }

  async stop(): Promise<void> {
    const child = this.child;
    if (child && child.exitCode === null) {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      await exited;
    }
    if (this.dir) rmSync(this.dir, { recursive: true, force: true });
  }

  /** The broker's gRPC address. */
  get brokerAddress(): string {
    return this.address;
  }

  /** The broker's Prometheus endpoint (`http://host:port/metrics`). */
  get metricsEndpoint(): string {
    return this.metricsUrl;
  }

  /** The file store's directory (the broker's whole state), while started. */
  get storeDirectory(): string {
    if (this.dir === undefined) throw new Error("casq: not started");
    return this.dir;
  }

  /** A fresh queue holding `jobs` messages of `payloadBytes` (enqueued in batches of 100 by 4 callers). */
  async preloadedQueue(jobs: number, payloadBytes: number): Promise<string> {
    const name = `bench-${++this.queues}`;
    await new Admin({ brokers: [this.address] }).createQueue(name, { shardCount: 1 });
    await this.fill(name, jobs, payloadBytes);
    return name;
  }

  /** Enqueues `jobs` messages of `payloadBytes` into `queue` in batches of 100 from 4 callers. */
  async fill(queue: string, jobs: number, payloadBytes: number): Promise<void> {
    const producer = new Producer({ brokers: [this.address] });
    const payload = Buffer.alloc(payloadBytes, 97);
    let next = 0;
    const caller = async () => {
      while (next < jobs) {
        const n = Math.min(100, jobs - next);
        next += n;
        await producer.enqueueBatch(
          queue,
          Array.from({ length: n }, () => ({ payload })),
        );
      }
    };
    await Promise.all(Array.from({ length: 4 }, caller));
  }

  /** Work streams open on the broker (its `casq_worker_streams_open` gauge). */
  async openStreams(): Promise<number> {
    return this.metric("casq_worker_streams_open");
  }

  private async metric(name: string, filter = ""): Promise<number> {
    const text = await (await fetch(this.metricsUrl)).text();
    let sum = 0;
    for (const line of text.split("\n")) {
      if ((line.startsWith(`${name}{`) || line.startsWith(`${name} `)) && line.includes(filter)) {
        sum += Number(line.slice(line.lastIndexOf(" ") + 1));
      }
    }
    return sum;
  }

  serverPids(): number[] {
    return this.child?.pid === undefined ? [] : [this.child.pid];
  }

  /** PUTs the broker made to its store, from its Prometheus metrics. */
  async storeWrites(): Promise<number> {
    return this.metric("casq_store_operations_total", 'op="put"');
  }

  async newQueue(): Promise<BenchQueue> {
    const brokers = [this.address];
    const name = `bench-${++this.queues}`;
    const admin = new Admin({ brokers });
    await admin.createQueue(name, { shardCount: 1 });
    const producer = new Producer({ brokers });
    return {
      enqueue: async (payload) => {
        await producer.enqueue(name, payload);
      },
      enqueueBatch: async (payloads) => {
        await producer.enqueueBatch(
          name,
          payloads.map((payload) => ({ payload })),
        );
      },
      work: async (concurrency, onJob) => {
        const worker = new Worker({ brokers });
        const run = worker.run(
          name,
          (job) => {
            onJob(Buffer.from(job.payload));
          },
          { concurrency },
        );
        return {
          stop: async () => {
            await worker.stop({ timeoutMs: 5_000 });
            await run;
          },
        };
      },
      close: async () => {},
    };
  }
}
