/**
 * HTTP/2 keepalive: a worker with no job sends nothing on its Work stream, so
 * a broker that hangs with the connection up (a frozen process, a stalled
 * proxy) would hold it forever. PINGs unanswered within `keepaliveTimeoutMs`
 * close the connection; the stream fails and the worker reconnects to the
 * next broker, where it gets the jobs enqueued since.
 *
 * The hang is a TCP proxy that stops forwarding in both directions while
 * keeping both sockets open, as the kernel does for a SIGSTOPped broker (the
 * scenario idle-worker-follows-frozen-leader does it with real processes).
 */
import { createServer, type Server, type Socket, connect as tcpConnect } from "node:net";
import { Admin, type ClientOptions, Producer, Worker } from "@casq/sdk";
import { resolveClientOptions } from "@casq/sdk/client-options.ts";
import { keepaliveTransportOptions } from "@casq/sdk/transport.ts";
import { afterEach, describe, expect, it } from "vitest";
import { closeServers, eventually, startServer } from "./support.ts";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  await closeServers();
});

/** A TCP proxy to `target`; `freeze()` stops it forwarding anything, sockets left open. */
async function freezableProxy(target: string): Promise<{ address: string; freeze: () => void }> {
  const [host, port] = target.split(":") as [string, string];
  const sockets = new Set<Socket>();
  let frozen = false;
  const server: Server = createServer((client) => {
    const upstream = tcpConnect(Number(port), host);
    sockets.add(client).add(upstream);
    client.on("data", (chunk) => {
      if (!frozen) upstream.write(chunk);
    });
    upstream.on("data", (chunk) => {
      if (!frozen) client.write(chunk);
    });
    const close = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on("error", close).on("close", close);
    upstream.on("error", close).on("close", close);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  );
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("no port");
  return {
    address: `127.0.0.1:${address.port}`,
    freeze: () => {
      frozen = true;
    },
  };
}

describe("keepalive", () => {
  it("is on by default, and keepaliveMs 0 turns it off", () => {
    expect(keepaliveTransportOptions(resolveClientOptions({ brokers: ["b:1"] }))).toEqual({
      pingIntervalMs: 10_000,
      pingTimeoutMs: 10_000,
      pingIdleConnection: true,
    });
    expect(
      keepaliveTransportOptions(
        resolveClientOptions({ brokers: ["b:1"], keepaliveMs: 2_000, keepaliveTimeoutMs: 500 }),
      ),
    ).toEqual({ pingIntervalMs: 2_000, pingTimeoutMs: 500, pingIdleConnection: true });
    expect(keepaliveTransportOptions(resolveClientOptions({ brokers: ["b:1"], keepaliveMs: 0 }))).toEqual({});
    expect(() => resolveClientOptions({ brokers: ["b:1"], keepaliveMs: -1 })).toThrow(/keepaliveMs/);
  });

  it("an idle Work stream to a hung broker is given up and the worker gets later jobs elsewhere", async () => {
    const server = await startServer();
    await new Admin({ brokers: [server.address] }).createQueue("idle-hung");
    const proxy = await freezableProxy(server.address);
    const options: ClientOptions = {
      brokers: [proxy.address, server.address],
      keepaliveMs: 500,
      keepaliveTimeoutMs: 500,
      // Only keepalive may notice the hang: a Work stream request (an ack
      // whose answer the freeze swallowed) would break the stream after timeoutMs.
      timeoutMs: 3_600_000,
      backoffInitialMs: 20,
      backoffMaxMs: 200,
    };
    const seen: string[] = [];
    const worker = new Worker({ ...options, logger: null });
    // The broker behind the proxy is alive: it may send the next job down the
    // dead stream, where it is lost until its (short) lease runs out.
    const run = worker.run(
      "idle-hung",
      (job) => {
        seen.push(job.text());
      },
      { leaseTtlMs: 2_000 },
    );
    cleanups.push(() => worker.stop({ timeoutMs: 1_000 }));
    const producer = new Producer({ brokers: [server.address] });
    await producer.enqueue("idle-hung", "before");
    await eventually(() => seen.includes("before"), 10_000);
    // Its ack has landed: the stream has no request open.
    const admin = new Admin({ brokers: [server.address] });
    await eventually(async () => {
      const queue = await admin.getQueue("idle-hung");
      return queue.totals?.messages === 0n && queue.totals.inFlight === 0n;
    }, 10_000);

    // The worker holds no job: it sends nothing, and the frozen proxy answers nothing.
    proxy.freeze();
    await producer.enqueue("idle-hung", "after");
    await eventually(() => seen.includes("after"), 20_000);
    expect(seen).toEqual(["before", "after"]);
    await worker.stop({ timeoutMs: 1_000 });
    await run;
  });
});
