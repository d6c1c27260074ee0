/**
 * Two `casq serve` processes on one file store: the broker that does not lead
 * a queue's shard answers UNAVAILABLE with the `casq-leader-address` trailer
 * (checked with a plain grpc-js client), and the CLI, pointed at that broker,
 * follows the redirect: `casq enqueue` once per call, `casq work` for its
 * stream.
 */
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type CasqServerProcess, casq, PROTO_DIR, startServer, tempDir } from "./support/processes.ts";

type Json = Record<string, unknown>;
type QueueClient = grpc.Client & {
  Enqueue(request: Json, callback: (error: grpc.ServiceError | null, response: Json) => void): void;
};

let store: { path: string; remove: () => void };
let leader: CasqServerProcess;
let follower: CasqServerProcess;

beforeAll(async () => {
  store = tempDir("redirect");
  [leader, follower] = await Promise.all([
    startServer({ store: `file:${store.path}` }),
    startServer({ store: `file:${store.path}` }),
  ]);
});

afterAll(async () => {
  await Promise.all([leader?.stop(), follower?.stop()]);
  store?.remove();
});

describe("leader redirects", () => {
  it("a follower redirects with the casq-leader-address trailer, and the CLI follows it", async () => {
    const created = await casq(["queue", "create", "routed", "--server", leader.address]);
    expect(created.code, created.stderr).toBe(0);
    const first = await casq(["enqueue", "routed", "via leader", "--server", leader.address]);
    expect(first.code, first.stderr).toBe(0);

    const definition = protoLoader.loadSync(["casq/v1/queue_service.proto"], {
      includeDirs: [PROTO_DIR],
      keepCase: true,
      longs: String,
      enums: String,
      defaults: true,
      oneofs: true,
    });
    const root = grpc.loadPackageDefinition(definition) as unknown as {
      casq: {
        v1: { QueueService: new (address: string, credentials: grpc.ChannelCredentials) => QueueClient };
      };
    };
    const raw = new root.casq.v1.QueueService(follower.address, grpc.credentials.createInsecure());
    const error = await new Promise<grpc.ServiceError>((resolve, reject) =>
      raw.Enqueue({ queue: "routed", messages: [{ payload: Buffer.from("x") }] }, (e) =>
        e ? resolve(e) : reject(new Error("the follower accepted a write for a shard it does not lead")),
      ),
    );
    raw.close();
    expect(error.code).toBe(grpc.status.UNAVAILABLE);
    // Spelled out as proto/casq/v1/errors.proto names it: a plain gRPC client sees this name.
    expect(error.metadata.get("casq-leader-address")).toEqual([leader.address]);

    const viaFollower = await casq(["enqueue", "routed", "via follower", "--server", follower.address]);
    expect(viaFollower.code, viaFollower.stderr).toBe(0);
    expect(viaFollower.stdout.trim()).toMatch(/^[0-9A-HJKMNP-TV-Z]{26}$/);

    const work = await casq(
      [
        "work",
        "routed",
        "--max-jobs",
        "2",
        "--server",
        follower.address,
        "--",
        "sh",
        "-c",
        "cat > /dev/null",
      ],
      { timeoutMs: 30_000 },
    );
    expect(work.code, work.stderr).toBe(0);
    expect(work.stderr).toContain(`redirects to the leader ${leader.address}`);
    expect(work.stderr).toContain("2 acked");
  });
});
