/**
 * Shared pieces of the packaging tests: running a program to completion,
 * starting a `casq serve` from any command line (an installed bin, the
 * README's command) and waiting for it to listen, and temporary directories
 * outside the repository.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root. */
export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

const live = new Set<ChildProcess>();
process.on("exit", () => {
  for (const child of live) child.kill("SIGKILL");
});

/** A fresh directory under the system temp dir (outside the repository), removed by `remove`. */
export function outsideDir(prefix: string): { path: string; remove: () => void } {
  const path = mkdtempSync(join(tmpdir(), `casq-pkg-${prefix}-`));
  return { path, remove: () => rmSync(path, { recursive: true, force: true }) };
}

/** The environment for programs that must not see this test process's tooling (tsx loaders, CASQ_*). */
export function cleanEnv(extra: Readonly<Record<string, string>> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const name of Object.keys(env)) {
    if (name.startsWith("CASQ_") || name.startsWith("VITEST") || name === "NODE_OPTIONS") delete env[name];
  }
  return { ...env, ...extra };
}

/** How a finished program ended and what it printed. */
export interface Finished {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs a program (no shell) to completion; never rejects on a non-zero exit. */
export function runProgram(
  program: string,
  args: readonly string[],
  options: { cwd?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number } = {},
): Promise<Finished> {
  return new Promise((resolveRun, reject) => {
    const child = spawn(program, args, {
      cwd: options.cwd ?? ROOT,
      env: options.env ?? cleanEnv(),
      stdio: ["ignore", "pipe", "pipe"],
    });
    live.add(child);
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (c: Buffer) => {
      stdout += c.toString("utf8");
    });
    child.stderr.on("data", (c: Buffer) => {
      stderr += c.toString("utf8");
    });
    const timer = setTimeout(() => child.kill("SIGKILL"), options.timeoutMs ?? 240_000);
    child.once("error", reject);
    child.once("exit", (code) => {
      clearTimeout(timer);
      live.delete(child);
      resolveRun({ code, stdout, stderr });
    });
  });
}

/** Throws with the program's output unless it exited 0. */
export function expectOk(what: string, result: Finished): Finished {
  if (result.code !== 0) {
    throw new Error(`${what} exited ${result.code}\nstdout:\n${result.stdout}\nstderr:\n${result.stderr}`);
  }
  return result;
}

/** A started broker. */
export interface StartedBroker {
  /** `HOST:PORT` it printed ("listening on ..."). */
  readonly address: string;
  /** The process the test started (the one a supervisor would signal). */
  readonly child: ChildProcess;
  /** Everything it printed so far. */
  output(): string;
  /** Resolves with the exit code (or signal name) once the started process has exited. */
  readonly exited: Promise<number | string | null>;
}

/** Starts `argv` (no shell) and waits for the "listening on ADDRESS" line of `casq serve`. */
export async function startBroker(
  argv: readonly string[],
  options: { cwd?: string; env?: NodeJS.ProcessEnv; readyTimeoutMs?: number } = {},
): Promise<StartedBroker> {
  const [program, ...args] = argv;
  if (program === undefined) throw new Error("empty command line");
  const child = spawn(program, args, {
    cwd: options.cwd ?? ROOT,
    env: options.env ?? cleanEnv(),
    stdio: ["ignore", "pipe", "pipe"],
  });
  live.add(child);
  let output = "";
  const exited = new Promise<number | string | null>((resolveExit) => {
    child.once("exit", (code, signal) => {
      live.delete(child);
      resolveExit(code ?? signal);
    });
  });
  const address = await new Promise<string>((resolveAddress, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`${argv.join(" ")} did not print "listening on" in time; output:\n${output}`));
    }, options.readyTimeoutMs ?? 60_000);
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
    void exited.then((how) => {
      clearTimeout(timer);
      reject(new Error(`${argv.join(" ")} exited (${how}) before listening; output:\n${output}`));
    });
  });
  return { address, child, output: () => output, exited };
}

/** Resolves `what` within `timeoutMs`, else rejects naming it. */
export async function within<T>(what: string, promise: Promise<T>, timeoutMs: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)),
      timeoutMs,
    );
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
