/**
 * AdminService.RepairShard over real gRPC on loopback: a refused shard
 * (garbage bytes, an inconsistent document, a missing document) is replaced
 * by a fresh or salvaged document after its bytes are copied to a backup
 * key; the broker serves the shard again at once; a readable shard, or one
 * that changed since the operator looked, is left alone.
 */
import { SubscriptionStart } from "@casq/api/casq/v1/admin_service_pb.ts";
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
async function setup(commit: { tailBytes?: number; indexSegmentSize?: number } = {}) {
  const inner = new MemoryStore();
  const s = await server({ store: sharedStore(inner), commit });
  const c = grpcClients(s.address);
  await c.admin.createQueue({ queue: "q", shardCount: 2 });
  await c.admin.createSubscription({ queue: "q", subscription: "audit", start: SubscriptionStart.EARLIEST });
  // A broker that has loaded nothing yet, so what the test writes to the store is what it reads.
  await s.close({ graceful: true });
  const fresh = await server({ store: sharedStore(inner), commit });
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

  it("refuses a next_offset above 2^53 - 1 with INVALID_ARGUMENT before writing anything", async () => {
    const { inner, c } = await setup();
    await overwrite(inner, "queues/q/0.json", "garbage");
    const tooLarge = 2n ** 53n;
    const error = await c.admin.repairShard({ queue: "q", shard: 0, nextOffset: tooLarge }).catch((e) => e);
    expect(Code[ConnectError.from(error).code]).toBe("InvalidArgument");
    expect(ConnectError.from(error).rawMessage).toMatch(/next_offset 9007199254740992 is too large/);
    expect(await inner.list("repairs/")).toEqual([]);
    expect(text((await inner.get("queues/q/0.json"))?.body)).toBe("garbage");
    // The largest exact offset is accepted, and the shard is served from there.
    const repaired = await c.admin.repairShard({ queue: "q", shard: 0, nextOffset: tooLarge - 1n });
    expect(repaired.nextOffset).toBe(tooLarge - 1n);
    const info = await c.admin.getQueue({ queue: "q" });
    expect(info.shards.map((x) => x.problem)).toEqual(["", ""]);
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
    // A head of a format newer than this casq: upgrade the brokers, do not repair.
    const newer = text((await inner.get("queues/q/1.json"))?.body).replace("casq.shard.v2", "casq.shard.v9");
    await overwrite(inner, "queues/q/1.json", newer);
    expect(await code(c.admin.repairShard({ queue: "q", shard: 1 }))).toBe("FailedPrecondition");
    expect(text((await inner.get("queues/q/1.json"))?.body)).toBe(newer);
    expect(await inner.list("repairs/")).toEqual([]);
  });

  describe("a v2 shard with segments", () => {
    const SEG = "queues/q/0/seg/";
    /** Shard 0 with 40 messages of which the first 10 are acked, most of them sealed into segments. */
    async function sealed(commit: { indexSegmentSize?: number } = {}) {
      const { inner, c } = await setup({ tailBytes: 1024, ...commit });
      for (let i = 0; i < 40; i += 5)
        await c.queue.enqueue({
          queue: "q",
          messages: Array.from({ length: 5 }, (_, k) => ({
            payload: bytes(`m${i + k}-${"x".repeat(200)}`),
            key: "k",
          })),
        });
      const status = await c.admin.getQueue({ queue: "q" });
      const shard = status.shards.findIndex((x) => x.messages > 0n);
      expect(shard).toBe(0); // key "k" lands on shard 0 of 2
      for (const subscription of ["default", "audit"]) {
        const claimed = await c.queue.claim({ queue: "q", subscription, workerId: "w", maxMessages: 10 });
        await c.queue.ack({ queue: "q", subscription, receipts: claimed.messages.map((m) => m.receipt) });
      }
      const head = JSON.parse(text((await inner.get("queues/q/0.json"))?.body)) as {
        segments: { name: string }[];
        index_segments?: { name: string }[];
        broker: { epoch: number };
      };
      expect(head.segments.length + (head.index_segments?.length ?? 0)).toBeGreaterThan(2);
      return { inner, c, head };
    }

    it("salvages the tail and the readable segments of an inconsistent head, backs the segments up, and collects them after the takeover", async () => {
      const { inner, c, head } = await sealed();
      const raw = JSON.parse(text((await inner.get("queues/q/0.json"))?.body));
      raw.next_offset = 1; // inconsistent: below the stored offsets
      await overwrite(inner, "queues/q/0.json", JSON.stringify(raw));
      const oldSegments = (await inner.list(SEG)).map((e) => e.key);
      expect(oldSegments.length).toBeGreaterThan(2);

      const repaired = await c.admin.repairShard({ queue: "q", shard: 0 });
      expect(repaired.messagesSalvaged).toBe(30n); // the 30 not settled by both subscriptions
      expect(repaired.nextOffset).toBe(40n);
      const stored = JSON.parse(text((await inner.get("queues/q/0.json"))?.body));
      expect(stored.format).toBe("casq.shard.v2");
      expect(stored.segments).toEqual([]); // references nothing that may not exist
      expect(stored.broker.epoch).toBeGreaterThanOrEqual(head.broker.epoch);
      expect(stored.broker.lease_until).toBe(0);
      const backups = (await inner.list("repairs/q/0/")).map((e) => e.key);
      for (const key of oldSegments)
        expect(backups.some((b) => b.endsWith(`/seg/${key.slice(SEG.length)}`))).toBe(true);

      // Served again: every salvaged message once per subscription, in offset order.
      const claimed = await c.queue.claim({ queue: "q", workerId: "w2", maxMessages: 100 });
      expect(claimed.messages.map((m) => Number(m.message?.offset))).toEqual(
        Array.from({ length: 30 }, (_, i) => 10 + i),
      );
      const audit = await c.queue.claim({
        queue: "q",
        subscription: "audit",
        workerId: "w2",
        maxMessages: 100,
      });
      expect(audit.messages).toHaveLength(30);
      // The takeover's sweep deletes the old segments (unreferenced, earlier epochs); their backups stay.
      const deadline = Date.now() + 10_000;
      let left = oldSegments;
      while (Date.now() < deadline) {
        const now = new Set((await inner.list(SEG)).map((e) => e.key));
        left = oldSegments.filter((key) => now.has(key));
        if (left.length === 0) break;
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      expect(left).toEqual([]);
      expect((await inner.list("repairs/q/0/")).length).toBe(backups.length);
    });

    it("salvages the segments an inconsistent head lists through its index segments too", async () => {
      const { inner, c, head } = await sealed({ indexSegmentSize: 1 });
      expect(head.index_segments?.length ?? 0).toBeGreaterThan(0);
      const raw = JSON.parse(text((await inner.get("queues/q/0.json"))?.body));
      raw.next_offset = 1; // inconsistent: below the stored offsets
      await overwrite(inner, "queues/q/0.json", JSON.stringify(raw));
      const repaired = await c.admin.repairShard({ queue: "q", shard: 0 });
      expect(repaired.messagesSalvaged).toBe(30n);
      const claimed = await c.queue.claim({ queue: "q", workerId: "w2", maxMessages: 100 });
      expect(claimed.messages.map((m) => Number(m.message?.offset))).toEqual(
        Array.from({ length: 30 }, (_, i) => 10 + i),
      );
    });

    it("salvages the segment objects in the range of an index segment that cannot be read", async () => {
      const { inner, c, head } = await sealed({ indexSegmentSize: 1 });
      const lost = head.index_segments ?? [];
      expect(lost.length).toBeGreaterThan(0);
      for (const idx of lost) await inner.delete(`${SEG}${idx.name}`);
      const repaired = await c.admin.repairShard({ queue: "q", shard: 0 });
      expect(repaired.messagesSalvaged).toBe(30n);
      const claimed = await c.queue.claim({ queue: "q", workerId: "w2", maxMessages: 100 });
      expect(claimed.messages.map((m) => Number(m.message?.offset))).toEqual(
        Array.from({ length: 30 }, (_, i) => 10 + i),
      );
    });

    it("salvages from every segment object when the head is gone", async () => {
      const { inner, c } = await sealed();
      const segmentMessages = async () => {
        let n = 0;
        for (const e of await inner.list(SEG))
          n += JSON.parse(text((await inner.get(e.key))?.body)).messages.length;
        return n;
      };
      const inSegments = await segmentMessages();
      expect(inSegments).toBeGreaterThan(10);
      await inner.delete("queues/q/0.json");
      // The leader finds out at its next write: refused, not recreated empty.
      const late = c.queue.enqueue({ queue: "q", messages: [{ payload: bytes("late"), key: "k" }] });
      expect(await code(late)).toBe("DataLoss");
      expect(await inner.get("queues/q/0.json")).toBeUndefined();

      const repaired = await c.admin.repairShard({ queue: "q", shard: 0 });
      expect(repaired.problem).toMatch(/is missing/);
      // What the segments held comes back pending (the tail died with the head; acks too: at-least-once).
      expect(repaired.messagesSalvaged).toBe(BigInt(inSegments));
      const claimed = await c.queue.claim({ queue: "q", workerId: "w2", maxMessages: 100 });
      expect(claimed.messages).toHaveLength(inSegments);
      expect(Number(repaired.nextOffset)).toBeGreaterThan(
        Math.max(...claimed.messages.map((m) => Number(m.message?.offset))),
      );
    });

    /** Shard 0 with 20 messages settled by `audit` and dead-lettered by `default`, the dead letters sealed. */
    async function deadLettered() {
      const { inner, c } = await setup({ tailBytes: 1024 });
      await c.queue.enqueue({
        queue: "q",
        messages: Array.from({ length: 20 }, (_, i) => ({
          payload: bytes(`d${i}-${"x".repeat(200)}`),
          key: "k",
        })),
      });
      const audit = await c.queue.claim({
        queue: "q",
        subscription: "audit",
        workerId: "w",
        maxMessages: 20,
      });
      await c.queue.ack({
        queue: "q",
        subscription: "audit",
        receipts: audit.messages.map((m) => m.receipt),
      });
      const claimed = await c.queue.claim({ queue: "q", workerId: "w", maxMessages: 20 });
      for (
        let i = 0;
        i < 20;
        i += 5 // several commits: several dead-letter segments
      )
        await c.queue.nack({
          queue: "q",
          receipts: claimed.messages.slice(i, i + 5).map((m) => m.receipt),
          deadLetter: true,
          reason: "broken",
        });
      const dead = (await inner.list(SEG)).map((e) => e.key).filter((k) => k.endsWith(".dead.json"));
      expect(dead.length).toBeGreaterThan(1);
      const ids = (await c.admin.listDeadLetters({ queue: "q", pageSize: 100 })).deadLetters.map(
        (dl) => dl.message?.id,
      );
      expect(ids).toHaveLength(20);
      return { inner, c, dead, ids };
    }

    it("salvages sealed dead letters (and the head's own) of an inconsistent head, and backs their segments up", async () => {
      const { inner, c, dead, ids } = await deadLettered();
      const raw = JSON.parse(text((await inner.get("queues/q/0.json"))?.body));
      raw.next_offset = 1; // inconsistent: below the dead letters' offsets
      await overwrite(inner, "queues/q/0.json", JSON.stringify(raw));
      expect(await code(c.admin.updateQueue({ queue: "q", config: { maxAttempts: 3 } }))).toBe("DataLoss");

      const repaired = await c.admin.repairShard({ queue: "q", shard: 0 });
      expect(repaired.messagesSalvaged).toBe(0n); // every message left the shard: only dead letters hold them
      expect(repaired.nextOffset).toBe(20n);
      const backups = (await inner.list("repairs/q/0/")).map((e) => e.key);
      for (const key of dead)
        expect(backups.some((b) => b.endsWith(`/seg/${key.slice(SEG.length)}`))).toBe(true);
      const listed = (await c.admin.listDeadLetters({ queue: "q", pageSize: 100 })).deadLetters;
      expect(listed.map((dl) => dl.message?.id)).toEqual(ids);
      expect(listed.every((dl) => dl.reason === "broken")).toBe(true);
      const redriven = await c.admin.redriveDeadLetters({ queue: "q", all: true });
      expect(Number(redriven.redriven)).toBe(20);
    });

    it("salvages the dead letters of every dead-letter segment object when the head is gone", async () => {
      const { inner, c, dead } = await deadLettered();
      let sealed = 0;
      for (const key of dead) sealed += JSON.parse(text((await inner.get(key))?.body)).dead_letters.length;
      await inner.delete("queues/q/0.json");
      expect(
        await code(c.queue.enqueue({ queue: "q", messages: [{ payload: bytes("late"), key: "k" }] })),
      ).toBe("DataLoss");
      const repaired = await c.admin.repairShard({ queue: "q", shard: 0 });
      expect(repaired.problem).toMatch(/is missing/);
      const listed = (await c.admin.listDeadLetters({ queue: "q", pageSize: 100 })).deadLetters;
      expect(listed).toHaveLength(sealed);
      expect(sealed).toBeGreaterThan(0);
    });

    it("treats a readable v2 shard with segments as readable (nothing to repair)", async () => {
      const { c } = await sealed();
      expect(await code(c.admin.repairShard({ queue: "q", shard: 0 }))).toBe("FailedPrecondition");
    });
  });
});
