/**
 * AdminService.RepairShard over real gRPC on loopback: a refused shard
 * (garbage bytes, an inconsistent document, a missing document) is replaced
 * by a fresh or salvaged document after its bytes are copied to a backup
 * key; the broker serves the shard again at once; a readable shard, or one
 * that changed since the operator looked, is left alone.
 */
import { SubscriptionStart } from "@casq/sdk/gen/casq/v1/admin_service_pb.ts";
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import { bytes, grpcClients, sharedStore, text, useTestServers } from "./support.ts";

const server = useTestServers();

async function code(call: Promise<unknown>): Promise<string> {
  try {
    await call;
    return "OK";
  } catch (error) {
    return Code[ConnectError.from(error).code];
  }
}

/** A server on a shared memory store with queue `q` (2 shards, subscription `audit`) and the store. */
async function setup() {
  const inner = new MemoryStore();
  const s = await server({ store: sharedStore(inner) });
  const c = grpcClients(s.address);
  await c.admin.createQueue({ queue: "q", shardCount: 2 });
  await c.admin.createSubscription({ queue: "q", subscription: "audit", start: SubscriptionStart.EARLIEST });
  // A broker that has loaded nothing yet, so what the test writes to the store is what it reads.
  await s.close({ graceful: true });
  const fresh = await server({ store: sharedStore(inner) });
  return { inner, c: grpcClients(fresh.address) };
}

async function overwrite(inner: MemoryStore, key: string, body: string): Promise<void> {
  const stored = await inner.get(key);
  await inner.put(key, bytes(body), stored ? { ifMatch: stored.etag } : { ifAbsent: true });
}

describe("RepairShard", () => {
  it("replaces garbage with a fresh document shaped like its sibling, keeping the bytes under a backup key", async () => {
    const { inner, c } = await setup();
    await overwrite(inner, "queues/q/0.json", "{not json at all");
    expect(await code(c.admin.purgeQueue({ queue: "q", allSubscriptions: true }))).toBe("DataLoss");

    const repaired = await c.admin.repairShard({ queue: "q", shard: 0 });
    expect(repaired.problem).toMatch(/not valid UTF-8 JSON/);
    expect(repaired.backupKey).toMatch(/^repairs\/q\/0\/\d+\.json$/);
    expect(text((await inner.get(repaired.backupKey))?.body)).toBe("{not json at all");
    expect(repaired.subscriptions).toEqual(["audit", "default"]);
    expect(repaired.configSource).toBe("shard 1");
    expect(repaired.messagesSalvaged).toBe(0n);
    expect((await inner.get("queues/q/0.json"))?.etag).toBe(repaired.etag);

    // Served again at once: purge, enqueue to every shard and claim work.
    await c.admin.purgeQueue({ queue: "q", allSubscriptions: true });
    for (let i = 0; i < 6; i++)
      await c.queue.enqueue({ queue: "q", messages: [{ payload: bytes(`m${i}`) }] });
    const status = await c.admin.getQueue({ queue: "q" });
    expect(status.shards.map((x) => x.problem)).toEqual(["", ""]);
    expect(status.shards.every((x) => x.messages > 0n)).toBe(true);
  });

  it("salvages next_offset, config and messages of a JSON document that fails a consistency check", async () => {
    const { inner, c } = await setup();
    await c.admin.updateQueue({ queue: "q", config: { maxAttempts: 9 } });
    const enq = await c.queue.enqueue({
      queue: "q",
      messages: ["a", "b", "c"].map((p) => ({ payload: bytes(p), key: "k" })),
    });
    const shard = enq.messages[0]?.shard ?? 0;
    await c.queue.claim({ queue: "q", workerId: "w", maxMessages: 1 });
    const key = `queues/q/${shard}.json`;
    const doc = JSON.parse(text((await inner.get(key))?.body)) as { next_offset: number };
    doc.next_offset = 1; // below the stored messages' offsets: inconsistent
    await overwrite(inner, key, JSON.stringify(doc));
    expect(await code(c.admin.updateQueue({ queue: "q", config: { maxAttempts: 3 } }))).toBe("DataLoss");

    const before = (await inner.get(key))?.etag ?? "";
    const repaired = await c.admin.repairShard({ queue: "q", shard, expectedEtag: before });
    expect(repaired.messagesSalvaged).toBe(3n);
    expect(repaired.nextOffset).toBe(3n);
    expect(repaired.configSource).toBe("document");
    const info = await c.admin.getQueue({ queue: "q" });
    expect(info.config?.maxAttempts).toBe(9);
    // Every salvaged message is pending again for both subscriptions (the lease is gone).
    const claimed = await c.queue.claim({ queue: "q", workerId: "w2", maxMessages: 10 });
    expect(claimed.messages.map((m) => text(m.message?.payload))).toEqual(["a", "b", "c"]);
    const audit = await c.queue.claim({ queue: "q", subscription: "audit", workerId: "w2", maxMessages: 10 });
    expect(audit.messages).toHaveLength(3);
  });

  it("recreates a missing document (no backup), raising next_offset when asked", async () => {
    const { inner, c } = await setup();
    await inner.delete("queues/q/1.json");
    expect(await code(c.admin.getQueue({ queue: "q" }))).toBe("OK");
    const repaired = await c.admin.repairShard({ queue: "q", shard: 1, nextOffset: 500n });
    expect(repaired.backupKey).toBe("");
    expect(repaired.problem).toMatch(/is missing/);
    expect(repaired.nextOffset).toBe(500n);
    const stored = JSON.parse(text((await inner.get("queues/q/1.json"))?.body)) as { next_offset: number };
    expect(stored.next_offset).toBe(500);
  });

  it("leaves a readable shard, or one changed since expected_etag, alone", async () => {
    const { inner, c } = await setup();
    expect(await code(c.admin.repairShard({ queue: "q", shard: 0 }))).toBe("FailedPrecondition");
    expect(await code(c.admin.repairShard({ queue: "q", shard: 7 }))).toBe("InvalidArgument");
    await overwrite(inner, "queues/q/0.json", "garbage");
    expect(await code(c.admin.repairShard({ queue: "q", shard: 0, expectedEtag: "not-the-etag" }))).toBe(
      "FailedPrecondition",
    );
    expect(text((await inner.get("queues/q/0.json"))?.body)).toBe("garbage");
    expect(await inner.list("repairs/")).toEqual([]);
  });
});
