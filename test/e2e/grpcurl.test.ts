/**
 * An operator's view: grpcurl (a standard gRPC tool that knows nothing about
 * casq) against a real `casq serve` process, through server reflection only
 * (no .proto files given): list and describe the services, an Enqueue / Claim
 * / Ack round trip with JSON bodies, and the health check.
 *
 * grpcurl must be installed (`bash scripts/setup-grpcurl.sh`); when it is
 * missing this suite fails with that command, it never skips.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  type CasqServerProcess,
  grpcurlBinary,
  type RunResult,
  run,
  startServer,
  tempDir,
} from "./support/processes.ts";

let grpcurl: string;
let server: CasqServerProcess;
let store: { path: string; remove: () => void };

async function call(args: readonly string[]): Promise<RunResult> {
  return run(grpcurl, ["-plaintext", ...args], { timeoutMs: 30_000 });
}

/** Runs `grpcurl -plaintext -d BODY ADDRESS METHOD` and parses the JSON answer. */
async function invoke(method: string, body: unknown): Promise<Record<string, unknown>> {
  const result = await call(["-d", JSON.stringify(body), server.address, method]);
  if (result.code !== 0)
    throw new Error(`grpcurl ${method} failed (${result.code}): ${result.stderr}${result.stdout}`);
  return JSON.parse(result.stdout) as Record<string, unknown>;
}

beforeAll(async () => {
  grpcurl = grpcurlBinary();
  store = tempDir("grpcurl");
  server = await startServer({ store: `file:${store.path}` });
});

afterAll(async () => {
  await server?.stop();
  store?.remove();
});

describe("grpcurl against casq serve", () => {
  it("lists the casq services, health and reflection", async () => {
    const result = await call([server.address, "list"]);
    expect(result.code, result.stderr).toBe(0);
    const services = result.stdout.trim().split("\n");
    expect(services).toContain("casq.v1.QueueService");
    expect(services).toContain("casq.v1.AdminService");
    expect(services).toContain("grpc.health.v1.Health");
    expect(services.some((s) => /^grpc\.reflection\.v1(alpha)?\.ServerReflection$/.test(s))).toBe(true);
  });

  it("describes QueueService, including the bidirectional Work stream", async () => {
    const result = await call([server.address, "describe", "casq.v1.QueueService"]);
    expect(result.code, result.stderr).toBe(0);
    expect(result.stdout).toContain("casq.v1.QueueService is a service");
    expect(result.stdout).toMatch(
      /rpc Enqueue \( \.casq\.v1\.EnqueueRequest \) returns \( \.casq\.v1\.EnqueueResponse \)/,
    );
    expect(result.stdout).toMatch(
      /rpc Work \( stream \.casq\.v1\.WorkRequest \) returns \( stream \.casq\.v1\.WorkResponse \)/,
    );
    const message = await call([server.address, "describe", "casq.v1.NewMessage"]);
    expect(message.code, message.stderr).toBe(0);
    expect(message.stdout).toContain("bytes payload = 1;");
  });

  it("round-trips Enqueue, Claim and Ack with JSON bodies", async () => {
    await invoke("casq.v1.AdminService/CreateQueue", { queue: "grpcurl-jobs" });
    const payload = Buffer.from("hello from grpcurl").toString("base64");
    const enqueued = await invoke("casq.v1.QueueService/Enqueue", {
      queue: "grpcurl-jobs",
      messages: [{ payload, key: "k1", headers: { "content-type": "text/plain" } }],
    });
    const stored = (enqueued.messages as { id: string }[])[0];
    expect(stored?.id).toMatch(/^[0-9A-HJKMNP-TV-Z]{26}$/);

    const claimed = await invoke("casq.v1.QueueService/Claim", {
      queue: "grpcurl-jobs",
      workerId: "grpcurl",
      maxMessages: 1,
    });
    const job = (
      claimed.messages as { receipt: string; attempt: number; message: { id: string; payload: string } }[]
    )[0];
    expect(job?.message.id).toBe(stored?.id);
    expect(job?.message.payload).toBe(payload);
    expect(job?.attempt).toBe(1);

    const acked = await invoke("casq.v1.QueueService/Ack", {
      queue: "grpcurl-jobs",
      receipts: [job?.receipt],
    });
    expect(acked.results).toEqual([{ receipt: job?.receipt, outcome: "ACK_OUTCOME_ACKED" }]);

    const again = await invoke("casq.v1.QueueService/Claim", { queue: "grpcurl-jobs", workerId: "grpcurl" });
    expect(again.messages ?? []).toEqual([]);
  });

  it("answers errors with gRPC status codes grpcurl shows", async () => {
    const result = await call([
      "-d",
      '{"queue":"no-such-queue"}',
      server.address,
      "casq.v1.AdminService/GetQueue",
    ]);
    expect(result.code).not.toBe(0);
    expect(result.stderr).toContain("NotFound");
  });

  it("reports SERVING on the standard health check", async () => {
    const health = await invoke("grpc.health.v1.Health/Check", {});
    expect(health).toEqual({ status: "SERVING" });
  });
});
