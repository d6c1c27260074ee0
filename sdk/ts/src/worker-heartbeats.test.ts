/**
 * Heartbeats of jobs whose stream is gone go by unary call, one per shard: a
 * broker heartbeats the receipts of the shards it leads and redirects for the
 * rest, so one call over the shards of two leaders bounced between them and
 * extended no lease (the Go SDK had the same with acks, found by review).
 *
 * The brokers are stubs (real HTTP/2 gRPC servers, connectNodeAdapter): A
 * leads shard 0 and B shard 1. A's first stream hands out one job of each
 * shard and then breaks, so both jobs are heartbeated by unary call.
 */
import { create } from "@bufbuild/protobuf";
import { LeaderRedirectSchema } from "@casq/api/casq/v1/errors_pb.ts";
import { ClaimedMessageSchema, HeartbeatOutcome, MessageSchema } from "@casq/api/casq/v1/message_pb.ts";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import type { WorkRequest } from "@casq/api/casq/v1/work_pb.ts";
import { Code, ConnectError } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { afterEach, describe, expect, it } from "vitest";
import { type LoopbackServer, serveOnLoopback } from "../testing/loopback-server.ts";
import { openedReply } from "../testing/stub-replies.ts";
import { until } from "../testing/until.ts";
import { LEADER_ADDRESS_TRAILER } from "./errors.ts";
import { Worker } from "./worker.ts";

/** Leader addresses by shard, filled in once both stubs listen. */
const leaders: string[] = [];
const receiptOf = (shard: number) => `r-${shard}`;

interface Stub {
  readonly server: LoopbackServer;
  /** The receipts of each unary Heartbeat call it got. */
  readonly heartbeats: string[][];
}

/**
 * A broker leading `shard`. With `jobs`, its first stream hands out one job of
 * each shard and then breaks; its unary Heartbeat extends the leases of its own
 * shard and redirects a call that names a receipt of another.
 */
async function startStub(shard: number, jobs: boolean): Promise<Stub> {
  const heartbeats: string[][] = [];
  let opens = 0;
  const handler = connectNodeAdapter({
    routes: (router) =>
      router.service(QueueService, {
        async heartbeat(request) {
          heartbeats.push([...request.receipts]);
          const foreign = request.receipts.find((r) => r !== receiptOf(shard));
          if (foreign !== undefined) {
            const leaderAddress = leaders[Number(foreign.slice(2))] as string;
            throw new ConnectError(
              "shard led elsewhere",
              Code.Unavailable,
              { [LEADER_ADDRESS_TRAILER]: leaderAddress },
              [{ desc: LeaderRedirectSchema, value: create(LeaderRedirectSchema, { leaderAddress }) }],
            );
          }
          return {
            results: request.receipts.map((receipt) => ({
              receipt,
              outcome: HeartbeatOutcome.EXTENDED,
              leaseDeadline: { seconds: BigInt(Math.floor(Date.now() / 1000) + 30) },
            })),
          };
        },
        async *work(requests: AsyncIterable<WorkRequest>) {
          for await (const request of requests) {
            if (request.command.case !== "open") continue;
            opens += 1;
            yield openedReply(request.requestId, shard, opens, leaders, 1n);
            if (!jobs || opens > 1) continue;
            for (const s of [0, 1])
              yield {
                event: {
                  case: "job",
                  value: create(ClaimedMessageSchema, {
                    message: create(MessageSchema, { id: `job-${s}`, queue: "q", shard: s }),
                    receipt: receiptOf(s),
                    attempt: 1,
                    maxAttempts: 5,
                  }),
                },
              };
            await new Promise((resolve) => setTimeout(resolve, 50));
            throw new ConnectError("broker crashed", Code.Unavailable);
          }
        },
      }),
  });
  return { server: await serveOnLoopback(handler), heartbeats };
}

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  leaders.length = 0;
});

describe("worker heartbeats", () => {
  it("heartbeats the jobs of a broken stream by one unary call per shard, each at its shard's leader", async () => {
    const a = await startStub(0, true);
    const b = await startStub(1, false);
    cleanups.push(
      () => a.server.close(),
      () => b.server.close(),
    );
    leaders.push(a.server.address, b.server.address);
    const worker = new Worker({
      brokers: [a.server.address],
      workerId: "heartbeats-test",
      logger: null,
      backoffInitialMs: 20,
      backoffMaxMs: 100,
    });
    const errors: unknown[] = [];
    let release!: () => void;
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    const done = worker.run("q", () => released, { concurrency: 2, onError: (error) => errors.push(error) });
    cleanups.push(async () => {
      release();
      await worker.stop({ timeoutMs: 100 });
      await done.catch(() => {});
    });
    await until("both leases heartbeated at their leaders", () =>
      [a, b].every((stub, shard) => stub.heartbeats.some((h) => h.length === 1 && h[0] === receiptOf(shard))),
    );
    // No call named both shards (it would have been redirected back and forth), and nothing failed.
    expect([...a.heartbeats, ...b.heartbeats].filter((h) => h.length > 1)).toEqual([]);
    expect(errors.filter((error) => !String(error).includes("broker crashed"))).toEqual([]); // the break itself is reported
  });
});
