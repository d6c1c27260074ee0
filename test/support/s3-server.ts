/**
 * Starts and stops the real S3-compatible server the tests run against.
 *
 * The server is `casq-s3-fake` (source in `test/support/s3-fake/`, built into
 * `.tools/bin` by `bash scripts/setup-s3.sh`): gofakes3 v1.2.0 with its
 * in-memory backend, whose conditional PutObject (`If-Match` /
 * `If-None-Match: *`) is atomic, behind a small shim that adds AWS's
 * `If-Match` on DeleteObject and AWS's 404 for `If-Match` on a missing key.
 *
 * The server listens on a free loopback port it picks itself (`127.0.0.1:0`)
 * and prints it, so there is no port race. It is started with
 * `-exit-on-stdin-eof` and its stdin is a pipe from this process, so even a
 * test runner killed with SIGKILL does not leave it running; a normal exit
 * also kills it.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { CreateBucketCommand, HeadBucketCommand, S3Client } from "@aws-sdk/client-s3";

/** The repository root. */
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** Bucket the test server creates and the S3 tests use. */
export const S3_TEST_BUCKET = "casq-test";

/** Region the tests sign requests for. */
export const S3_TEST_REGION = "us-east-1";

/**
 * Credentials for the test server (it does not check signatures, but the SDK
 * must sign with something, and passing them explicitly keeps the SDK from
 * probing the instance-metadata endpoint).
 */
export const S3_TEST_CREDENTIALS = Object.freeze({
  accessKeyId: "casq-test-access-key",
  secretAccessKey: "casq-test-secret-key",
});

/** The command that installs the test server. */
export const S3_SETUP_COMMAND = "bash scripts/setup-s3.sh";

/** Where `scripts/setup-s3.sh` puts the server binary (override with `CASQ_S3_FAKE_BIN`). */
export function s3ServerBinary(): string {
  return process.env.CASQ_S3_FAKE_BIN ?? join(ROOT, ".tools", "bin", "casq-s3-fake");
}

/** A running test server. */
export interface RunningS3Server {
  /** `http://127.0.0.1:PORT`. */
  readonly endpoint: string;
  /** The bucket that was created. */
  readonly bucket: string;
  /** The child process id. */
  readonly pid: number | undefined;
  /** Stops the server (SIGTERM, then SIGKILL after 5 s) and waits for it to exit. */
  stop(): Promise<void>;
}

/** Options of {@link startS3Server}. */
export interface StartS3ServerOptions {
  /** Bucket to create (default {@link S3_TEST_BUCKET}). */
  readonly bucket?: string;
  /** Server binary (default {@link s3ServerBinary}). */
  readonly binary?: string;
  /** How long to wait for the server to listen (default 15 s). */
  readonly readyTimeoutMs?: number;
}

/**
 * Starts the S3-compatible test server on a free loopback port, waits until
 * it answers for the bucket, and returns how to reach and stop it. Throws an
 * error naming the install command when the binary is missing.
 */
export async function startS3Server(options: StartS3ServerOptions = {}): Promise<RunningS3Server> {
  const binary = options.binary ?? s3ServerBinary();
  const bucket = options.bucket ?? S3_TEST_BUCKET;
  if (!existsSync(binary)) {
    throw new Error(
      `The S3-compatible test server is not installed (${binary} is missing). Install it with:\n\n    ${S3_SETUP_COMMAND}\n\n` +
        "or point the tests at a running server with CASQ_TEST_S3_ENDPOINT=http://HOST:PORT.",
    );
  }
  const child = spawn(binary, ["-addr", "127.0.0.1:0", "-bucket", bucket, "-exit-on-stdin-eof"], {
    stdio: ["pipe", "pipe", "pipe"],
  });
  const killOnExit = () => child.kill("SIGKILL");
  process.once("exit", killOnExit);

  let stderr = "";
  child.stderr?.setEncoding("utf8");
  child.stderr?.on("data", (chunk: string) => {
    stderr = (stderr + chunk).slice(-4000);
  });

  const stop = async (): Promise<void> => {
    process.removeListener("exit", killOnExit);
    await stopChild(child);
  };

  try {
    const endpoint = await waitForListening(child, options.readyTimeoutMs ?? 15_000, () => stderr);
    await ensureBucket(endpoint, bucket);
    return { endpoint, bucket, pid: child.pid, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

/** Reads the server's stdout until it prints `listening on http://HOST:PORT`. */
function waitForListening(child: ChildProcess, timeoutMs: number, stderr: () => string): Promise<string> {
  return new Promise((resolvePromise, reject) => {
    const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
    const timer = setTimeout(() => {
      finish(new Error(`the S3 test server did not start within ${timeoutMs} ms; stderr:\n${stderr()}`));
    }, timeoutMs);
    const onExit = (code: number | null, signal: NodeJS.Signals | null) => {
      finish(
        new Error(
          `the S3 test server exited (code ${code}, signal ${signal}) before listening; stderr:\n${stderr()}`,
        ),
      );
    };
    const onError = (error: Error) =>
      finish(new Error(`could not start the S3 test server: ${error.message}`));
    function finish(error: Error | undefined, endpoint?: string): void {
      clearTimeout(timer);
      child.removeListener("exit", onExit);
      child.removeListener("error", onError);
      lines.removeAllListeners("line");
      if (error) reject(error);
      else resolvePromise(endpoint ?? "");
    }
    child.once("exit", onExit);
    child.once("error", onError);
    lines.on("line", (line) => {
      const match = /listening on (http:\/\/\S+)/.exec(line);
      if (match?.[1]) finish(undefined, match[1]);
    });
  });
}

/** Terminates the child and waits for it: SIGTERM (and stdin EOF), then SIGKILL after 5 s. */
async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolvePromise) => child.once("exit", () => resolvePromise()));
  child.stdin?.end();
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 5_000);
  await exited;
  clearTimeout(timer);
}

/** An SDK client for the test server (path-style, test credentials, no retries). */
export function testS3Client(endpoint: string): S3Client {
  return new S3Client({
    endpoint,
    region: S3_TEST_REGION,
    forcePathStyle: true,
    credentials: { ...S3_TEST_CREDENTIALS },
    maxAttempts: 1,
    requestChecksumCalculation: "WHEN_REQUIRED",
    responseChecksumValidation: "WHEN_REQUIRED",
  });
}

/**
 * Creates `bucket` on the server at `endpoint` unless it exists, and checks
 * that the server answers for it. Used for the server started here and for an
 * external one given by `CASQ_TEST_S3_ENDPOINT`.
 */
export async function ensureBucket(endpoint: string, bucket: string): Promise<void> {
  const client = testS3Client(endpoint);
  try {
    try {
      await client.send(new CreateBucketCommand({ Bucket: bucket }));
    } catch (error) {
      const name = (error as { name?: string }).name;
      if (name !== "BucketAlreadyOwnedByYou" && name !== "BucketAlreadyExists") throw error;
    }
    await client.send(new HeadBucketCommand({ Bucket: bucket }));
  } catch (error) {
    throw new Error(`the S3 server at ${endpoint} does not serve bucket ${bucket}: ${String(error)}`, {
      cause: error,
    });
  } finally {
    client.destroy();
  }
}
