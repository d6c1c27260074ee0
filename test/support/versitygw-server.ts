/**
 * Starts and stops VersityGW, the production S3 gateway (Apache-2.0) the
 * tests run against besides the gofakes3-based fake (`s3-server.ts`).
 *
 * `bash scripts/setup-versitygw.sh` installs it into `.tools/bin`. It runs
 * with its posix backend over a fresh temporary directory (removed on stop):
 * `versitygw --access K --secret S --port 127.0.0.1:PORT --keep-alive posix DIR`, each
 * bucket a directory and each object a file, with its metadata (etag) in
 * extended attributes.
 *
 * VersityGW cannot report a port it picked itself, so a free loopback port is
 * chosen here and the start is retried on another one if it was taken in
 * between. It runs under a small shell watchdog whose stdin is a pipe from
 * this process: when this process dies, even by SIGKILL, the pipe closes and
 * the watchdog stops the gateway, so no server is left running.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { ensureBucket, type RunningS3Server, S3_TEST_BUCKET, S3_TEST_CREDENTIALS } from "./s3-server.ts";

/** The repository root. */
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** The command that installs VersityGW. */
export const VERSITYGW_SETUP_COMMAND = "bash scripts/setup-versitygw.sh";

/** Where `scripts/setup-versitygw.sh` puts the binary (override with `CASQ_VERSITYGW_BIN`). */
export function versitygwBinary(): string {
  return process.env.CASQ_VERSITYGW_BIN ?? join(ROOT, ".tools", "bin", "versitygw");
}

/** Options of {@link startVersitygw}. */
export interface StartVersitygwOptions {
  /** Bucket to create (default {@link S3_TEST_BUCKET}). */
  readonly bucket?: string;
  /** How long to wait for the gateway to answer (default 15 s). */
  readonly readyTimeoutMs?: number;
}

/**
 * Runs the binary given as `$0` with the remaining arguments, and stops it
 * (SIGTERM) when stdin reaches EOF or the watchdog itself is terminated.
 */
const WATCHDOG = `
"$0" "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null; wait "$child"; exit 0' TERM INT
while read -r _; do :; done
kill -TERM "$child" 2>/dev/null
wait "$child"
`;

/**
 * Starts VersityGW on a free loopback port over a fresh directory, waits until
 * it serves the bucket, and returns how to reach and stop it. Throws an error
 * naming the install command when the binary is missing.
 */
export async function startVersitygw(options: StartVersitygwOptions = {}): Promise<RunningS3Server> {
  const binary = versitygwBinary();
  const bucket = options.bucket ?? S3_TEST_BUCKET;
  if (!existsSync(binary)) {
    throw new Error(
      `VersityGW is not installed (${binary} is missing). Install it with:\n\n    ${VERSITYGW_SETUP_COMMAND}\n\n(a cold build takes a few minutes; later runs reuse it).`,
    );
  }
  let lastError: unknown;
  for (let tries = 0; tries < 3; tries++) {
    const dir = await mkdtemp(join(tmpdir(), "casq-versitygw-"));
    const port = await freePort();
    const child = spawn(
      "bash",
      [
        "-c",
        WATCHDOG,
        binary,
        "--access",
        S3_TEST_CREDENTIALS.accessKeyId,
        "--secret",
        S3_TEST_CREDENTIALS.secretAccessKey,
        "--port",
        `127.0.0.1:${port}`,
        "--quiet",
        // Without it VersityGW answers every request with `Connection: close`.
        "--keep-alive",
        "posix",
        dir,
      ],
      { stdio: ["pipe", "pipe", "pipe"] },
    );
    let output = "";
    const keep = (chunk: Buffer) => {
      output = (output + chunk.toString("utf8")).slice(-4000);
    };
    child.stdout?.on("data", keep);
    child.stderr?.on("data", keep);
    const stop = async (): Promise<void> => {
      await stopChild(child);
      await rm(dir, { recursive: true, force: true });
    };
    const endpoint = `http://127.0.0.1:${port}`;
    try {
      await waitUntilServing(endpoint, bucket, child, options.readyTimeoutMs ?? 15_000, () => output);
      return { endpoint, bucket, pid: child.pid, stop };
    } catch (error) {
      lastError = error;
      await stop();
      // Another process took the port between the probe and the bind: try another one.
      if (!/address already in use/i.test(output)) break;
    }
  }
  throw lastError;
}

/** Polls until the gateway creates and serves `bucket`; fails when it exits or time runs out. */
async function waitUntilServing(
  endpoint: string,
  bucket: string,
  child: ChildProcess,
  timeoutMs: number,
  output: () => string,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null)
      throw new Error(`VersityGW exited (code ${child.exitCode}) before serving; output:\n${output()}`);
    try {
      await ensureBucket(endpoint, bucket);
      return;
    } catch (error) {
      if (Date.now() > deadline)
        throw new Error(`VersityGW did not serve ${endpoint} within ${timeoutMs} ms; output:\n${output()}`, {
          cause: error,
        });
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** A loopback port that was free a moment ago. */
function freePort(): Promise<number> {
  return new Promise((resolvePromise, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address ? address.port : 0;
      server.close(() => resolvePromise(port));
    });
  });
}

/** Ends the watchdog's stdin and terminates it (which stops the gateway), then SIGKILL after 5 s. */
async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolvePromise) => child.once("exit", () => resolvePromise()));
  child.stdin?.end();
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 5_000);
  await exited;
  clearTimeout(timer);
}
