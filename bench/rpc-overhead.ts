/**
 * Per-RPC cost of casq's serving stack, against a plain @grpc/grpc-js server
 * under the same load tool (ghz, a third-party gRPC load generator, in its own
 * process).
 *
 *   npm run bench:rpc                       # 3 alternating runs per server and case, medians
 *   npm run -s bench:rpc -- --json          # one JSON object on stdout (progress on stderr; -s: no npm header)
 *   npm run bench:rpc -- --runs 5 --duration 10 --concurrency 64 --cases health
 *   npm run bench:rpc -- --cpu-prof DIR     # each server writes its .cpuprofile files into DIR/NAME on exit
 *   npm run bench:rpc -- --serve-args "--metrics-listen 127.0.0.1:0"
 *
 * Servers, each started once and warmed up:
 * - **casq**: `casq serve --store memory:` (no other flags: no auth, metrics or
 *   tracing); its gRPC clients are served by @grpc/grpc-js through casq's
 *   adapter, with casq's interceptors; by default the installed build of this
 *   checkout (plain node), `--server source` for the checkout's tsx launcher;
 * - **grpc-js**: bench/rpc/plain-grpc-js-server.ts, the same methods on a bare
 *   @grpc/grpc-js server (Check answers SERVING; Enqueue decodes the request
 *   and answers without queue work): the yardstick;
 * - **connect**: bench/rpc/plain-connect-server.ts, the same methods through
 *   @connectrpc/connect-node on a bare HTTP/2 server: what casq cost per call
 *   when connect-node served its gRPC clients too.
 *
 * Cases: `grpc.health.v1.Health/Check` (the trivial unary call, for
 * --duration seconds per run) and `casq.v1.QueueService/Enqueue` with one
 * 1 KiB message (--enqueue-calls calls per run into a fresh queue: casq's cost
 * per Enqueue grows with the shard document, so a fixed count compares
 * servers at the same queue sizes). Runs alternate between the servers
 * (casq, grpc-js, connect, casq, ...) so all see the same background load; reported are
 * medians of calls/s, p50 and p99 (ghz's own numbers) and the server's CPU
 * time per call (from /proc, the steadiest number on a busy machine).
 *
 * ghz is looked up in $GHZ, `.tools-local/bin/ghz`, then PATH; when missing it
 * is built with `go install` into `.tools-local/bin` (the Go module proxy).
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { create, type DescFile, toBinary } from "@bufbuild/protobuf";
import { FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import { file_casq_v1_queue_service } from "@casq/api/casq/v1/queue_service_pb.ts";
import { file_grpc_health_v1_health } from "@casq/api/grpc/health/v1/health_pb.ts";
import { installBuiltServer } from "./lib/built-server.ts";
import { cpuSecondsOf } from "./lib/process-cpu.ts";
import { spread } from "./lib/report.ts";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const GHZ_MODULE = "github.com/bojand/ghz/cmd/ghz@v0.93.0";

const { values } = parseArgs({
  options: {
    json: { type: "boolean", default: false },
    runs: { type: "string", default: "3" },
    duration: { type: "string", default: "5" },
    "enqueue-calls": { type: "string", default: "4000" },
    concurrency: { type: "string", default: "64" },
    connections: { type: "string", default: "1" },
    cases: { type: "string", default: "health,enqueue" },
    servers: { type: "string", default: "casq,grpc-js,connect" },
    "cpu-prof": { type: "string" },
    "serve-args": { type: "string", default: "" },
    server: { type: "string", default: "built" },
    help: { type: "boolean", short: "h", default: false },
  },
});
if (values.help) {
  console.log(`usage: npm run bench:rpc -- [--json] [--runs N] [--duration SECONDS] [--enqueue-calls N] [--concurrency N]
                              [--connections N] [--cases health,enqueue] [--servers casq,grpc-js,connect]
                              [--cpu-prof DIR] [--serve-args "ARGS"] [--server built|source]
--server built (default): casq serve as users install it (this checkout built, packed and installed
from its npm tarballs, plain node; ~30 s first); source: the checkout's launcher (TypeScript through tsx).`);
  process.exit(0);
}
if (values.server !== "built" && values.server !== "source") {
  console.error(`--server takes built or source; got ${values.server}`);
  process.exit(2);
}
const runs = Number(values.runs);
const durationS = Number(values.duration);
const enqueueCalls = Number(values["enqueue-calls"]);
const concurrency = Number(values.concurrency);
const connections = Number(values.connections);
const progress = (line: string) => process.stderr.write(`${line}\n`);
const built =
  values.server === "built" && values.servers.split(",").includes("casq")
    ? installBuiltServer(progress)
    : undefined;
process.once("exit", () => built?.remove());

type ServerName = "casq" | "grpc-js" | "connect";
type CaseName = "health" | "enqueue";
/** What ghz sends: for `seconds`, or `calls` calls in all. */
type Load = { readonly seconds: number } | { readonly calls: number };
const CASES: Record<CaseName, { call: string; load: Load; data: (run: number) => unknown }> = {
  health: {
    call: "grpc.health.v1.Health/Check",
    load: { seconds: durationS },
    data: () => ({ service: "" }),
  },
  enqueue: {
    call: "casq.v1.QueueService/Enqueue",
    // A fixed count: casq's cost per Enqueue grows with the queue, so every server ends at the same size.
    load: { calls: enqueueCalls },
    data: (run) => ({
      queue: `rpc-bench-${process.pid}-${run}`,
      messages: [{ payload: Buffer.alloc(1024, 97).toString("base64") }],
    }),
  },
};

/** One ghz run, as measured. */
interface Run {
  readonly callsPerSecond: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly errors: number;
  /** Server CPU time per answered call (µs). */
  readonly serverCpuUsPerCall: number;
}

/** A server process under test. */
interface Server {
  readonly name: ServerName;
  readonly child: ChildProcess;
  readonly address: string;
}

function findGhz(): string {
  const local = join(ROOT, ".tools-local", "bin", "ghz");
  for (const candidate of [process.env.GHZ, local]) if (candidate && existsSync(candidate)) return candidate;
  try {
    return execFileSync("sh", ["-c", "command -v ghz"], { encoding: "utf8" }).trim();
  } catch {
    progress(`ghz not found: building ${GHZ_MODULE} into .tools-local/bin`);
    execFileSync("go", ["install", GHZ_MODULE], {
      env: { ...process.env, GOBIN: dirname(local) },
      stdio: ["ignore", "inherit", "inherit"],
    });
    return local;
  }
}

/** A FileDescriptorSet of `files` and everything they import, imports first (ghz's --protoset). */
function protoset(files: readonly DescFile[]): Uint8Array {
  const ordered: DescFile[] = [];
  const visit = (file: DescFile) => {
    if (ordered.includes(file)) return;
    for (const dep of file.dependencies) visit(dep);
    ordered.push(file);
  };
  for (const file of files) visit(file);
  return toBinary(
    FileDescriptorSetSchema,
    create(FileDescriptorSetSchema, { file: ordered.map((f) => f.proto) }),
  );
}

function waitForAddress(child: ChildProcess, what: string): Promise<string> {
  return new Promise((resolveAddress, reject) => {
    let seen = "";
    const onData = (chunk: Buffer) => {
      seen += chunk.toString();
      const match = /listening on (\S+)/.exec(seen);
      if (match) {
        child.stdout?.off("data", onData);
        child.stdout?.resume(); // keep draining
        resolveAddress(match[1] as string);
      }
    };
    child.stdout?.on("data", onData);
    child.once("exit", (code) => reject(new Error(`${what} exited (${code}) before listening:\n${seen}`)));
  });
}

async function startServer(name: ServerName): Promise<Server> {
  const prof = values["cpu-prof"]
    ? ["--cpu-prof", "--cpu-prof-dir", join(resolve(values["cpu-prof"]), name)]
    : [];
  const args =
    name === "casq"
      ? [
          ...prof,
          built?.bin ?? join(ROOT, "server", "bin", "casq.js"),
          "serve",
          "--store",
          "memory:",
          "--listen",
          "127.0.0.1:0",
          ...values["serve-args"].split(" ").filter((a) => a !== ""),
        ]
      : [...prof, "--import", "tsx", join(ROOT, "bench", "rpc", `plain-${name}-server.ts`), "127.0.0.1:0"];
  const child = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "inherit"], cwd: ROOT });
  return { name, child, address: await waitForAddress(child, name) };
}

async function stopServer(server: Server): Promise<void> {
  if (server.child.exitCode !== null) return;
  const exited = new Promise((r) => server.child.once("exit", r));
  server.child.kill("SIGTERM");
  await exited;
}

/** ghz's JSON report, the fields used here. */
interface GhzReport {
  count: number;
  /** Wall time of the run (ns). */
  total: number;
  rps: number;
  latencyDistribution: { percentage: number; latency: number }[] | null;
  statusCodeDistribution: Record<string, number>;
  errorDistribution: Record<string, number> | null;
}

function ghz(ghzPath: string, protosetFile: string, server: Server, call: string, data: unknown, load: Load) {
  const out = execFileSync(
    ghzPath,
    [
      "--insecure",
      "--protoset",
      protosetFile,
      "--call",
      call,
      "--data",
      JSON.stringify(data),
      "--concurrency",
      String(concurrency),
      "--connections",
      String(connections),
      ...("seconds" in load ? ["--duration", `${load.seconds}s`] : ["--total", String(load.calls)]),
      "--duration-stop",
      "ignore",
      "--format",
      "json",
      server.address,
    ],
    { encoding: "utf8", maxBuffer: 64 * 1024 * 1024 },
  );
  return JSON.parse(out) as GhzReport;
}

function measureRun(ghzPath: string, protosetFile: string, server: Server, name: CaseName, run: number): Run {
  const pid = server.child.pid as number;
  const cpuBefore = cpuSecondsOf([pid]);
  const report = ghz(
    ghzPath,
    protosetFile,
    server,
    CASES[name].call,
    CASES[name].data(run),
    CASES[name].load,
  );
  const cpu = cpuSecondsOf([pid]) - cpuBefore;
  const ok = report.statusCodeDistribution.OK ?? 0;
  const pct = (p: number) =>
    (report.latencyDistribution?.find((d) => d.percentage === p)?.latency ?? Number.NaN) / 1e6;
  const errors = report.count - ok;
  if (errors > 0)
    progress(`  ${server.name} ${name}: ${errors} errors ${JSON.stringify(report.errorDistribution)}`);
  return {
    callsPerSecond: ok / (report.total / 1e9),
    p50Ms: pct(50),
    p99Ms: pct(99),
    errors,
    serverCpuUsPerCall: ok > 0 ? (cpu * 1e6) / ok : Number.NaN,
  };
}

const median = (xs: readonly number[]) => spread(xs).median;

async function main() {
  const ghzPath = findGhz();
  const dir = mkdtempSync(join(tmpdir(), "casq-rpc-bench-"));
  const protosetFile = join(dir, "services.protoset");
  writeFileSync(protosetFile, protoset([file_grpc_health_v1_health, file_casq_v1_queue_service]));
  const cases = values.cases.split(",") as CaseName[];
  const serverNames = values.servers.split(",") as ServerName[];
  const servers: Server[] = [];
  try {
    for (const name of serverNames) servers.push(await startServer(name));
    for (const server of servers) {
      // Warm-up: JIT, connection setup, the first queue's creation.
      for (const name of cases)
        ghz(ghzPath, protosetFile, server, CASES[name].call, CASES[name].data(0), { seconds: 2 });
    }
    const results: Record<string, Record<string, Run[]>> = {};
    let runNumber = 0;
    for (const name of cases) {
      const byServer: Record<string, Run[]> = Object.fromEntries(servers.map((s) => [s.name, []]));
      results[name] = byServer;
      for (let i = 0; i < runs; i += 1) {
        for (const server of servers) {
          runNumber += 1;
          const run = measureRun(ghzPath, protosetFile, server, name, runNumber);
          byServer[server.name]?.push(run);
          progress(
            `${name} ${server.name} run ${i + 1}: ${run.callsPerSecond.toFixed(0)} calls/s, p50 ${run.p50Ms.toFixed(2)} ms, p99 ${run.p99Ms.toFixed(2)} ms, server ${run.serverCpuUsPerCall.toFixed(0)} µs CPU/call`,
          );
        }
      }
    }
    const summary = cases.map((name) => {
      const per = Object.fromEntries(
        Object.entries(results[name] ?? {}).map(([server, rs]) => [
          server,
          {
            callsPerSecond: median(rs.map((r) => r.callsPerSecond)),
            callsPerSecondMin: Math.min(...rs.map((r) => r.callsPerSecond)),
            callsPerSecondMax: Math.max(...rs.map((r) => r.callsPerSecond)),
            p50Ms: median(rs.map((r) => r.p50Ms)),
            p99Ms: median(rs.map((r) => r.p99Ms)),
            serverCpuUsPerCall: median(rs.map((r) => r.serverCpuUsPerCall)),
            errors: rs.reduce((s, r) => s + r.errors, 0),
          },
        ]),
      );
      const casq = per.casq;
      const plain = per["grpc-js"];
      return {
        case: name,
        call: CASES[name].call,
        servers: per,
        /** How many times slower casq is than plain grpc-js (calls/s of grpc-js over casq's). */
        slowdown: casq && plain ? plain.callsPerSecond / casq.callsPerSecond : undefined,
      };
    });
    if (values.json) {
      console.log(
        JSON.stringify(
          {
            concurrency,
            connections,
            durationS,
            enqueueCalls,
            runs,
            serveArgs: values["serve-args"],
            server: built ? "built" : "source",
            summary,
            results,
          },
          null,
          2,
        ),
      );
    } else {
      console.log(
        `\ncasq serve: ${built ? "the installed build (plain node)" : "the checkout's source (through tsx)"}`,
      );
      console.log(
        `medians of ${runs} alternating runs (health: ${durationS} s each; enqueue: ${enqueueCalls} calls each, a fresh queue), ${concurrency} concurrent calls on ${connections} connection(s) (ghz)`,
      );
      console.log("case     server    calls/s (min-max)         p50 ms   p99 ms   server CPU µs/call");
      for (const s of summary) {
        for (const [server, r] of Object.entries(s.servers))
          console.log(
            `${s.case.padEnd(8)} ${server.padEnd(9)} ${r.callsPerSecond.toFixed(0).padStart(7)} (${r.callsPerSecondMin.toFixed(0)}-${r.callsPerSecondMax.toFixed(0)})`.padEnd(
              45,
            ) +
              `${r.p50Ms.toFixed(2).padStart(6)}   ${r.p99Ms.toFixed(2).padStart(6)}   ${r.serverCpuUsPerCall.toFixed(0).padStart(6)}`,
          );
        if (s.slowdown !== undefined)
          console.log(
            `${s.case.padEnd(8)} casq is ${s.slowdown.toFixed(2)}x slower than plain grpc-js (goal <= 1.3x for health)`,
          );
      }
    }
  } finally {
    for (const server of servers) await stopServer(server);
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
