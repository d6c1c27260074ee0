/**
 * Which brokers a worker keeps Work streams to. A worker with two brokers
 * holds one stream per shard leader: the primary (reconnected by its loop)
 * and a secondary opened because the primary's routing names another leader.
 * When the primary's broker breaks its stream, the reconnect loop moves to
 * the stream already open at the other broker and stays there; the shard the
 * broken stream served must still get a stream again (found by simulation
 * seed 941057: a leader restarted at the same address, so the surviving
 * stream's routing never changed and no routing event asked for it).
 *
 * The brokers are stubs (real HTTP/2 gRPC servers, connectNodeAdapter), each
 * serving one shard and naming the other as that shard's leader; they answer
 * acks (a stream broken by an unanswered request would send the loop back).
 */
import { create } from "@bufbuild/protobuf";
import { AckOutcome, ClaimedMessageSchema, MessageSchema } from "@casq/api/casq/v1/message_pb.ts";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import type { WorkRequest } from "@casq/api/casq/v1/work_pb.ts";
import { Code, ConnectError } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { afterEach, describe, expect, it } from "vitest";
import { type LoopbackServer, serveOnLoopback } from "../testing/loopback-server.ts";
import { openedReply } from "../testing/stub-replies.ts";
import { until } from "../testing/until.ts";
import { Worker } from "./worker.ts";

interface StubBroker {
  readonly server: LoopbackServer;
  /** Work streams opened here. */
  opens: number;
  /** With `breakFirst`: the first stream fails now. */
  breakFirstStream(): void;
}

/** Leader addresses by shard, filled in once both stubs listen. */
const leaders: string[] = [];

/**
 * A broker leading `shard`: each stream answers `opened` and sends one job;
 * with `breakFirst`, the first stream fails UNAVAILABLE (the broker died)
 * when the test says so.
 */
async function startStub(shard: number, breakFirst: boolean): Promise<StubBroker> {
  let breakNow!: () => void;
  const broken = new Promise<void>((resolve) => {
    breakNow = resolve;
  });
  const stub = { opens: 0, breakFirstStream: () => breakNow() } as StubBroker;
  const handler = connectNodeAdapter({
    routes: (router) =>
      router.service(QueueService, {
        async *work(requests: AsyncIterable<WorkRequest>) {
          for await (const request of requests) {
            if (request.command.case === "ack") {
              const results = request.command.value.receipts.map((receipt) => ({
                receipt,
                outcome: AckOutcome.ACKED,
              }));
              yield { requestId: request.requestId, event: { case: "acked", value: { results } } };
              continue;
            }
            if (request.command.case !== "open") continue;
            stub.opens += 1;
            const stream = stub.opens;
            yield openedReply(request.requestId, shard, stream, leaders, 10n);
            yield {
              event: {
                case: "job",
                value: create(ClaimedMessageSchema, {
                  message: create(MessageSchema, { id: `shard${shard}-stream${stream}`, queue: "q", shard }),
                  receipt: `r-${shard}-${stream}`,
                  attempt: 1,
                  maxAttempts: 5,
                }),
              },
            };
            if (breakFirst && stream === 1) {
              await broken;
              throw new ConnectError("broker crashed", Code.Unavailable);
            }
          }
        },
      }),
  });
  (stub as { server: LoopbackServer }).server = await serveOnLoopback(handler);
  return stub;
}

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  leaders.length = 0;
});

describe("worker streams", () => {
  it("opens a stream to the leader of a shard again after the primary stream there broke and the loop moved to another broker", async () => {
    const first = await startStub(0, true);
    const second = await startStub(1, false);
    cleanups.push(
      () => first.server.close(),
      () => second.server.close(),
    );
    leaders.push(first.server.address, second.server.address);
    const worker = new Worker({
      brokers: [first.server.address, second.server.address],
      workerId: "streams-test",
      logger: null,
      backoffInitialMs: 20,
      backoffMaxMs: 100,
    });
    const handled = new Set<string>();
    const done = worker.run(
      "q",
      async (job) => {
        handled.add(job.id);
      },
      { concurrency: 1 },
    );
    cleanups.push(async () => {
      await worker.stop({ timeoutMs: 100 });
      await done.catch(() => {});
    });
    await until("both streams open", () => handled.has("shard0-stream1") && handled.has("shard1-stream1"));
    // The first broker's stream breaks; the worker already has a stream at the
    // second one, whose routing names the first as shard 0's leader, unchanged.
    first.breakFirstStream();
    await until("shard 0 served again", () => handled.has("shard0-stream2"));
    expect(first.opens).toBeGreaterThanOrEqual(2);
  });
});
