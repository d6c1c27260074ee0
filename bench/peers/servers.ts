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

function which(program: string): string | undefined {
  const found = spawnSync("sh", ["-c", `command -v ${program}`], { encoding: "utf8" });
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

/** Spawns `command`, resolves when `ready` matches its combined output. */
async function startProcess(
  what: string,
  command: string,
  args: string[],
  ready: RegExp,
  dir: string,
  port: number,
): Promise<PeerServer> {
  const child: ChildProcess = spawn(command, args, { stdio: ["ignore", "pipe", "pipe"] });
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
        child.kill("SIGKILL");
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

function postgresBin(): string | undefined {
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
  const asUser = process.getuid?.() === 0 ? ["runuser", "-u", "postgres", "--"] : [];
  const run = (args: string[]) => {
    const [command, ...rest] = [...asUser, ...args];
    execFileSync(command as string, rest, { stdio: "pipe" });
  };
  run([join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "bench", "--no-sync"]);
  const port = await freePort();
  const [command, ...rest] = [
    ...asUser,
    join(bin, "postgres"),
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
  ];
  return startProcess(
    "postgres",
    command as string,
    rest,
    /database system is ready to accept connections/,
    dir,
    port,
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
