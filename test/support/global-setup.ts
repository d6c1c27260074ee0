/**
 * vitest globalSetup: starts ONE server of each S3 kind the tests run against
 * (see `s3-endpoints.ts`) for the whole test run and hands their endpoints to
 * the tests: `inject("s3Servers")` has both; `inject("s3Endpoint")` /
 * `inject("s3Bucket")` are the gofakes3 one, for suites that need just one.
 *
 * - gofakes3: `CASQ_TEST_S3_ENDPOINT=http://HOST:PORT` set: that server is
 *   used (its bucket `CASQ_TEST_S3_BUCKET`, default `casq-test`, is created if
 *   missing); otherwise the server built by `bash scripts/setup-s3.sh` is
 *   started on a free loopback port.
 * - versitygw: `CASQ_TEST_VERSITYGW_ENDPOINT` likewise (bucket
 *   `CASQ_TEST_VERSITYGW_BUCKET`); otherwise the gateway installed by
 *   `bash scripts/setup-versitygw.sh` is started over a temporary directory.
 *
 * Servers started here are stopped after the run. When one is not installed,
 * the run fails here with the install command: the S3 suites never skip
 * silently.
 */
import type { TestProject } from "vitest/node";
import { type S3ServerAddress, type S3ServerKind, startS3ServerOfKind } from "./s3-endpoints.ts";
import { ensureBucket, type RunningS3Server, S3_TEST_BUCKET } from "./s3-server.ts";

declare module "vitest" {
  export interface ProvidedContext {
    /** Endpoint of the gofakes3 server for this run, e.g. `http://127.0.0.1:39123`. */
    s3Endpoint: string;
    /** Bucket on that server the tests may use (each test under its own unique prefix). */
    s3Bucket: string;
    /** Every S3 server of this run by kind, each with a bucket the tests may use (under unique prefixes). */
    s3Servers: Record<S3ServerKind, S3ServerAddress>;
  }
}

/** Environment variables naming an external server of each kind. */
const EXTERNAL: Record<S3ServerKind, { endpoint: string; bucket: string }> = {
  gofakes3: { endpoint: "CASQ_TEST_S3_ENDPOINT", bucket: "CASQ_TEST_S3_BUCKET" },
  versitygw: { endpoint: "CASQ_TEST_VERSITYGW_ENDPOINT", bucket: "CASQ_TEST_VERSITYGW_BUCKET" },
};

/** Starts (or adopts) one server of `kind`. */
async function provideServer(
  kind: S3ServerKind,
): Promise<{ address: S3ServerAddress; server?: RunningS3Server }> {
  const external = process.env[EXTERNAL[kind].endpoint];
  if (external) {
    const bucket = process.env[EXTERNAL[kind].bucket] ?? S3_TEST_BUCKET;
    await ensureBucket(external, bucket);
    return { address: { endpoint: external, bucket } };
  }
  const server = await startS3ServerOfKind(kind);
  return { address: { endpoint: server.endpoint, bucket: server.bucket }, server };
}

/** Starts (or adopts) the S3 test servers and provides their endpoints; returns the teardown. */
export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const started = await Promise.allSettled([provideServer("gofakes3"), provideServer("versitygw")]);
  const stopAll = () =>
    Promise.all(started.map((s) => (s.status === "fulfilled" ? s.value.server?.stop() : undefined)));
  const [fake, gateway] = started;
  if (fake?.status !== "fulfilled" || gateway?.status !== "fulfilled") {
    await stopAll();
    const failure = [fake, gateway].find((s) => s?.status === "rejected") as PromiseRejectedResult;
    throw failure.reason;
  }
  project.provide("s3Endpoint", fake.value.address.endpoint);
  project.provide("s3Bucket", fake.value.address.bucket);
  project.provide("s3Servers", { gofakes3: fake.value.address, versitygw: gateway.value.address });
  return async () => {
    await stopAll();
  };
}
