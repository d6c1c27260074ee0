/**
 * A broker that goes away mid-call can leave the call's HTTP/2 stream reset
 * with CANCEL (connect reports CANCELED "http/2 stream closed with error code
 * CANCEL"). That is the transport failing, not the caller cancelling: the
 * producer retries it (its dedup id makes the resend safe), and a caller's
 * own abort still ends the call.
 *
 * The broker is a stub (a real HTTP/2 gRPC server, connectNodeAdapter) that
 * resets the first Enqueue with RST_STREAM(CANCEL) and answers the next. The
 * producers send unary calls (`enqueueStream: false`): a broken EnqueueStream
 * is tested in test/sdk-ts/enqueue-stream.test.ts.
 */
import { constants } from "node:http2";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { afterEach, describe, expect, it } from "vitest";
import { serveOnLoopback } from "../testing/loopback-server.ts";
import { Producer } from "./producer.ts";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function stub(resetFirst: number): Promise<{ address: string; calls: () => number }> {
  let calls = 0;
  const handler = connectNodeAdapter({
    routes: (router) =>
      router.service(QueueService, {
        async enqueue(request) {
          return {
            messages: request.messages.map((_, i) => ({ id: `id-${i}`, shard: 0, offset: BigInt(i) })),
          };
        },
      }),
  });
  const server = await serveOnLoopback((req, res) => {
    calls += 1;
    if (calls <= resetFirst) {
      req.stream.close(constants.NGHTTP2_CANCEL);
      return;
    }
    handler(req, res);
  });
  cleanups.push(server.close);
  return { address: server.address, calls: () => calls };
}

describe("a stream reset with CANCEL", () => {
  it("is retried by the producer", async () => {
    const broker = await stub(1);
    const producer = new Producer({
      brokers: [broker.address],
      backoffInitialMs: 1,
      backoffMaxMs: 5,
      enqueueStream: false,
    });
    const result = await producer.enqueue("q", "payload");
    expect(result.id).toBe("id-0");
    expect(broker.calls()).toBe(2);
  });

  it("does not outlive the caller's abort", async () => {
    const broker = await stub(1_000_000);
    const producer = new Producer({
      brokers: [broker.address],
      backoffInitialMs: 50,
      backoffMaxMs: 50,
      enqueueStream: false,
    });
    const abort = new AbortController();
    const call = producer.enqueue("q", "payload", { signal: abort.signal });
    setTimeout(() => abort.abort(), 200);
    await expect(call).rejects.toMatchObject({ code: expect.anything() });
    expect(abort.signal.aborted).toBe(true);
  });
});
