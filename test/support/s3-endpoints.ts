/**
 * The S3-compatible servers the tests run against, by kind, and a helper that
 * gives a test (or a script such as the chaos suite) a running endpoint with
 * a bucket of its own.
 *
 * - `gofakes3`: the in-memory fake (`s3-server.ts`, `scripts/setup-s3.sh`).
 * - `versitygw`: VersityGW, a production S3 gateway, over its posix backend
 *   (`versitygw-server.ts`, `scripts/setup-versitygw.sh`).
 *
 * Inside a vitest run both are started once by `global-setup.ts`
 * (`inject("s3Servers")`); {@link openS3Endpoint} reuses them there and starts
 * a server of its own anywhere else.
 */
import { randomUUID } from "node:crypto";
import {
  ensureBucket,
  type RunningS3Server,
  S3_TEST_CREDENTIALS,
  S3_TEST_REGION,
  startS3Server,
} from "./s3-server.ts";
import { startVersitygw } from "./versitygw-server.ts";

/** The kinds of S3 server the tests run against. */
export type S3ServerKind = "gofakes3" | "versitygw";

/** Every kind, in the order suites iterate them. */
export const S3_SERVER_KINDS: readonly S3ServerKind[] = ["gofakes3", "versitygw"];

/** Where one server of the run listens and the bucket made for the run. */
export interface S3ServerAddress {
  readonly endpoint: string;
  readonly bucket: string;
}

/** Starts a server of `kind` on a free loopback port with `bucket` (default `casq-test`). */
export function startS3ServerOfKind(kind: S3ServerKind, bucket?: string): Promise<RunningS3Server> {
  const options = bucket === undefined ? {} : { bucket };
  return kind === "gofakes3" ? startS3Server(options) : startVersitygw(options);
}

/** A running S3 endpoint with a fresh bucket, as {@link openS3Endpoint} returns it. */
export interface S3Endpoint {
  readonly kind: S3ServerKind;
  /** `http://127.0.0.1:PORT`. */
  readonly endpoint: string;
  /** A bucket created for this caller alone. */
  readonly bucket: string;
  /** A `casq serve --store` URL for this bucket under `prefix` (default `casq`). */
  storeUrl(prefix?: string): string;
  /** The environment a `casq serve` process needs to sign requests to this server (AWS credentials and region). */
  readonly env: Readonly<Record<string, string>>;
  /** Stops the server if this call started it (the run's shared servers stay up). */
  close(): Promise<void>;
}

/**
 * A running S3 server of `kind` and a fresh bucket on it. Inside vitest it is
 * the run's server (started by `global-setup.ts`); elsewhere a server is
 * started now and {@link S3Endpoint.close} stops it.
 */
export async function openS3Endpoint(kind: S3ServerKind): Promise<S3Endpoint> {
  const bucket = `casq-${randomUUID().slice(0, 13)}`;
  const shared = await runServers();
  let endpoint: string;
  let close = async (): Promise<void> => {};
  const address = shared?.[kind];
  if (address) {
    endpoint = address.endpoint;
    await ensureBucket(endpoint, bucket);
  } else {
    const server = await startS3ServerOfKind(kind, bucket);
    endpoint = server.endpoint;
    close = () => server.stop();
  }
  return {
    kind,
    endpoint,
    bucket,
    storeUrl: (prefix = "casq") =>
      `s3://${bucket}/${prefix}?endpoint=${encodeURIComponent(endpoint)}&region=${S3_TEST_REGION}&path_style=true`,
    env: {
      AWS_ACCESS_KEY_ID: S3_TEST_CREDENTIALS.accessKeyId,
      AWS_SECRET_ACCESS_KEY: S3_TEST_CREDENTIALS.secretAccessKey,
      AWS_REGION: S3_TEST_REGION,
    },
    close,
  };
}

/** The run's servers when called inside vitest, else undefined. */
async function runServers(): Promise<Readonly<Record<S3ServerKind, S3ServerAddress>> | undefined> {
  if (process.env.VITEST === undefined) return undefined;
  const { inject } = await import("vitest");
  return inject("s3Servers");
}
