/**
 * Server lifecycle over real gRPC on loopback: binding, advertised address,
 * state that survives a restart on a `file:` store, graceful shutdown that
 * hands shard leases back (a second broker takes over at once), and a
 * non-graceful one after which the other broker waits for the lease.
 */
import { createServer } from "node:net";
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import { tempDirForTest } from "../../server/testing/test-temp-dir.ts";
import { bytes, codeOf, grpcClients, sharedStore, startTestServer, text, useTestServers } from "./support.ts";

const server = useTestServers();

describe("server lifecycle", () => {
  it("binds port 0 to a free port, advertises what it is told, and fails clearly on a busy port", async () => {
    const s = await server({ advertise: "broker-1.example:7000" });
    expect(s.address).toMatch(/^127\.0\.0\.1:\d+$/);
    expect(s.address).not.toBe("127.0.0.1:0");
    expect(s.advertisedAddress).toBe("broker-1.example:7000");
    const { queue } = grpcClients(s.address);
    await queue.enqueue({ queue: "adv", messages: [{}] });
    expect((await queue.lookupShards({ queue: "adv" })).shards[0]?.leader?.address).toBe(
      "broker-1.example:7000",
    );

    const blocker = createServer();
    await new Promise<void>((resolve) => blocker.listen(0, "127.0.0.1", resolve));
    const port = (blocker.address() as { port: number }).port;
    await expect(startTestServer({ listen: `127.0.0.1:${port}` })).rejects.toMatchObject({
      code: "EADDRINUSE",
    });
    blocker.close();
    await expect(startTestServer({ listen: "nonsense" })).rejects.toThrow(/not HOST:PORT/);
  });

  it("keeps the state in a file: store across a restart", async () => {
    const dir = tempDirForTest("casq-service-");
    const first = await startTestServer({ store: `file:${dir}` });
    await grpcClients(first.address).admin.createQueue({ queue: "durable", shardCount: 2 });
    await grpcClients(first.address).queue.enqueue({
      queue: "durable",
      messages: [{ payload: bytes("one") }, { payload: bytes("two") }],
    });
    await first.close({ graceful: true });
    const second = await server({ store: `file:${dir}` });
    const { queue, admin } = grpcClients(second.address);
    expect((await admin.listQueues({})).queues).toEqual([
      expect.objectContaining({ name: "durable", shardCount: 2 }),
    ]);
    const claimed = await queue.claim({ queue: "durable", workerId: "w", maxMessages: 10 });
    expect(claimed.messages.map((m) => text(m.message?.payload)).sort()).toEqual(["one", "two"]);
  });

  it("graceful close hands the leases back: another broker takes over at once", async () => {
    const store = sharedStore(new MemoryStore());
    const a = await startTestServer({ store, brokerId: "a" });
    const b = await server({ store, brokerId: "b" });
    await grpcClients(a.address).admin.createQueue({ queue: "handover", shardCount: 2 });
    await grpcClients(a.address).queue.enqueue({ queue: "handover", messages: [{ payload: bytes("x") }] });
    // While a runs, another broker is redirected to it. (A broker that was redirected
    // remembers the leader's lease until it runs out, so b itself is not asked before.)
    const c = await server({ store, brokerId: "c" });
    expect(await codeOf(grpcClients(c.address).queue.enqueue({ queue: "handover", messages: [{}] }))).toBe(
      "Unavailable",
    );
    await a.close({ graceful: true });
    // Calls on the closed broker fail; the other broker takes both shards over immediately.
    expect(await codeOf(grpcClients(a.address).queue.lookupShards({ queue: "handover" }))).not.toBe("OK");
    const claimed = await grpcClients(b.address).queue.claim({
      queue: "handover",
      workerId: "w",
      maxMessages: 5,
    });
    // Had the lease not been released, b would redirect to a (UNAVAILABLE) until it ran out.
    expect(text(claimed.messages[0]?.message?.payload)).toBe("x");
    const routes = await grpcClients(b.address).queue.lookupShards({ queue: "handover" });
    expect(routes.shards.map((r) => r.leader?.brokerId)).toEqual(["b", "b"]);
  });

  it("refuses new calls while draining and lets calls in flight finish", async () => {
    const s = await startTestServer();
    const { queue } = grpcClients(s.address);
    await queue.enqueue({ queue: "drain", messages: [{ payload: bytes("warm") }] });
    await queue.claim({ queue: "drain", workerId: "w" });
    const longPoll = queue.claim({ queue: "drain", workerId: "w", wait: { seconds: 1n, nanos: 0 } });
    await new Promise((resolve) => setTimeout(resolve, 50));
    const closing = s.close({ graceful: true, timeoutMs: 5_000 });
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(s.calls.draining).toBe(true);
    // A new call on the open connection is refused; the client should go elsewhere.
    const refused = await queue.enqueue({ queue: "drain", messages: [{}] }).then(
      () => undefined,
      (error: unknown) => ConnectError.from(error),
    );
    expect(refused?.code).toBe(Code.Unavailable);
    expect(refused?.rawMessage).toMatch(/broker shutting down/);
    // Nothing of a refused call was applied, and the broker says so.
    expect(refused?.metadata.get("casq-not-applied")).toBe("true");
    // The long poll in flight still completes normally.
    expect((await longPoll).messages).toEqual([]);
    await closing;
  });

  it("a non-graceful close keeps the leases: the other broker redirects until they expire", async () => {
    const store = sharedStore(new MemoryStore());
    const commit = { leaseMs: 1_000 };
    const a = await startTestServer({ store, brokerId: "a", commit });
    const b = await server({ store, brokerId: "b", commit });
    await grpcClients(a.address).queue.enqueue({ queue: "crash", messages: [{ payload: bytes("kept") }] });
    await a.close({ graceful: false });
    const { queue } = grpcClients(b.address);
    expect(await codeOf(queue.claim({ queue: "crash", workerId: "w" }))).toBe("Unavailable");
    await new Promise((resolve) => setTimeout(resolve, 1_100));
    const claimed = await queue.claim({ queue: "crash", workerId: "w" });
    expect(text(claimed.messages[0]?.message?.payload)).toBe("kept");
  });
});
