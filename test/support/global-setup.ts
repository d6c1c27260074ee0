/**
 * vitest globalSetup: starts ONE S3-compatible server for the whole test run
 * and hands its endpoint to the tests (`inject("s3Endpoint")`,
 * `inject("s3Bucket")`).
 *
 * - `CASQ_TEST_S3_ENDPOINT=http://HOST:PORT` set: that server is used (its
 *   bucket `CASQ_TEST_S3_BUCKET`, default `casq-test`, is created if missing).
 * - otherwise the server built by `bash scripts/setup-s3.sh` is started on a
 *   free loopback port and stopped after the run. When it is not installed,
 *   the run fails here with the install command: the S3 suites never skip
 *   silently.
 */
import type { TestProject } from "vitest/node";
import { ensureBucket, type RunningS3Server, S3_TEST_BUCKET, startS3Server } from "./s3-server.ts";

declare module "vitest" {
  export interface ProvidedContext {
    /** Endpoint of the S3-compatible server for this run, e.g. `http://127.0.0.1:39123`. */
    s3Endpoint: string;
    /** Bucket on that server the tests may use (each test under its own unique prefix). */
    s3Bucket: string;
  }
}

/** Starts (or adopts) the S3 test server and provides its endpoint; returns the teardown. */
export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const external = process.env.CASQ_TEST_S3_ENDPOINT;
  let server: RunningS3Server | undefined;
  let endpoint: string;
  let bucket: string;
  if (external) {
    bucket = process.env.CASQ_TEST_S3_BUCKET ?? S3_TEST_BUCKET;
    await ensureBucket(external, bucket);
    endpoint = external;
  } else {
    server = await startS3Server();
    endpoint = server.endpoint;
    bucket = server.bucket;
  }
  project.provide("s3Endpoint", endpoint);
  project.provide("s3Bucket", bucket);
  return async () => {
    await server?.stop();
  };
}
