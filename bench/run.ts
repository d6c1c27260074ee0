/**
 * End-to-end benchmark: casq against the queues users would pick instead,
 * in the same run on the same machine, as ratios.
 *
 *   npm run bench                      # every shape, 3 runs each, casq + every installed peer
 *   npm run bench -- --quick           # small sizes, 1 run (a smoke test of the whole path)
 *   npm run -s bench -- --json         # one JSON object on stdout (progress goes to stderr; -s: no npm header)
 *   npm run bench -- --systems casq,bullmq --shapes process --runs 5
 *   npm run bench -- --chart docs/benchmarks.svg
 *
 * Every system is started first, then each shape's runs take turns between
 * them (run 1 of each system, then run 2 of each, ...): on a machine whose
 * speed drifts over minutes, as shared virtual machines' do, the systems'
 * runs of one shape are minutes apart at most (`--sequential`: every run of
 * one system, then the next).
 *
 * casq runs as its own `casq serve` process on the file store (fsync before
 * every answer): by default the installed build of this checkout, as users
 * run it (`--server source`: the checkout's tsx launcher). It is driven through the TypeScript SDK's Producer and
 * Worker. Peers: BullMQ on Redis (AOF everysec), pg-boss on PostgreSQL and
 * NATS JetStream (file storage), each started by the script on loopback when
 * its server is installed (`bash scripts/setup-bench-peers.sh`), skipped with
 * a message otherwise. Their client libraries live in `bench/peers` (a
 * package of its own, installed here on first use).
 */
import { execFileSync } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { serverFromOption } from "./lib/built-server.ts";
import {
  type ManyClientsResult,
  measureManyClients,
  measureOtherSdks,
  type SdkProcessResult,
} from "./lib/casq-extras.ts";
import { checkGoals, goalLines } from "./lib/goals.ts";
import { type QueueSystem, SkipSystem } from "./lib/queue-system.ts";
import { ratios, type ShapeResult, summarize, svgChart, textTable } from "./lib/report.ts";
import { type Measurement, measure, SHAPES, type ShapeName, type ShapeSizes } from "./lib/shapes.ts";
import { CasqSystem } from "./systems/casq.ts";

const HERE = dirname(fileURLToPath(import.meta.url));
const PEERS = ["bullmq", "pg-boss", "jetstream"] as const;
/** casq with every store PUT delayed by 100 ms: the S3-like profile. */
const CASQ_S3_LIKE = "casq-put100ms";

const { values } = parseArgs({
  options: {
    json: { type: "boolean", default: false },
    quick: { type: "boolean", default: false },
    runs: { type: "string" },
    jobs: { type: "string" },
    systems: { type: "string", default: ["casq", ...PEERS, "casq-put100ms"].join(",") },
    shapes: { type: "string", default: SHAPES.join(",") },
    chart: { type: "string" },
    clients: { type: "string" },
    server: { type: "string", default: "built" },
    // Node 20's parseArgs has no --no-X negation: the flag is its own option.
    "no-other-sdks": { type: "boolean", default: false },
    sequential: { type: "boolean", default: false },
    help: { type: "boolean", short: "h", default: false },
  },
});

if (values.help) {
  console.log(`usage: npm run bench -- [--quick] [--json] [--runs N] [--jobs N]
                          [--systems casq,bullmq,pg-boss,jetstream,casq-put100ms] [--shapes ${SHAPES.join(",")}]
                          [--chart FILE.svg] [--clients 100,1000] [--no-other-sdks] [--server built|source]
                          [--sequential]
Runs each shape --runs times (default 3; 1 with --quick) against casq and each installed peer,
prints min/median/max, CPU, casq's PUTs per job and casq's ratio to each peer, then which of the
performance goals of docs/benchmarks.md the run met (those whose systems and shapes it ran).
The systems take turns: run 1 of a shape on each system, then run 2 on each, and so on, so that
a machine whose speed drifts over minutes favours none of them (--sequential: every run of one
system, then the next system's).
casq-put100ms is casq with every store PUT delayed 100 ms (the S3-like profile).
With casq: the process shape with the Go and Python SDK workers (--no-other-sdks to skip), and the
many-clients case with --clients streams (default 100,1000; 100 with --quick; "" to skip).
--server built (default): the casq system runs casq serve as users install it (this checkout built,
packed and installed from the npm tarballs into a temporary directory, plain node; ~30 s first);
--server source: the checkout's launcher (TypeScript through tsx). casq-put100ms runs
bench/systems/slow-store-server.ts (its slow store wraps the engine in-process): compiled beside the
installed build, or through tsx with --server source.`);
  process.exit(0);
}

const quick = values.quick;
const runs = Number(values.runs ?? (quick ? 1 : 3));
const sizes: ShapeSizes = {
  jobs: Number(values.jobs ?? (quick ? 2_000 : 20_000)),
  callers: 64,
  batch: 100,
  batchCallers: 4,
  concurrency: 50,
  latencyRate: 200,
  latencySeconds: quick ? 3 : 10,
  payloadBytes: 1024,
};
const shapes = values.shapes
  .split(",")
  .filter((s): s is ShapeName => (SHAPES as readonly string[]).includes(s));
const wanted = values.systems.split(",");
const log = (line: string) => process.stderr.write(`${line}\n`);

/** Installs the peers' client libraries into bench/peers once. */
function ensurePeerLibraries(): void {
  if (existsSync(join(HERE, "peers", "node_modules", "bullmq"))) return;
  log("bench: installing the peers' client libraries into bench/peers (npm ci)");
  execFileSync("npm", ["ci", "--no-audit", "--no-fund", "--loglevel=error"], {
    cwd: join(HERE, "peers"),
    stdio: "inherit",
  });
}

async function loadPeer(name: (typeof PEERS)[number]): Promise<QueueSystem> {
  ensurePeerLibraries();
  // Loaded by computed path: the root type check does not see the peers' libraries (bench/peers has its own tsconfig).
  const file = join(HERE, "peers", `${name}.ts`);
  const mod = (await import(file)) as Record<string, new () => QueueSystem>;
  const ctor = Object.values(mod).find((v) => typeof v === "function");
  if (!ctor) throw new Error(`${file} exports no system`);
  return new ctor();
}

const clientCases = (values.clients ?? (quick ? "100" : "100,1000")).split(",").filter(Boolean).map(Number);
// A case with no streams would wait for ever for its jobs to drain.
if (clientCases.some((n) => !Number.isInteger(n) || n < 1)) {
  console.error(
    `--clients takes stream counts of at least 1 (e.g. 100,1000), or "" to skip; got ${values.clients}`,
  );
  process.exit(2);
}
const results: ShapeResult[] = [];
let otherSdks: SdkProcessResult[] = [];
const manyClients: ManyClientsResult[] = [];
const skipped: Record<string, string> = {};
const durability: Record<string, string> = {};

const built = serverFromOption(values.server, wanted.includes("casq") || wanted.includes(CASQ_S3_LIKE), log);
const server = built ? "built" : "source";
/** Makes the system called `name`. */
async function systemNamed(name: string): Promise<QueueSystem> {
  if (name === "casq")
    return new (await import("./systems/casq.ts")).CasqSystem(built ? { serverBin: built.bin } : {});
  if (name === CASQ_S3_LIKE)
    return new (await import("./systems/casq.ts")).CasqSystem({
      putLatencyMs: 100,
      ...(built ? { slowStoreServer: built.slowStoreServer } : {}),
    });
  if ((PEERS as readonly string[]).includes(name)) return loadPeer(name as (typeof PEERS)[number]);
  throw new Error(`unknown system ${name}: use casq, ${PEERS.join(", ")}, ${CASQ_S3_LIKE}`);
}

/** Starts `system`; false (with the reason noted) when it cannot run here. */
async function started(name: string, system: QueueSystem): Promise<boolean> {
  try {
    await system.start();
  } catch (error) {
    if (!(error instanceof SkipSystem)) throw error;
    skipped[name] = error.message;
    log(`bench: ${name}: ${error.message}`);
    return false;
  }
  durability[system.name] = system.durability;
  return true;
}

/** Measures run `run` of `shape` on `system` and logs it. */
async function measureRun(system: QueueSystem, shape: ShapeName, run: number): Promise<Measurement> {
  const m = await measure(system, shape, sizes);
  log(
    `bench: ${system.name} ${shape} run ${run}/${runs}: ${
      shape === "latency"
        ? `p50 ${m.p50Ms?.toFixed(2)} ms, p99 ${m.p99Ms?.toFixed(2)} ms`
        : `${Math.round(m.jobsPerSecond)} jobs/s`
    }`,
  );
  return m;
}

/**
 * Runs `shapes` on `systems` (started), each shape's runs taking turns between
 * them (see the module header); on one system, every run of a shape in a row.
 */
async function measureInTurns(systems: readonly QueueSystem[]): Promise<void> {
  const measured = systems.map(() => new Map<ShapeName, Measurement[]>(shapes.map((shape) => [shape, []])));
  for (const shape of shapes)
    for (let run = 1; run <= runs; run += 1)
      for (const [i, system] of systems.entries())
        measured[i]?.get(shape)?.push(await measureRun(system, shape, run));
  for (const [i, system] of systems.entries())
    for (const shape of shapes) results.push(summarize(system.name, shape, measured[i]?.get(shape) ?? []));
}

/** casq's extras: the process shape through the Go and Python SDKs, and the many-clients case. */
async function measureCasqExtras(system: QueueSystem): Promise<void> {
  if (!(system instanceof CasqSystem) || system.name !== "casq") return;
  if (!values["no-other-sdks"] && shapes.includes("process")) {
    otherSdks = await measureOtherSdks(system, sizes.jobs, sizes.concurrency, sizes.payloadBytes, log);
  }
  for (const streams of clientCases) {
    manyClients.push(await measureManyClients(system, streams, 4, sizes.jobs, quick ? 3 : 10, log));
  }
}

const running: QueueSystem[] = [];
try {
  if (values.sequential) {
    for (const name of wanted) {
      const system = await systemNamed(name);
      if (!(await started(name, system))) continue;
      running.push(system);
      await measureInTurns([system]);
      await measureCasqExtras(system);
      await system.stop();
      running.pop();
    }
  } else {
    for (const name of wanted) {
      const system = await systemNamed(name);
      if (await started(name, system)) running.push(system);
    }
    await measureInTurns(running);
    for (const system of running) await measureCasqExtras(system);
  }
} finally {
  for (const system of running) await system.stop();
}

const machine = {
  cpus: cpus().length,
  cpu_model: cpus()[0]?.model,
  memory_gib: Math.round(totalmem() / 2 ** 30),
};
if (values.chart) writeFileSync(values.chart, svgChart(results, shapes));
if (values.json) {
  console.log(
    JSON.stringify(
      {
        machine,
        server,
        sizes,
        runs,
        durability,
        skipped,
        results,
        ratios: ratios(results),
        goals: checkGoals(results, sizes, runs),
        other_sdks: otherSdks,
        many_clients: manyClients,
      },
      null,
      2,
    ),
  );
} else {
  console.log(
    `machine: ${machine.cpus} cores (${machine.cpu_model}), ${machine.memory_gib} GiB; ${runs} run(s) per shape`,
  );
  console.log(`sizes: ${JSON.stringify(sizes)}`);
  console.log(
    `casq serve: ${built ? "the installed build (plain node)" : "the checkout's source (through tsx)"}`,
  );
  for (const [name, d] of Object.entries(durability)) console.log(`durability of ${name}: ${d}`);
  for (const [name, why] of Object.entries(skipped)) console.log(`${name}: ${why}`);
  console.log(textTable(results, shapes));
  console.log(goalLines(checkGoals(results, sizes, runs)));
  const tsProcess = results.find((r) => r.system === "casq" && r.shape === "process");
  const bullProcess = results.find((r) => r.system === "bullmq" && r.shape === "process");
  if (otherSdks.length > 0) {
    console.log("\nprocess with the other SDKs' workers (one run each, jobs/s):");
    for (const r of otherSdks) {
      const vsTs = tsProcess
        ? ` (${(r.jobsPerSecond / tsProcess.value.median).toFixed(2)}x the TS SDK`
        : " (";
      const vsBull = bullProcess
        ? `, ${(r.jobsPerSecond / bullProcess.value.median).toFixed(3)}x BullMQ)`
        : ")";
      console.log(
        `  casq ${r.sdk.padEnd(8)}${Math.round(r.jobsPerSecond).toLocaleString("en-US").padStart(8)}${vsTs}${vsBull}`,
      );
    }
  }
  if (manyClients.length > 0) {
    console.log(
      "\nmany clients (casq, 4 client processes, each stream one SDK Worker run at concurrency 1):",
    );
    console.log(
      "  streams  idle RSS MiB  idle CPU %  drain s  jobs/stream min/max  cv    streams with no job",
    );
    for (const m of manyClients) {
      console.log(
        `  ${String(m.streams).padStart(7)}  ${m.idleRssMiB.toFixed(0).padStart(12)}  ${m.idleCpuPercent
          .toFixed(1)
          .padStart(
            10,
          )}  ${m.drainSeconds.toFixed(1).padStart(7)}  ${`${m.perStreamMin}/${m.perStreamMax}`.padStart(
          20,
        )}  ${m.perStreamCv.toFixed(2).padStart(4)}  ${String(m.idleStreams).padStart(5)}`,
      );
    }
  }
}
