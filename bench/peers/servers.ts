/**
 * The peers' servers, started by the benchmark on loopback from the programs
 * Debian packages (`bash scripts/setup-bench-peers.sh` installs them): Redis
 * with AOF `everysec`, PostgreSQL with its durable defaults, nats-server with
 * JetStream file storage. Each runs in a fresh temporary directory and is
 * killed and removed by `stop()`.
 */
import { type ChildProcess, execFileSync, spawn, spawnSync } from "node:child_process";
import { chmodSync, existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SkipSystem } from "../lib/queue-system.ts";

const INSTALL_HINT = "bash scripts/setup-bench-peers.sh";

/** A started server process. */
export interface PeerServer {
  readonly port: number;
  readonly pid: number;
  stop(): Promise<void>;
}

/** The user a server runs as: its ids (spawned directly, so that signals reach the server itself). */
interface RunAs {
  uid?: number;
  gid?: number;
}

function userIds(name: string): RunAs {
  const id = (flag: string) => Number(execFileSync("id", [flag, name], { encoding: "utf8" }).trim());
  return { uid: id("-u"), gid: id("-g") };
}

/** `program`'s path on PATH, if it is there (sh by its absolute path: PATH may hold nothing). */
function which(program: string): string | undefined {
  const found = spawnSync("/bin/sh", ["-c", `command -v ${program}`], { encoding: "utf8" });
  return found.status === 0 ? found.stdout.trim() : undefined;
}

async function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => resolvePort(typeof address === "object" && address ? address.port : 0));
    });
  });
}

/**
 * Spawns `command`, resolves when `ready` matches its combined output.
 * `stopSignal` ends it: a server with child processes of its own needs one it
 * passes on to them, or they outlive it and hold its output pipes open.
 */
async function startProcess(
  what: string,
  command: string,
  args: string[],
  ready: RegExp,
  dir: string,
  port: number,
  stopSignal: NodeJS.Signals = "SIGKILL",
  user: RunAs = {},
): Promise<PeerServer> {
  const child: ChildProcess = spawn(command, args, { stdio: ["ignore", "pipe", "pipe"], ...user });
  let output = "";
  await new Promise<void>((resolveReady, reject) => {
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      if (ready.test(output)) resolveReady();
    };
    child.stdout?.on("data", onData);
    child.stderr?.on("data", onData);
    child.once("exit", (code) => reject(new Error(`${what} exited (${code}):\n${output}`)));
  });
  return {
    port,
    pid: child.pid as number,
    stop: async () => {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill(stopSignal);
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Redis with AOF and `appendfsync everysec` (BullMQ's durable setup). */
export async function startRedis(): Promise<PeerServer> {
  const bin = which("redis-server");
  if (!bin) throw new SkipSystem(`skipped: install redis-server (${INSTALL_HINT})`);
  const dir = mkdtempSync(join(tmpdir(), "casq-bench-redis-"));
  const port = await freePort();
  return startProcess(
    "redis-server",
    bin,
    [
      "--port",
      String(port),
      "--bind",
      "127.0.0.1",
      "--dir",
      dir,
      "--appendonly",
      "yes",
      "--appendfsync",
      "everysec",
      "--save",
      "",
      "--maxmemory-policy",
      "noeviction",
    ],
    /Ready to accept connections/,
    dir,
    port,
  );
}

/**
 * The directory of PostgreSQL's programs: `CASQ_BENCH_POSTGRES_BIN` when set
 * (an install outside Debian's layout), else the newest of Debian's.
 */
function postgresBin(): string | undefined {
  const override = process.env.CASQ_BENCH_POSTGRES_BIN;
  if (override !== undefined) return existsSync(join(override, "postgres")) ? override : undefined;
  const base = "/usr/lib/postgresql";
  if (!existsSync(base)) return undefined;
  const versions = readdirSync(base).sort((a, b) => Number(b) - Number(a));
  for (const v of versions) if (existsSync(join(base, v, "bin", "postgres"))) return join(base, v, "bin");
  return undefined;
}

/** PostgreSQL with its defaults (fsync on, synchronous_commit on), trust auth on loopback. */
export async function startPostgres(): Promise<PeerServer> {
  const bin = postgresBin();
  if (!bin) throw new SkipSystem(`skipped: install postgresql (${INSTALL_HINT})`);
  const dir = mkdtempSync(join(tmpdir(), "casq-bench-pg-"));
  chmodSync(dir, 0o777);
  const data = join(dir, "data");
  // PostgreSQL refuses to run as root: run it as the `postgres` user the package creates.
  const user = process.getuid?.() === 0 ? userIds("postgres") : {};
  execFileSync(join(bin, "initdb"), ["-D", data, "-A", "trust", "-U", "bench", "--no-sync"], {
    stdio: "pipe",
    ...user,
  });
  const port = await freePort();
  return startProcess(
    "postgres",
    join(bin, "postgres"),
    [
      "-D",
      data,
      "-p",
      String(port),
      "-k",
      dir,
      "-c",
      "listen_addresses=127.0.0.1",
      "-c",
      "max_connections=200",
    ],
    /database system is ready to accept connections/,
    dir,
    port,
    // "Immediate shutdown": the postmaster ends its backends and exits at once (SIGKILL would leave them running).
    "SIGQUIT",
    user,
  );
}

/** nats-server with JetStream on file storage. */
export async function startNats(): Promise<PeerServer> {
  const bin = which("nats-server");
  if (!bin) throw new SkipSystem(`skipped: install nats-server (${INSTALL_HINT})`);
  const dir = mkdtempSync(join(tmpdir(), "casq-bench-nats-"));
  const port = await freePort();
  return startProcess(
    "nats-server",
    bin,
    ["-js", "-sd", dir, "-a", "127.0.0.1", "-p", String(port)],
    /Server is ready/,
    dir,
    port,
  );
}
