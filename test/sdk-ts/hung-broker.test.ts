/**
 * A broker that hangs must not hold a TypeScript producer: each attempt has
 * its own deadline (`timeoutMs`), after which the call moves on to the next
 * broker, within the retry budget (`retryTimeoutMs`). An attempt that timed
 * out may still have been stored, so the retry carries the same (default)
 * dedup id and the message is stored once.
 *
 * - A proxy that forwards requests to a live broker but swallows every answer:
 *   the attempt is stored and times out; the retry at the broker itself is a
 *   duplicate of it.
 * - Two real `casq serve` processes on one file store, the leader frozen with
 *   SIGSTOP: the enqueue moves to the other broker, which takes the shard over
 *   once the leader's 2 s lease ran out.
 */
import { createServer, type Server, type Socket, connect as tcpConnect } from "node:net";
import { Admin, Producer } from "@casq/sdk";
import { afterEach, describe, expect, it } from "vitest";
import { type CasqServerProcess, startServer as startProcess, tempDir } from "../e2e/support/processes.ts";
import { closeServers, startServer } from "./support.ts";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  await closeServers();
});

/** A TCP proxy to `target` that passes the client's bytes on and drops everything the broker answers. */
async function answerSwallowingProxy(target: string): Promise<string> {
  const [host, port] = target.split(":") as [string, string];
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    const upstream = tcpConnect(Number(port), host);
    sockets.add(client).add(upstream);
    client.pipe(upstream);
    upstream.on("data", () => {}); // read and dropped: the broker seems hung
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
  return `127.0.0.1:${address.port}`;
}

/** The payloads stored in shard 0 of `queue`, as text. */
async function storedPayloads(admin: Admin, queue: string): Promise<string[]> {
  const { document } = await admin.getDocument(queue);
  const doc = JSON.parse(new TextDecoder().decode(document)) as { messages?: { payload?: string }[] };
  return (doc.messages ?? []).map((m) => Buffer.from(m.payload ?? "", "base64").toString("utf8"));
}

describe("a hung broker", () => {
  it("an attempt that was stored but never answered is retried elsewhere and stored once", async () => {
    const server = await startServer();
    const admin = new Admin({ brokers: [server.address] });
    await admin.createQueue("swallowed");
    const proxy = await answerSwallowingProxy(server.address);
    const producer = new Producer({
      brokers: [proxy, server.address],
      timeoutMs: 1_000,
      retryTimeoutMs: 20_000,
    });
    const result = await producer.enqueue("swallowed", "once");
    // The first attempt went through the proxy and was stored; the retry found its dedup id, the
    // producer's own, so the store is this call's and not reported a duplicate.
    expect(result.duplicate).toBe(false);
    expect(await storedPayloads(admin, "swallowed")).toEqual(["once"]);
  });

  it("with the leader frozen (SIGSTOP), enqueues move to the other broker and are stored once", async () => {
    const store = tempDir("hung-leader");
    const args = ["--leader-lease", "2s"];
    const brokers: CasqServerProcess[] = await Promise.all([
      startProcess({ store: `file:${store.path}`, args }),
      startProcess({ store: `file:${store.path}`, args }),
    ]);
    cleanups.push(async () => {
      for (const broker of brokers) {
        broker.child.kill("SIGCONT");
        await broker.stop("SIGKILL");
      }
      store.remove();
    });
    const [b0, b1] = brokers as [CasqServerProcess, CasqServerProcess];
    await new Admin({ brokers: [b0.address] }).createQueue("frozen");
    // b0 takes the shard: it leads it from now on.
    await new Producer({ brokers: [b0.address] }).enqueue("frozen", "before");

    b0.child.kill("SIGSTOP");
    const producer = new Producer({
      brokers: [b0.address, b1.address],
      timeoutMs: 3_000,
      retryTimeoutMs: 20_000,
    });
    const sent = ["after-1", "after-2", "after-3"];
    for (const payload of sent) await producer.enqueue("frozen", payload);

    const stored = await storedPayloads(new Admin({ brokers: [b1.address] }), "frozen");
    expect(stored).toEqual(["before", ...sent]);
  });
});
