/**
 * When a job's credit goes back to its Work stream: when its handler
 * finishes, not when the broker answers its ack. A worker at concurrency 50
 * that waited for each ack's commit before asking for the next job would hold
 * a slot per job for two commits (the claim's and the ack's); giving the
 * credit back with the handler's end lets the ack and the next claim ride in
 * one commit.
 *
 * The broker is a stub (a real HTTP/2 gRPC server, connectNodeAdapter) that
 * delivers one job per credit and never answers acks, so a credit can only
 * come from the handler's end.
 */
import { create } from "@bufbuild/protobuf";
import { ClaimedMessageSchema, MessageSchema } from "@casq/api/casq/v1/message_pb.ts";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import type { WorkRequest } from "@casq/api/casq/v1/work_pb.ts";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { afterEach, describe, expect, it } from "vitest";
import { serveOnLoopback } from "../testing/loopback-server.ts";
import { until } from "../testing/until.ts";
import { Worker } from "./worker.ts";

interface StubBroker {
  readonly address: string;
  /** Commands received on Work streams, in order ("open", "credit", "ack", ...). */
  readonly received: string[];
  close(): Promise<void>;
}

async function startStub(): Promise<StubBroker> {
  const received: string[] = [];
  let sent = 0;
  const handler = connectNodeAdapter({
    routes: (router) =>
      router.service(QueueService, {
        async *work(requests: AsyncIterable<WorkRequest>) {
          const job = () => {
            sent += 1;
            return {
              event: {
                case: "job" as const,
                value: create(ClaimedMessageSchema, {
                  message: create(MessageSchema, { id: `job-${sent}`, queue: "q", offset: BigInt(sent) }),
                  receipt: `r-${sent}`,
                  attempt: 1,
                  maxAttempts: 5,
                }),
              },
            };
          };
          for await (const request of requests) {
            const command = request.command;
            received.push(command.case ?? "empty");
            if (command.case === "open") {
              yield {
                requestId: request.requestId,
                event: {
                  case: "opened",
                  value: {
                    sessionId: "s-1",
                    brokerId: "stub",
                    queue: "q",
                    leaseTtl: { seconds: 30n },
                    heartbeatInterval: { seconds: 10n },
                    maxCredits: 1000,
                    routing: { servingShards: [0], shards: [] },
                  },
                },
              };
              for (let i = 0; i < command.value.credits; i++) yield job();
            } else if (command.case === "credit") {
              for (let i = 0; i < command.value.credits; i++) yield job();
            }
            // Acks (and heartbeats) are never answered.
          }
        },
      }),
  });
  const server = await serveOnLoopback(handler);
  return { address: server.address, received, close: server.close };
}

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

describe("worker credits", () => {
  it("gives a job's credit back when its handler finishes, while its ack is still unanswered", async () => {
    const stub = await startStub();
    cleanups.push(() => stub.close());
    const worker = new Worker({ brokers: [stub.address], workerId: "credit-test", logger: null });
    const handled: string[] = [];
    const done = worker.run(
      "q",
      async (job) => {
        handled.push(job.id);
      },
      { concurrency: 1, prefetch: 1 },
    );
    cleanups.push(async () => {
      await worker.stop({ timeoutMs: 100 });
      await done.catch(() => {});
    });
    // Job 1 is handled and acked (never answered); its credit brings job 2,
    // whose credit brings job 3.
    await until("three jobs handled", () => handled.length >= 3);
    expect(handled.slice(0, 3)).toEqual(["job-1", "job-2", "job-3"]);
    expect(stub.received.filter((c) => c === "credit").length).toBeGreaterThanOrEqual(2);
    expect(stub.received.filter((c) => c === "ack").length).toBeGreaterThanOrEqual(2);
  });
});
