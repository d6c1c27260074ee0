/**
 * First-run errors of a real `casq serve` process are loud and say what to
 * fix: a store that cannot work as configured (a missing bucket, an unknown
 * access key, a wrong secret, no credentials at all, a store directory that
 * cannot be created) ends the start with exit 1 and the cause, at once and
 * before anything listens; a store that breaks while the broker runs turns
 * health NOT_SERVING with the cause in the `casq-health-detail` header, and
 * clients get FAILED_PRECONDITION instead of "retry". A store that is only
 * down (nothing listens on its port) is not fatal. An S3 start prints no AWS
 * SDK Node version banner.
 *
 * Wrong credentials need VersityGW: the gofakes3 fake does not check
 * signatures.
 */
import { DeleteBucketCommand } from "@aws-sdk/client-s3";
import {
  Health,
  HealthCheckResponse_ServingStatus as ServingStatus,
} from "@casq/api/grpc/health/v1/health_pb.ts";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, describe, expect, it } from "vitest";
import { openS3Endpoint, S3_SERVER_KINDS, type S3Endpoint } from "../support/s3-endpoints.ts";
import { S3_TEST_REGION, testS3Client } from "../support/s3-server.ts";
import {
  type CasqServerProcess,
  casq,
  closedPort,
  startServer,
  tempDir,
  waitFor,
} from "./support/processes.ts";

const endpoints: S3Endpoint[] = [];
const servers: CasqServerProcess[] = [];

afterAll(async () => {
  await Promise.all(servers.map((s) => s.stop("SIGKILL")));
  await Promise.all(endpoints.map((e) => e.close()));
});

async function endpoint(kind: (typeof S3_SERVER_KINDS)[number]): Promise<S3Endpoint> {
  const s3 = await openS3Endpoint(kind);
  endpoints.push(s3);
  return s3;
}

/** A store URL for `bucket` on the endpoint (which may not exist). */
function urlFor(s3: S3Endpoint, bucket: string): string {
  return `s3://${bucket}/casq?endpoint=${encodeURIComponent(s3.endpoint)}&region=${S3_TEST_REGION}&path_style=true`;
}

/** Runs `casq serve` to its end (it must end by itself: a start that listens is killed after 40 s). */
function serveUntilExit(store: string, env: Readonly<Record<string, string>> = {}) {
  return casq(["serve", "--store", store, "--listen", "127.0.0.1:0"], { env, timeoutMs: 40_000 });
}

/** An environment in which the AWS SDK's credential chain finds nothing, fast. */
const NO_CREDENTIALS = {
  AWS_ACCESS_KEY_ID: "",
  AWS_SECRET_ACCESS_KEY: "",
  AWS_SESSION_TOKEN: "",
  AWS_PROFILE: "",
  AWS_CONFIG_FILE: "/nonexistent/casq-test-aws-config",
  AWS_SHARED_CREDENTIALS_FILE: "/nonexistent/casq-test-aws-credentials",
  AWS_WEB_IDENTITY_TOKEN_FILE: "",
  AWS_CONTAINER_CREDENTIALS_FULL_URI: "",
  AWS_CONTAINER_CREDENTIALS_RELATIVE_URI: "",
  AWS_EC2_METADATA_DISABLED: "true",
  AWS_REGION: S3_TEST_REGION,
};

/** Asserts a start refused for a misconfigured store: exit 1, the cause on stderr, never "listening". */
function expectRefusedStart(
  result: Awaited<ReturnType<typeof serveUntilExit>>,
  cause: string | RegExp,
): void {
  expect(result.code, result.stderr).toBe(1);
  expect(result.stdout).not.toContain("listening on");
  const message = result.stderr.split("\n").find((line) => line.startsWith("casq: ")) ?? "";
  expect(message).toMatch(/^casq: --store \S+: the object store cannot be used as configured: /);
  expect(message).toMatch(cause);
  expect(result.stderr).toContain('"level":50'); // logged at error level too
  expect(result.stderr).not.toMatch(/retry/i);
}

describe.each(S3_SERVER_KINDS)("casq serve on a misconfigured S3 store (%s)", (kind) => {
  it("exits 1 at once for a bucket that does not exist, saying to create it", async () => {
    const s3 = await endpoint(kind);
    const result = await serveUntilExit(urlFor(s3, `${s3.bucket}-missing`), s3.env);
    expectRefusedStart(result, /the bucket does not exist: create it or fix the store URL/);
  });

  it("exits 1 when no credentials can be found, saying where they come from", async () => {
    const s3 = await endpoint(kind);
    const result = await serveUntilExit(s3.storeUrl(), NO_CREDENTIALS);
    expectRefusedStart(result, /no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY/);
  });

  it("starts without the AWS SDK's Node version banner", async () => {
    const s3 = await endpoint(kind);
    const server = await startServer({ store: s3.storeUrl(), env: s3.env });
    servers.push(server);
    const health = createClient(Health, createGrpcTransport({ baseUrl: `http://${server.address}` }));
    expect((await health.check({})).status).toBe(ServingStatus.SERVING);
    expect(await server.stop("SIGTERM")).toEqual({ code: 0, signal: null });
    expect(server.output()).not.toMatch(/NodeVersionSupportWarning|AWS SDK for JavaScript/);
    expect(server.output()).not.toContain("Warning");
  });
});

describe("casq serve with wrong S3 credentials (versitygw checks signatures)", () => {
  it("exits 1 for an access key the server does not know", async () => {
    const s3 = await endpoint("versitygw");
    const result = await serveUntilExit(s3.storeUrl(), { ...s3.env, AWS_ACCESS_KEY_ID: "casq-no-such-key" });
    expectRefusedStart(result, /the access key id is not known to the server: check the credentials/);
  });

  it("exits 1 for a wrong secret key", async () => {
    const s3 = await endpoint("versitygw");
    const result = await serveUntilExit(s3.storeUrl(), { ...s3.env, AWS_SECRET_ACCESS_KEY: "wrong-secret" });
    expectRefusedStart(result, /the request signature does not match: check the secret key and region/);
  });
});

describe("casq serve when the store breaks or is down", () => {
  it("a bucket deleted while serving: NOT_SERVING with the cause in the health detail, clients told not to retry", async () => {
    const s3 = await endpoint("gofakes3");
    const server = await startServer({ store: s3.storeUrl(), env: s3.env });
    servers.push(server);
    const client = testS3Client(s3.endpoint);
    try {
      await client.send(new DeleteBucketCommand({ Bucket: s3.bucket }));
    } finally {
      client.destroy();
    }
    const health = createClient(Health, createGrpcTransport({ baseUrl: `http://${server.address}` }));
    let detail: string | null = null;
    await waitFor("health to turn NOT_SERVING", async () => {
      let headers: Headers | undefined;
      const answer = await health.check({}, { onHeader: (h) => (headers = h) });
      detail = headers?.get("casq-health-detail") ?? null;
      return answer.status === ServingStatus.NOT_SERVING;
    });
    expect(detail).toMatch(/^store misconfigured: .*the bucket does not exist/);

    const enqueue = await casq(["enqueue", "jobs", "x", "--server", server.address]);
    expect(enqueue.code).not.toBe(0);
    expect(enqueue.stderr).toContain("FAILED_PRECONDITION");
    expect(enqueue.stderr).toContain("the bucket does not exist: create it or fix the store URL");
    expect(enqueue.stderr).not.toMatch(/retry in a moment|; retry\b/i);
    expect(server.output()).toMatch(/"level":50.*object store misconfigured/);
  });

  it("a store that does not answer at start is not fatal: it listens, NOT_SERVING, and says why", async () => {
    const port = await closedPort();
    const store = `s3://casq-down/casq?endpoint=http://127.0.0.1:${port}&region=${S3_TEST_REGION}`;
    const server = await startServer({
      store,
      env: { AWS_ACCESS_KEY_ID: "k", AWS_SECRET_ACCESS_KEY: "s", AWS_REGION: S3_TEST_REGION },
    });
    servers.push(server);
    const health = createClient(Health, createGrpcTransport({ baseUrl: `http://${server.address}` }));
    let headers: Headers | undefined;
    const answer = await health.check({}, { onHeader: (h) => (headers = h) });
    expect(answer.status).toBe(ServingStatus.NOT_SERVING);
    expect(headers?.get("casq-health-detail")).toMatch(/^store unreachable: .*ECONNREFUSED/);
    expect(server.output()).toMatch(/"level":40.*object store not answering at startup/);
  });
});

describe("casq serve on a file: directory it cannot create", () => {
  it("exits 1 at once with the cause (it used to hang with no output)", async () => {
    const result = await serveUntilExit("file:/proc/casq-nope");
    expectRefusedStart(result, /cannot create or write the store directory \/proc\/casq-nope \(ENOENT\)/);
  });

  it("exits 1 when a file is where the directory must be", async () => {
    const dir = tempDir("store-startup");
    try {
      const { writeFileSync } = await import("node:fs");
      writeFileSync(`${dir.path}/plain-file`, "x");
      const result = await serveUntilExit(`file:${dir.path}/plain-file/data`);
      expectRefusedStart(result, /a file is in the way where a directory must be/);
    } finally {
      dir.remove();
    }
  });
});
