/**
 * Runs one job as a child process for `casq work`: the payload on stdin, the
 * job's metadata in environment variables, stdout passed through, stderr
 * passed through and its tail kept (it becomes the nack reason shown with
 * dead letters). A timeout or a lost lease stops the child with SIGTERM, then
 * SIGKILL after a grace period.
 */
import { spawn } from "node:child_process";
import { accessSync, constants, statSync } from "node:fs";
import { delimiter, isAbsolute, join } from "node:path";

/** How a job process ended. */
export interface JobExit {
  /** Exit code, or null when it was killed by a signal or never started. */
  readonly code: number | null;
  /** Signal that killed it, if any. */
  readonly signal: NodeJS.Signals | null;
  /** Set when the process could not be started (e.g. ENOENT). */
  readonly spawnError?: Error;
  /** True when it was stopped because it ran longer than the job timeout. */
  readonly timedOut: boolean;
  /** The last bytes (at most 2 KiB) it wrote to stderr. */
  readonly stderrTail: string;
  /** Wall time in milliseconds. */
  readonly elapsedMs: number;
}

/** A running job process. */
export interface JobProcess {
  /** Resolves when the process has ended (never rejects). */
  readonly exited: Promise<JobExit>;
  /** Asks the process to stop (SIGTERM, then SIGKILL after `graceMs`). */
  stop(graceMs?: number): void;
}

/** What to run and how. */
export interface JobProcessOptions {
  /** Program and arguments. */
  readonly command: readonly string[];
  /** Bytes written to the child's stdin (then stdin is closed). */
  readonly stdin: Uint8Array;
  /** Environment variables added to the worker's own. */
  readonly env: Readonly<Record<string, string>>;
  /** Stop the child after this many milliseconds (undefined: no limit). */
  readonly timeoutMs?: number;
}

const TAIL_BYTES = 2048;
const KILL_GRACE_MS = 10_000;

/** Starts a job process. */
export function startJobProcess(options: JobProcessOptions): JobProcess {
  const started = Date.now();
  const [program, ...args] = options.command;
  let tail = Buffer.alloc(0);
  let timedOut = false;
  let killTimer: NodeJS.Timeout | undefined;
  let timeoutTimer: NodeJS.Timeout | undefined;

  const child = spawn(program ?? "", args, {
    stdio: ["pipe", "inherit", "pipe"],
    env: { ...process.env, ...options.env },
    // Its own process group: a Ctrl-C at the terminal (SIGINT to the foreground
    // group) reaches only `casq work`, which then lets running jobs finish.
    detached: true,
  });

  const stop = (graceMs = KILL_GRACE_MS) => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill("SIGTERM");
    if (killTimer === undefined) {
      killTimer = setTimeout(() => child.kill("SIGKILL"), graceMs);
      killTimer.unref();
    }
  };

  const exited = new Promise<JobExit>((resolve) => {
    let spawnError: Error | undefined;
    let done = false;
    const finish = (code: number | null, signal: NodeJS.Signals | null) => {
      if (done) return;
      done = true;
      if (killTimer !== undefined) clearTimeout(killTimer);
      if (timeoutTimer !== undefined) clearTimeout(timeoutTimer);
      resolve({
        code,
        signal,
        timedOut,
        stderrTail: tail.toString("utf8"),
        elapsedMs: Date.now() - started,
        ...(spawnError !== undefined && { spawnError }),
      });
    };
    child.on("error", (error) => {
      spawnError = error;
      // 'close' may never come when spawning failed.
      if (child.pid === undefined) finish(null, null);
    });
    child.on("close", (code, signal) => finish(code, signal));
  });

  child.stderr?.on("data", (chunk: Buffer) => {
    process.stderr.write(chunk);
    tail = Buffer.concat([tail, chunk]);
    if (tail.length > TAIL_BYTES) tail = tail.subarray(tail.length - TAIL_BYTES);
  });
  // A child that does not read its stdin must not crash the worker (EPIPE).
  child.stdin?.on("error", () => {});
  child.stdin?.end(options.stdin);

  if (options.timeoutMs !== undefined) {
    timeoutTimer = setTimeout(() => {
      timedOut = true;
      stop();
    }, options.timeoutMs);
    timeoutTimer.unref();
  }
  return { exited, stop };
}

/**
 * Finds `program` the way a shell would (a path as given, otherwise in PATH)
 * and returns undefined when it exists and is executable, or why not.
 */
export function commandProblem(program: string, env: NodeJS.ProcessEnv = process.env): string | undefined {
  const executable = (path: string): boolean => {
    try {
      if (!statSync(path).isFile()) return false;
      accessSync(path, constants.X_OK);
      return true;
    } catch {
      return false;
    }
  };
  if (program.includes("/")) {
    const path = isAbsolute(program) ? program : join(process.cwd(), program);
    return executable(path) ? undefined : `${program}: no such executable file`;
  }
  for (const dir of (env.PATH ?? "").split(delimiter)) {
    if (dir !== "" && executable(join(dir, program))) return undefined;
  }
  return `${program}: command not found in PATH`;
}
