/**
 * AdminService over real gRPC on loopback: queue lifecycle (create, update,
 * delete, re-create, interrupted create), statistics, subscriptions, purge,
 * dead letters (list with paging, redrive) and raw documents.
 */
import { durationFromMs, durationMs } from "@bufbuild/protobuf/wkt";
import { SubscriptionStart } from "@casq/api/casq/v1/admin_service_pb.ts";
import { describe, expect, it } from "vitest";
import { encodeManifest } from "../../server/src/broker/queue-catalog.ts";
import { DEFAULT_QUEUE_CONFIG } from "../../server/src/model/queue-config.ts";
import { ShardState } from "../../server/src/model/shard-state.ts";
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import { bytes, codeOf, grpcClients, sharedStore, text, useTestServers } from "./support.ts";

const server = useTestServers();

describe("AdminService", () => {
  it("creates a queue with a config, shows it, updates it, and lists queues a page at a time", async () => {
    const s = await server();
    const { admin } = grpcClients(s.address);
    const created = await admin.createQueue({
      queue: "orders",
      shardCount: 3,
      config: { maxAttempts: 7, leaseTtl: durationFromMs(5_000), limits: { maxPayloadBytes: 4096 } },
    });
    expect(created.shardCount).toBe(3);
    expect(created.config?.maxAttempts).toBe(7);
    expect(created.config?.limits?.maxPayloadBytes).toBe(4096);
    expect(created.config?.limits?.maxBatch).toBe(1000); // defaults filled in

    const info = await admin.getQueue({ queue: "orders" });
    expect(info.shardCount).toBe(3);
    expect(durationMs(info.config?.leaseTtl ?? durationFromMs(0))).toBe(5_000);
    expect(info.shards.map((x) => x.shard)).toEqual([0, 1, 2]);
    expect(info.shards.every((x) => x.servedHere && x.leader?.address === s.advertisedAddress)).toBe(true);
    expect(info.shards.every((x) => x.etag !== "" && x.documentBytes > 0n)).toBe(true);
    expect(info.subscriptions.map((x) => x.subscription)).toEqual(["default"]);

    const updated = await admin.updateQueue({ queue: "orders", config: { maxAttempts: 2 } });
    expect(updated.config?.maxAttempts).toBe(2);
    expect(durationMs(updated.config?.leaseTtl ?? durationFromMs(0))).toBe(5_000);

    for (const name of ["alpha", "beta", "gamma", "delta"]) await admin.createQueue({ queue: name });
    const page1 = await admin.listQueues({ pageSize: 2 });
    expect(page1.queues.map((q) => q.name)).toEqual(["alpha", "beta"]);
    const page2 = await admin.listQueues({ pageSize: 2, pageToken: page1.nextPageToken });
    expect(page2.queues.map((q) => q.name)).toEqual(["delta", "gamma"]);
    const page3 = await admin.listQueues({ pageSize: 2, pageToken: page2.nextPageToken });
    expect(page3.queues.map((q) => q.name)).toEqual(["orders"]);
    expect(page3.nextPageToken).toBe("");
  });

  it("reports statistics per subscription and shard", async () => {
    const s = await server();
    const { admin, queue } = grpcClients(s.address);
    await admin.createQueue({ queue: "stats", shardCount: 2 });
    await admin.createSubscription({ queue: "stats", subscription: "audit" });
    await queue.enqueue({
      queue: "stats",
      messages: [
        { payload: bytes("1") },
        { payload: bytes("2") },
        { payload: bytes("3"), schedule: { case: "delay", value: durationFromMs(60_000) } },
      ],
    });
    const claimed = await queue.claim({ queue: "stats", workerId: "w", maxMessages: 1 });
    expect(claimed.messages).toHaveLength(1);
    const info = await admin.getQueue({ queue: "stats" });
    expect(info.totals).toMatchObject({
      messages: 3n,
      inFlight: 1n,
      ready: 3n,
      delayed: 2n,
      depth: 6n,
      enqueued: 3n,
    });
    const byName = Object.fromEntries(info.subscriptions.map((x) => [x.subscription, x]));
    expect(byName.default).toMatchObject({ ready: 1n, inFlight: 1n, delayed: 1n, depth: 3n });
    expect(byName.default?.counters?.delivered).toBe(1n);
    expect(byName.audit).toMatchObject({ ready: 2n, inFlight: 0n, delayed: 1n });
    expect(info.observedAt).toBeDefined();
  });

  it("creates subscriptions from EARLIEST with a backlog, purges, and deletes them", async () => {
    const s = await server();
    const { admin, queue } = grpcClients(s.address);
    await queue.enqueue({
      queue: "fan",
      messages: [{ payload: bytes("old-1") }, { payload: bytes("old-2") }],
    });
    const sub = await admin.createSubscription({
      queue: "fan",
      subscription: "replay",
      start: SubscriptionStart.EARLIEST,
    });
    expect(sub).toMatchObject({ subscription: "replay", start: SubscriptionStart.EARLIEST, backlog: 2n });
    const latest = await admin.createSubscription({ queue: "fan", subscription: "live" });
    expect(latest).toMatchObject({ start: SubscriptionStart.LATEST, backlog: 0n });
    const got = await queue.claim({ queue: "fan", subscription: "replay", workerId: "w", maxMessages: 5 });
    expect(got.messages.map((m) => text(m.message?.payload))).toEqual(["old-1", "old-2"]);

    const purged = await admin.purgeQueue({ queue: "fan", subscription: "default" });
    expect(purged.messagesPurged).toBe(2n);
    expect((await queue.claim({ queue: "fan", workerId: "w" })).messages).toEqual([]);
    const dropped = await admin.deleteSubscription({ queue: "fan", subscription: "replay" });
    expect(dropped.leasesDropped).toBe(2n);
    expect(await codeOf(queue.claim({ queue: "fan", subscription: "replay", workerId: "w" }))).toBe(
      "NotFound",
    );
  });

  it("lists dead letters page by page across shards and redrives them", async () => {
    const s = await server();
    const { admin, queue } = grpcClients(s.address);
    await admin.createQueue({ queue: "dlq", shardCount: 2 });
    await queue.enqueue({
      queue: "dlq",
      messages: Array.from({ length: 5 }, (_, i) => ({ payload: bytes(`job-${i}`) })),
    });
    const claimed = await queue.claim({ queue: "dlq", workerId: "w", maxMessages: 5 });
    await queue.nack({
      queue: "dlq",
      receipts: claimed.messages.map((m) => m.receipt),
      deadLetter: true,
      reason: "poison",
    });
    const seen: string[] = [];
    let pageToken = "";
    let pages = 0;
    do {
      const page = await admin.listDeadLetters({ queue: "dlq", pageSize: 2, pageToken });
      expect(page.deadLetters.length).toBeLessThanOrEqual(2);
      for (const dl of page.deadLetters) {
        expect(dl.reason).toBe("poison");
        expect(dl.attempts).toBe(1);
        seen.push(text(dl.message?.payload));
      }
      pageToken = page.nextPageToken;
      pages += 1;
    } while (pageToken !== "" && pages < 10);
    expect(seen.sort()).toEqual(["job-0", "job-1", "job-2", "job-3", "job-4"]);
    expect(await codeOf(admin.listDeadLetters({ queue: "dlq", subscription: "ghost" }))).toBe("NotFound");

    const firstTwo = (await admin.listDeadLetters({ queue: "dlq", pageSize: 2 })).deadLetters.map(
      (d) => d.message?.id ?? "",
    );
    const byIds = await admin.redriveDeadLetters({
      queue: "dlq",
      ids: [...firstTwo, "01ARZ3NDEKTSV4RRFFQ69G5FAV"],
    });
    expect(byIds.redriven).toBe(2n);
    expect(byIds.missingIds).toEqual(["01ARZ3NDEKTSV4RRFFQ69G5FAV"]);
    const limited = await admin.redriveDeadLetters({ queue: "dlq", limit: 1 });
    expect(limited.redriven).toBe(1n);
    const rest = await admin.redriveDeadLetters({ queue: "dlq", all: true });
    expect(rest.redriven).toBe(2n);
    const again = await queue.claim({ queue: "dlq", workerId: "w", maxMessages: 10 });
    expect(again.messages).toHaveLength(5);
    expect(again.messages.every((m) => m.attempt === 2)).toBe(true);
  });

  it("streams a shard document in chunks of at most 1 MiB, exactly as stored", async () => {
    const inner = new MemoryStore();
    // A tail budget above the payloads keeps them in the head, so the head itself is over 1 MiB.
    const s = await server({ store: sharedStore(inner), commit: { tailBytes: 4 * 1024 * 1024 } });
    const { admin, queue } = grpcClients(s.address);
    await queue.enqueue({
      queue: "big",
      messages: [
        { payload: new Uint8Array(700_000).fill(65) },
        { payload: new Uint8Array(700_000).fill(66) },
      ],
    });
    const chunks = [];
    for await (const chunk of admin.getDocument({ queue: "big", shard: 0 })) chunks.push(chunk);
    expect(chunks.length).toBeGreaterThan(1);
    expect(chunks.every((c) => c.chunk.byteLength <= 1024 * 1024)).toBe(true);
    const stored = await inner.get("queues/big/0.json");
    expect(chunks[0]?.etag).toBe(stored?.etag);
    expect(chunks[0]?.totalBytes).toBe(BigInt(stored?.body.byteLength ?? 0));
    const whole = Buffer.concat(chunks.map((c) => c.chunk));
    expect(whole.equals(Buffer.from(stored?.body ?? new Uint8Array()))).toBe(true);
    expect(ShardState.decode(whole).nextOffset).toBe(2);
  });

  it("deletes a queue (shard documents, then the manifest) and can create it again", async () => {
    const inner = new MemoryStore();
    const s = await server({ store: sharedStore(inner) });
    const { admin, queue } = grpcClients(s.address);
    await admin.createQueue({ queue: "temp", shardCount: 2 });
    await queue.enqueue({ queue: "temp", messages: [{ payload: bytes("bye") }] });
    expect(await codeOf(admin.deleteQueue({ queue: "temp" }))).toBe("FailedPrecondition");
    await admin.purgeQueue({ queue: "temp", allSubscriptions: true });
    await admin.deleteQueue({ queue: "temp" });
    expect((await inner.list("queues/temp/")).map((e) => e.key)).toEqual([]);
    expect(await codeOf(queue.enqueue({ queue: "temp", messages: [{}] }))).toBe("OK"); // auto-created anew
    const fresh = await admin.getQueue({ queue: "temp" });
    expect(fresh.shardCount).toBe(1);
    expect(fresh.totals?.messages).toBe(1n);
    // The idle leaders of the deleted shards wrote nothing after the delete.
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect((await inner.list("queues/temp/")).map((e) => e.key)).toEqual([
      "queues/temp/0.json",
      "queues/temp/queue.json",
    ]);
  });

  it("deletes a queue whose shard has sealed dead letters, dead-letter segments included", async () => {
    const inner = new MemoryStore();
    const s = await server({ store: sharedStore(inner), commit: { tailBytes: 1024 } });
    const { admin, queue } = grpcClients(s.address);
    await admin.createQueue({ queue: "dl", shardCount: 1 });
    for (let i = 0; i < 4; i++) {
      await queue.enqueue({
        queue: "dl",
        messages: Array.from({ length: 5 }, (_, k) => ({ payload: bytes(`m${i}-${k}-${"x".repeat(200)}`) })),
      });
      const claimed = await queue.claim({ queue: "dl", workerId: "w", maxMessages: 5 });
      await queue.nack({ queue: "dl", receipts: claimed.messages.map((m) => m.receipt), deadLetter: true });
    }
    const sealed = (await inner.list("queues/dl/0/seg/")).filter((e) => e.key.endsWith(".dead.json"));
    expect(sealed.length).toBeGreaterThan(1);
    const listed = await admin.listDeadLetters({ queue: "dl", pageSize: 7 });
    expect(listed.deadLetters).toHaveLength(7);
    expect(listed.nextPageToken).not.toBe("");
    expect(await codeOf(admin.deleteQueue({ queue: "dl" }))).toBe("FailedPrecondition"); // dead letters count
    await admin.deleteQueue({ queue: "dl", force: true });
    expect((await inner.list("queues/dl/")).map((e) => e.key)).toEqual([]);
  });

  it("completes an interrupted CreateQueue with the same shard count and config", async () => {
    const inner = new MemoryStore();
    const s = await server({ store: sharedStore(inner) });
    const { admin, queue } = grpcClients(s.address);
    await inner.put(
      "queues/half/queue.json",
      encodeManifest({
        queue: "half",
        shardCount: 2,
        createdAt: Date.now(),
        state: "creating",
        config: DEFAULT_QUEUE_CONFIG,
      }),
      { ifAbsent: true },
    );
    expect(await codeOf(queue.enqueue({ queue: "half", messages: [{}] }))).toBe("NotFound");
    expect(await codeOf(admin.createQueue({ queue: "half", shardCount: 3 }))).toBe("AlreadyExists");
    const done = await admin.createQueue({ queue: "half", shardCount: 2 });
    expect(done.shardCount).toBe(2);
    expect(await codeOf(queue.enqueue({ queue: "half", messages: [{}] }))).toBe("OK");
    expect(await codeOf(admin.createQueue({ queue: "half", shardCount: 2 }))).toBe("AlreadyExists");
  });
});
