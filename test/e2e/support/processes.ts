/**
 * Real processes for the end-to-end suites: `casq serve` brokers started with
 * `node CASQ_BIN serve` (see {@link CASQ_BIN}) on a temporary file store and a free
 * loopback port (port 0: the broker prints what it bound, so there is no port
 * race), the `casq` CLI as a process, and grpcurl.
 *
 * Every broker is killed when the test process exits, even if a test forgets
 * to stop it.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root. */
export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

/** The checkout's `casq` launcher (the TypeScript source through tsx). */
export const CHECKOUT_CASQ_BIN = join(ROOT, "server", "bin", "casq.js");

/**
 * The `casq` launcher the suites run: `CASQ_TEST_BIN` when set (`npm test`
 * unpacks the build once and sets it, see test/support/install-built-casq.ts),
 * else the checkout's.
 */
export const CASQ_BIN = process.env.CASQ_TEST_BIN || CHECKOUT_CASQ_BIN;

/** Where `bash scripts/setup-grpcurl.sh` installs grpcurl. */
export const GRPCURL_BIN = join(ROOT, ".tools", "bin", "grpcurl");

/** The command that installs grpcurl. */
export const GRPCURL_SETUP_COMMAND = "bash scripts/setup-grpcurl.sh";

/** The directory holding the .proto files. */
export const PROTO_DIR = join(ROOT, "proto");

const live = new Set<ChildProcess>();

/** The environment of child processes: ours without the CASQ_* variables that would change the CLI's defaults. */
function childEnv(extra: Readonly<Record<string, string>> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const name of Object.keys(env)) if (name.startsWith("CASQ_")) delete env[name];
  return { ...env, ...extra };
}
process.on("exit", () => {
  for (const child of live) child.kill("SIGKILL");
});

/** A temporary directory, removed by the returned function. */
export function tempDir(prefix: string): { path: string; remove: () => void } {
  const path = mkdtempSync(join(tmpdir(), `casq-e2e-${prefix}-`));
  return { path, remove: () => rmSync(path, { recursive: true, force: true }) };
}

/** A loopback TCP port nothing listens on (right now). */
export async function closedPort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => resolvePort(port));
    });
  });
}

/** How a process ended. */
export interface ProcessExit {
  /** Exit code (null when killed by a signal). */
  readonly code: number | null;
  /** Signal that killed it, if any. */
  readonly signal: NodeJS.Signals | null;
}

/** A `casq serve` process. */
export interface CasqServerProcess {
  /** `127.0.0.1:PORT` the broker listens on. */
  readonly address: string;
  /** The child process. */
  readonly child: ChildProcess;
  /** Everything it printed so far (stdout and stderr). */
  output(): string;
  /** Resolves when the process has exited. */
  readonly exited: Promise<ProcessExit>;
  /** Sends a signal and waits for the exit (SIGKILL after `timeoutMs`). */
  stop(signal?: NodeJS.Signals, timeoutMs?: number): Promise<ProcessExit>;
}

/** Options of {@link startServer}. */
export interface StartServerOptions {
  /** Store URL, e.g. `file:/tmp/x`. */
  readonly store: string;
  /** Listen address (default `127.0.0.1:0`). */
  readonly listen?: string;
  /** More `casq serve` flags. */
  readonly args?: readonly string[];
  /** How long to wait for the "listening on" line (default 30 s). */
  readonly readyTimeoutMs?: number;
  /** Extra environment variables (e.g. `OTEL_*`). */
  readonly env?: Readonly<Record<string, string>>;
  /** The launcher (default {@link CASQ_BIN}). */
  readonly bin?: string;
}

/** Starts `casq serve` and waits until it prints where it listens. */
export async function startServer(options: StartServerOptions): Promise<CasqServerProcess> {
  const child = spawn(
    process.execPath,
    [
      options.bin ?? CASQ_BIN,
      "serve",
      "--store",
      options.store,
      "--listen",
      options.listen ?? "127.0.0.1:0",
      "--log-level",
      "warn",
      ...(options.args ?? []),
    ],
    { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"], env: childEnv(options.env) },
  );
  live.add(child);
  let output = "";
  const exited = new Promise<ProcessExit>((resolveExit) => {
    child.once("exit", (code, signal) => {
      live.delete(child);
      resolveExit({ code, signal });
    });
  });
  const address = await new Promise<string>((resolveAddress, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`casq serve did not print "listening on" within the timeout; output:\n${output}`));
    }, options.readyTimeoutMs ?? 30_000);
    const onData = (chunk: Buffer) => {
      output += chunk.toString("utf8");
      const match = /listening on (\S+)/.exec(output);
      if (match?.[1] !== undefined) {
        clearTimeout(timer);
        resolveAddress(match[1]);
      }
    };
    child.stdout?.on("data", onData);
    child.stderr?.on("data", onData);
    void exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(
        new Error(`casq serve exited (code ${code}, signal ${signal}) before listening; output:\n${output}`),
      );
    });
  });
  const stop = async (signal: NodeJS.Signals = "SIGTERM", timeoutMs = 20_000): Promise<ProcessExit> => {
    if (child.exitCode !== null || child.signalCode !== null) return exited;
    child.kill(signal);
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    const result = await exited;
    clearTimeout(timer);
    return result;
  };
  return { address, child, output: () => output, exited, stop };
}

/** Result of a finished process. */
export interface RunResult {
  /** Exit code (null when killed by a signal). */
  readonly code: number | null;
  /** Everything written to stdout. */
  readonly stdout: string;
  /** Everything written to stderr. */
  readonly stderr: string;
}

/** Options of {@link run}. */
export interface RunOptions {
  /** Written to stdin, which is then closed (default: stdin closed at once). */
  readonly input?: string;
  /** Extra environment variables. */
  readonly env?: Readonly<Record<string, string>>;
  /** Kill after this long (default 60 s). */
  readonly timeoutMs?: number;
  /** Working directory (default: the repository root). */
  readonly cwd?: string;
}

/** Runs a program to completion. */
export function run(program: string, args: readonly string[], options: RunOptions = {}): Promise<RunResult> {
  return new Promise((resolveRun, reject) => {
    const child = spawn(program, args, { cwd: options.cwd ?? ROOT, env: childEnv(options.env) });
    live.add(child);
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => {
      stdout += chunk.toString("utf8");
    });
    child.stderr.on("data", (chunk: Buffer) => {
      stderr += chunk.toString("utf8");
    });
    const timer = setTimeout(() => child.kill("SIGKILL"), options.timeoutMs ?? 60_000);
    child.once("error", reject);
    child.once("close", (code) => {
      clearTimeout(timer);
      live.delete(child);
      resolveRun({ code, stdout, stderr });
    });
    child.stdin.on("error", () => {});
    child.stdin.end(options.input ?? "");
  });
}

/** Runs the `casq` CLI (`node CASQ_BIN ARGS`) to completion. */
export function casq(args: readonly string[], options: RunOptions = {}): Promise<RunResult> {
  return run(process.execPath, [CASQ_BIN, ...args], options);
}

/** A long-running `casq` process (e.g. `casq work`). */
export interface CasqProcess {
  /** The child process. */
  readonly child: ChildProcess;
  /** stdout so far. */
  stdout(): string;
  /** stderr so far. */
  stderr(): string;
  /** Resolves when it has exited. */
  readonly exited: Promise<ProcessExit>;
}

/** Starts the `casq` CLI without waiting for it. */
export function spawnCasq(args: readonly string[]): CasqProcess {
  return spawnProgram(process.execPath, [CASQ_BIN, ...args]);
}

/** Starts a program (from the repository root) without waiting for it; killed when the test process exits. */
export function spawnProgram(program: string, args: readonly string[]): CasqProcess {
  const child = spawn(program, args, {
    cwd: ROOT,
    stdio: ["ignore", "pipe", "pipe"],
    env: childEnv(),
  });
  live.add(child);
  let stdout = "";
  let stderr = "";
  child.stdout?.on("data", (chunk: Buffer) => {
    stdout += chunk.toString("utf8");
  });
  child.stderr?.on("data", (chunk: Buffer) => {
    stderr += chunk.toString("utf8");
  });
  const exited = new Promise<ProcessExit>((resolveExit) => {
    child.once("exit", (code, signal) => {
      live.delete(child);
      resolveExit({ code, signal });
    });
  });
  return { child, stdout: () => stdout, stderr: () => stderr, exited };
}

/**
 * The grpcurl binary; throws with the install command when it is missing (the
 * grpcurl suite fails rather than skips).
 */
export function grpcurlBinary(): string {
  const binary = process.env.CASQ_GRPCURL_BIN ?? GRPCURL_BIN;
  if (!existsSync(binary)) {
    throw new Error(`grpcurl is not installed at ${binary}; install it with: ${GRPCURL_SETUP_COMMAND}`);
  }
  return binary;
}

/** Polls `check` every `intervalMs` until it returns true (or throws after `timeoutMs`). */
export async function waitFor(
  what: string,
  check: () => Promise<boolean> | boolean,
  timeoutMs = 30_000,
  intervalMs = 200,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}
