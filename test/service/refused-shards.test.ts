/**
 * Shards the broker refuses, over real gRPC on loopback: a document that
 * names another queue or shard than its key, and a shard document that is
 * missing while the queue's manifest says the shard exists. Both answer
 * DATA_LOSS, the stored bytes stay as they are, and GetQueue names the
 * problem.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import { bytes, grpcClients, sharedStore, text, useTestServers } from "./support.ts";

const server = useTestServers();

/** The gRPC code name and message a call fails with ("OK" when it succeeds). */
async function outcome(call: Promise<unknown>): Promise<{ code: string; message: string }> {
  try {
    await call;
    return { code: "OK", message: "" };
  } catch (error) {
    const e = ConnectError.from(error);
    return { code: Code[e.code], message: e.rawMessage };
  }
}

describe("refused shards", () => {
  it("refuses a shard document that names another queue or shard, and leaves its bytes alone", async () => {
    const inner = new MemoryStore();
    const s = await server({ store: sharedStore(inner) });
    const { admin, queue } = grpcClients(s.address);
    await admin.createQueue({ queue: "left", shardCount: 2 });
    await admin.createQueue({ queue: "right" });
    await queue.enqueue({ queue: "left", messages: [{ payload: bytes("a"), key: "k" }] });
    await s.close({ graceful: true });

    // An operator copies the wrong documents into place.
    const otherQueue = await inner.get("queues/left/0.json");
    const otherShard = await inner.get("queues/left/1.json");
    const right = await inner.get("queues/right/0.json");
    await inner.put("queues/right/0.json", otherQueue?.body ?? bytes(""), { ifMatch: right?.etag ?? "" });
    await inner.put("queues/left/0.json", otherShard?.body ?? bytes(""), { ifMatch: otherQueue?.etag ?? "" });
    const before = [
      text((await inner.get("queues/right/0.json"))?.body),
      text((await inner.get("queues/left/0.json"))?.body),
    ];

    const fresh = await server({ store: sharedStore(inner) });
    const c = grpcClients(fresh.address);
    const wrongQueue = await outcome(
      c.queue.enqueue({ queue: "right", messages: [{ payload: bytes("x") }] }),
    );
    expect(wrongQueue.code).toBe("DataLoss");
    expect(wrongQueue.message).toMatch(/says it is queue left shard 0/);
    const wrongShard = await outcome(c.admin.updateQueue({ queue: "left", config: { maxAttempts: 3 } }));
    expect(wrongShard.code).toBe("DataLoss");
    expect(wrongShard.message).toMatch(/says it is queue left shard 1/);
    expect((await outcome(c.queue.claim({ queue: "right", workerId: "w" }))).code).toBe("DataLoss");

    expect([
      text((await inner.get("queues/right/0.json"))?.body),
      text((await inner.get("queues/left/0.json"))?.body),
    ]).toEqual(before);
    const status = await c.admin.getQueue({ queue: "right" });
    expect(status.shards[0]?.problem).toMatch(/says it is queue left shard 0/);
  });
});
