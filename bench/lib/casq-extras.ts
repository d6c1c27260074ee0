/**
 * The casq-only parts of the end-to-end benchmark:
 *
 * - **Other SDKs**: the `process` shape with the Go and Python SDKs' workers,
 *   each a child process (`bench/clients/go-worker`, `bench/clients/py_worker.py`)
 *   working a backlog the TypeScript producer preloaded.
 * - **Many clients**: 100 and 1,000 Work streams from 4 client processes
 *   (`bench/clients/ts-streams.ts`): the broker's RSS and CPU while they sit
 *   idle, the time to drain a backlog through all of them, and how evenly the
 *   jobs spread over the streams.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import type { CasqSystem } from "../systems/casq.ts";
import { cpuSecondsOf } from "./process-cpu.ts";
import { processMemory } from "./process-memory.ts";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** Result of one external SDK worker run. */
export interface SdkProcessResult {
  readonly sdk: "go" | "python";
  readonly jobs: number;
  readonly jobsPerSecond: number;
}

/** Result of one many-clients case. */
export interface ManyClientsResult {
  readonly streams: number;
  readonly clientProcesses: number;
  readonly idleSeconds: number;
  /** Broker resident memory with every stream open and idle. */
  readonly idleRssMiB: number;
  /** Broker CPU while idle, percent of one core. */
  readonly idleCpuPercent: number;
  readonly jobs: number;
  readonly drainSeconds: number;
  /** Jobs per stream: fewest, most, and the coefficient of variation (stdev / mean). */
  readonly perStreamMin: number;
  readonly perStreamMax: number;
  readonly perStreamCv: number;
  /** Streams that got no job. */
  readonly idleStreams: number;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Builds the Go bench worker once per run into a temporary directory (the
 * caller removes it: {@link removeGoWorker}); undefined when Go is missing.
 */
function goWorkerBinary(log: (line: string) => void): string | undefined {
  const dir = mkdtempSync(join(tmpdir(), "casq-bench-go-"));
  const out = join(dir, "go-worker");
  try {
    log("bench: building bench/clients/go-worker");
    execFileSync("go", ["build", "-o", out, "."], {
      cwd: join(ROOT, "bench", "clients", "go-worker"),
      stdio: "pipe",
    });
    return out;
  } catch (error) {
    log(`bench: go worker skipped: ${(error as Error).message.split("\n")[0]}`);
    rmSync(dir, { recursive: true, force: true });
    return undefined;
  }
}

/** Removes the directory {@link goWorkerBinary} built `binary` in. */
function removeGoWorker(binary: string): void {
  rmSync(dirname(binary), { recursive: true, force: true });
}

function collectJson(child: ChildProcess, what: string): Promise<Record<string, number>> {
  return new Promise((resolveJson, reject) => {
    let out = "";
    let err = "";
    child.stdout?.on("data", (c: Buffer) => {
      out += c.toString();
    });
    child.stderr?.on("data", (c: Buffer) => {
      err += c.toString();
    });
    child.once("exit", (code) => {
      const line = out.trim().split("\n").pop() ?? "";
      try {
        if (code !== 0) throw new Error(`exit ${code}`);
        resolveJson(JSON.parse(line) as Record<string, number>);
      } catch (error) {
        reject(new Error(`${what}: ${(error as Error).message}\n${out}\n${err}`));
      }
    });
  });
}

/** The `process` shape with the Go and Python SDK workers (those whose toolchain is here). */
export async function measureOtherSdks(
  casq: CasqSystem,
  jobs: number,
  concurrency: number,
  payloadBytes: number,
  log: (line: string) => void,
): Promise<SdkProcessResult[]> {
  const results: SdkProcessResult[] = [];
  const goBinary = goWorkerBinary(log);
  const python = join(ROOT, ".venv", "bin", "python");
  const commands: { sdk: "go" | "python"; argv: (queue: string) => [string, string[]] }[] = [];
  if (goBinary) {
    commands.push({
      sdk: "go",
      argv: (queue) => [
        goBinary,
        [
          "-brokers",
          casq.brokerAddress,
          "-queue",
          queue,
          "-jobs",
          String(jobs),
          "-concurrency",
          String(concurrency),
        ],
      ],
    });
  }
  if (existsSync(python)) {
    commands.push({
      sdk: "python",
      argv: (queue) => [
        python,
        [
          join(ROOT, "bench", "clients", "py_worker.py"),
          "--brokers",
          casq.brokerAddress,
          "--queue",
          queue,
          "--jobs",
          String(jobs),
          "--concurrency",
          String(concurrency),
        ],
      ],
    });
  } else {
    log("bench: python worker skipped: no .venv (bash scripts/setup-python.sh)");
  }
  try {
    for (const { sdk, argv } of commands) {
      const queue = await casq.preloadedQueue(jobs, payloadBytes);
      const [command, args] = argv(queue);
      const child = spawn(command, args, { stdio: ["ignore", "pipe", "pipe"] });
      const json = await collectJson(child, `${sdk} worker`);
      results.push({ sdk, jobs, jobsPerSecond: json.jobs_per_s as number });
      log(`bench: casq process (${sdk} SDK): ${Math.round(json.jobs_per_s as number)} jobs/s`);
    }
  } finally {
    if (goBinary) removeGoWorker(goBinary);
  }
  return results;
}

/** One many-clients case: `streams` Work streams over `processes` client processes. */
export async function measureManyClients(
  casq: CasqSystem,
  streams: number,
  processes: number,
  jobs: number,
  idleSeconds: number,
  log: (line: string) => void,
): Promise<ManyClientsResult> {
  const queue = await casq.preloadedQueue(0, 0);
  const children: { child: ChildProcess; handled: number; counts?: number[] }[] = [];
  for (let p = 0; p < processes; p += 1) {
    const share = Math.floor(streams / processes) + (p < streams % processes ? 1 : 0);
    const child = spawn(
      process.execPath,
      [
        "--import",
        "tsx",
        join(ROOT, "bench", "clients", "ts-streams.ts"),
        "--brokers",
        casq.brokerAddress,
        "--queue",
        queue,
        "--streams",
        String(share),
      ],
      { stdio: ["pipe", "pipe", "inherit"], cwd: ROOT },
    );
    const entry: { child: ChildProcess; handled: number; counts?: number[] } = { child, handled: 0 };
    createInterface({ input: child.stdout as NodeJS.ReadableStream }).on("line", (line) => {
      if (line.startsWith("handled ")) entry.handled = Number(line.slice(8));
      else if (line.startsWith("{")) entry.counts = (JSON.parse(line) as { counts: number[] }).counts;
    });
    children.push(entry);
  }
  try {
    const deadline = Date.now() + 120_000;
    while ((await casq.openStreams()) < streams) {
      if (Date.now() > deadline)
        throw new Error(`many clients: only ${await casq.openStreams()} of ${streams} streams opened`);
      await sleep(200);
    }
    const pid = casq.serverPids()[0] as number;
    const cpuBefore = cpuSecondsOf([pid]);
    await sleep(idleSeconds * 1000);
    const idleCpuPercent = ((cpuSecondsOf([pid]) - cpuBefore) / idleSeconds) * 100;
    const idleRssMiB = processMemory(pid).rssMiB;
    log(
      `bench: ${streams} idle streams: broker RSS ${idleRssMiB.toFixed(0)} MiB, CPU ${idleCpuPercent.toFixed(1)} %`,
    );

    const started = performance.now();
    await casq.fill(queue, jobs, 1024);
    const total = () => children.reduce((sum, c) => sum + c.handled, 0);
    const drainDeadline = Date.now() + 600_000;
    while (total() < jobs) {
      if (Date.now() > drainDeadline) throw new Error(`many clients: ${total()} of ${jobs} handled`);
      await sleep(20);
    }
    const drainSeconds = (performance.now() - started) / 1000;
    for (const c of children) c.child.stdin?.write("stop\n");
    await Promise.all(children.map((c) => new Promise((r) => c.child.once("exit", r))));
    const counts = children.flatMap((c) => c.counts ?? []);
    const mean = counts.reduce((a, b) => a + b, 0) / Math.max(1, counts.length);
    const variance = counts.reduce((a, b) => a + (b - mean) ** 2, 0) / Math.max(1, counts.length);
    const result: ManyClientsResult = {
      streams,
      clientProcesses: processes,
      idleSeconds,
      idleRssMiB,
      idleCpuPercent,
      jobs,
      drainSeconds,
      perStreamMin: Math.min(...counts),
      perStreamMax: Math.max(...counts),
      perStreamCv: mean > 0 ? Math.sqrt(variance) / mean : 0,
      idleStreams: counts.filter((c) => c === 0).length,
    };
    log(`bench: ${streams} streams drained ${jobs} jobs in ${drainSeconds.toFixed(1)} s`);
    return result;
  } finally {
    for (const c of children) if (c.child.exitCode === null) c.child.kill("SIGKILL");
  }
}
