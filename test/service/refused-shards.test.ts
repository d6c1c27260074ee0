/**
 * Shards the broker refuses, over real gRPC on loopback: a document that
 * names another queue or shard than its key, and a shard document that is
 * missing while the queue's manifest says the shard exists. Both answer
 * DATA_LOSS, the stored bytes stay as they are, and GetQueue names the
 * problem.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { FileStore } from "../../server/src/store/file-store.ts";
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

describe("a lost shard document", () => {
  it("is refused with DATA_LOSS, not recreated empty, when the manifest says the shard exists (file store)", async () => {
    const root = await mkdtemp(join(tmpdir(), "casq-lost-shard-"));
    try {
      const inner = new FileStore({ root });
      const s = await server({ store: sharedStore(inner) });
      const { admin, queue } = grpcClients(s.address);
      await admin.createQueue({ queue: "jobs", shardCount: 2 });
      await queue.enqueue({
        queue: "jobs",
        messages: ["a", "b", "c"].map((p) => ({ payload: bytes(p), key: "same-key" })),
      });
      const lostShard =
        (await admin.getQueue({ queue: "jobs" })).shards.find((x) => x.messages > 0n)?.shard ?? 0;
      await queue.claim({ queue: "jobs", workerId: "w", maxMessages: 1 });
      await rm(join(root, "queues", "jobs", `${lostShard}.json`));

      // The broker that led the shard notices on its next write; a fresh broker on its first load.
      const fresh = await server({ store: sharedStore(inner) });
      for (const address of [s.address, fresh.address]) {
        const c = grpcClients(address);
        const lost = await outcome(
          c.queue.enqueue({ queue: "jobs", messages: [{ payload: bytes("x"), key: "same-key" }] }),
        );
        expect(lost.code, lost.message).toBe("DataLoss");
        expect(lost.message).toMatch(/is missing.*messages were lost.*casq repair jobs --shard/);
        expect(await inner.get(`queues/jobs/${lostShard}.json`)).toBeUndefined();
        const status = await c.admin.getQueue({ queue: "jobs" });
        expect(status.shards[lostShard]?.problem).toMatch(/is missing/);
        expect(status.shards[1 - lostShard]?.problem).toBe("");
      }
      // The other shard keeps working.
      const other = await grpcClients(s.address).queue.enqueue({
        queue: "jobs",
        messages: [{ payload: bytes("y") }, { payload: bytes("z") }],
      });
      expect(other.messages.every((m) => m.shard === 1 - lostShard)).toBe(true);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });

  it("is created by Enqueue's auto-creation before the queue is ready, so a new queue is not refused", async () => {
    const inner = new MemoryStore();
    const s = await server({ store: sharedStore(inner) });
    const { queue } = grpcClients(s.address);
    await queue.enqueue({ queue: "auto", messages: [{ payload: bytes("1") }] });
    expect(text((await inner.get("queues/auto/queue.json"))?.body)).toMatch(/"state":"ready"/);
    expect(await inner.get("queues/auto/0.json")).toBeDefined();
    // An auto-creation interrupted after its manifest is completed by the next Enqueue.
    const manifest = text((await inner.get("queues/auto/queue.json"))?.body).replace('"ready"', '"creating"');
    await inner.put("queues/half/queue.json", bytes(manifest.replace('"auto"', '"half"')), {
      ifAbsent: true,
    });
    const fresh = await server({ store: sharedStore(inner) });
    const done = await grpcClients(fresh.address).queue.enqueue({
      queue: "half",
      messages: [{ payload: bytes("2") }],
    });
    expect(done.messages).toHaveLength(1);
    expect(text((await inner.get("queues/half/queue.json"))?.body)).toMatch(/"state":"ready"/);
  });
});

describe("an unreadable queue manifest", () => {
  it("is listed with its problem by ListQueues, and the other queues are still listed", async () => {
    const inner = new MemoryStore();
    const s = await server({ store: sharedStore(inner) });
    const { admin } = grpcClients(s.address);
    for (const name of ["alpha", "broken", "gamma"]) await admin.createQueue({ queue: name });
    const manifest = await inner.get("queues/broken/queue.json");
    await inner.put("queues/broken/queue.json", bytes("{garbage"), { ifMatch: manifest?.etag ?? "" });

    const fresh = await server({ store: sharedStore(inner) });
    const c = grpcClients(fresh.address);
    const listed = await c.admin.listQueues({});
    expect(listed.queues.map((q) => [q.name, q.shardCount, q.problem !== ""])).toEqual([
      ["alpha", 1, false],
      ["broken", 0, true],
      ["gamma", 1, false],
    ]);
    expect(listed.queues[1]?.problem).toMatch(/queues\/broken\/queue\.json cannot be read/);
    // Paging walks past it too.
    const page1 = await c.admin.listQueues({ pageSize: 2 });
    const page2 = await c.admin.listQueues({ pageSize: 2, pageToken: page1.nextPageToken });
    expect([...page1.queues, ...page2.queues].map((q) => q.name)).toEqual(["alpha", "broken", "gamma"]);
    expect((await outcome(c.admin.getQueue({ queue: "broken" }))).code).toBe("DataLoss");
    expect(text((await inner.get("queues/broken/queue.json"))?.body)).toBe("{garbage");
  });
});
