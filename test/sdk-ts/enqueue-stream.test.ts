/**
 * The TypeScript producer on EnqueueStreams (sdk/ts/src/enqueue-stream.ts),
 * against real brokers over loopback: requests go on the stream (the broker's
 * metrics count them as EnqueueStream requests), a stream is closed once
 * idle, a broker without the stream gets unary calls, a broken stream fails
 * a request that is not safe to repeat as an unknown outcome, and a request
 * unanswered within the client's timeout gives the stream up.
 */
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import { CasqError, Code, OutcomeUnknownError, Producer } from "@casq/sdk";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { afterEach, describe, expect, it } from "vitest";
import { gatedStore } from "../service/support.ts";
import { parseExposition, sampleValue } from "../telemetry/exposition.ts";
import { closeServers, eventually, startServer } from "./support.ts";

const producers: Producer[] = [];
afterEach(async () => {
  for (const p of producers.splice(0)) p.close();
  await closeServers();
});

function producer(options: ConstructorParameters<typeof Producer>[0]): Producer {
  const p = new Producer(options);
  producers.push(p);
  return p;
}

async function rpcRequests(metricsAddress: string, method: string): Promise<number> {
  const res = await fetch(`http://${metricsAddress}/metrics`);
  return sampleValue(parseExposition(await res.text()), "casq_rpc_requests_total", { method }) ?? 0;
}

describe("the producer's EnqueueStream", () => {
  it("sends requests on the stream (unary calls with enqueueStream: false) and closes it once idle", async () => {
    const s = await startServer({ metricsListen: "127.0.0.1:0" });
    const metrics = s.metricsAddress as string;
    const streamed = producer({ brokers: [s.address] });
    const results = await Promise.all(
      Array.from({ length: 50 }, (_, i) => streamed.enqueue("mail", `m${i}`)),
    );
    expect(new Set(results.map((r) => r.offset)).size).toBe(50);
    await streamed.enqueueBatch("mail", [{ payload: "b1" }, { payload: "b2" }]);
    expect(s.enqueueStreams.openStreams).toBe(1);
    expect(await rpcRequests(metrics, "EnqueueStream")).toBeGreaterThanOrEqual(2);
    expect(await rpcRequests(metrics, "Enqueue")).toBe(0);
    // Idle: the stream is closed (so a process that is done can exit), and opened again when needed.
    await eventually(() => s.enqueueStreams.openStreams === 0);
    await streamed.enqueue("mail", "again");
    expect(s.enqueueStreams.openStreams).toBe(1);
    streamed.close();
    await eventually(() => s.enqueueStreams.openStreams === 0);

    const unary = producer({ brokers: [s.address], enqueueStream: false });
    const before = await rpcRequests(metrics, "EnqueueStream");
    await unary.enqueue("mail", "unary");
    expect(await rpcRequests(metrics, "Enqueue")).toBe(1);
    expect(await rpcRequests(metrics, "EnqueueStream")).toBe(before);
  });

  it("sends unary calls to a broker that answers the stream UNIMPLEMENTED (an older broker)", async () => {
    let streams = 0;
    let unaryCalls = 0;
    // An older broker's QueueService: Enqueue only (connect answers every other method UNIMPLEMENTED).
    const handler = connectNodeAdapter({
      routes: (router) =>
        router.service(QueueService, {
          enqueue: (req) => {
            unaryCalls += 1;
            return { messages: req.messages.map((_, i) => ({ id: `id-${i}`, shard: 0, offset: BigInt(i) })) };
          },
        }),
      interceptors: [
        (next) => (req) => {
          if (req.method.name === "EnqueueStream") streams += 1;
          return next(req);
        },
      ],
    });
    const older = http2.createServer(handler);
    const sessions = new Set<http2.ServerHttp2Session>();
    older.on("session", (session) => sessions.add(session));
    await new Promise<void>((resolve) => older.listen(0, "127.0.0.1", resolve));
    try {
      const address = `127.0.0.1:${(older.address() as AddressInfo).port}`;
      const p = producer({ brokers: [address] });
      expect((await p.enqueue("mail", "one")).id).toBe("id-0");
      expect(await p.enqueueBatch("mail", [{ payload: "a" }, { payload: "b" }])).toHaveLength(2);
      expect(streams).toBe(1); // tried once, then unary calls only
      expect(unaryCalls).toBe(2);
    } finally {
      for (const session of sessions) session.destroy();
      await new Promise((resolve) => older.close(resolve));
    }
  });

  it("fails a request that is not safe to repeat with OutcomeUnknownError when its stream breaks", async () => {
    const gated = gatedStore();
    const s = await startServer({ store: gated.store });
    const p = producer({ brokers: [s.address], defaultDedupIds: false, batching: false });
    await p.enqueue("mail", "first");
    gated.shut();
    const pending = p.enqueue("mail", "in flight").catch((error: unknown) => error);
    await eventually(() => gated.waiting > 0);
    // The broker goes away without answering: the request may or may not have been stored.
    const closing = s.close({ graceful: false });
    const error = await pending;
    gated.open();
    await closing;
    expect(error).toBeInstanceOf(OutcomeUnknownError);
    expect((error as CasqError).code).toBe(Code.Unavailable);
    expect((error as Error).message).toMatch(/may or may not have been applied/);
  });

  it("gives a stream up when a request goes unanswered for the client's timeout, and opens a new one", async () => {
    const gated = gatedStore();
    const s = await startServer({ store: gated.store });
    const setup = producer({ brokers: [s.address] });
    await setup.enqueue("mail", "the queue exists");
    setup.close();
    await eventually(() => s.enqueueStreams.openStreams === 0);
    const p = producer({ brokers: [s.address], timeoutMs: 300, maxAttempts: 1 });
    await p.enqueue("mail", "first");
    expect(s.enqueueStreams.openStreams).toBe(1);
    gated.shut();
    const error = await p.enqueue("mail", "stuck").catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CasqError);
    expect((error as CasqError).code).toBe(Code.DeadlineExceeded);
    // The SDK cancelled the stream it gave up.
    await eventually(() => s.enqueueStreams.openStreams === 0);
    gated.open();
    await p.enqueue("mail", "after");
    expect(s.enqueueStreams.openStreams).toBe(1);
  });

  it("keeps a stream whose broker answers other requests while one times out (a slow shard, not a hung broker)", async () => {
    const slow = gatedStore(["slow"]);
    const later = gatedStore(["later"], slow.store);
    const s = await startServer({ store: later.store });
    const setup = producer({ brokers: [s.address] });
    for (const queue of ["slow", "later", "fast"]) await setup.enqueue(queue, "the queue exists");
    const p = producer({ brokers: [s.address], timeoutMs: 600, maxAttempts: 1 });
    await p.enqueue("fast", "opens the stream");
    slow.shut();
    later.shut();
    const stuck = p.enqueue("slow", "stuck").catch((e: unknown) => e);
    const started = Date.now();
    // The broker keeps answering on the stream while "stuck" runs out its timeout (600 ms)...
    const answerFor = async (ms: number) => {
      while (Date.now() - started < ms) {
        await p.enqueue("fast", "answered");
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    };
    await answerFor(400);
    // ...and "held" is in flight on the same stream when it does.
    const held = p.enqueue("later", "held").catch((e: unknown) => e);
    await eventually(() => slow.waiting > 0 && later.waiting > 0);
    await answerFor(700);
    expect(((await stuck) as CasqError).code).toBe(Code.DeadlineExceeded);
    // The stream was not given up: "held" gets its answer once its write lands.
    later.open();
    expect(await held).not.toBeInstanceOf(Error);
    slow.open();
  });
});
