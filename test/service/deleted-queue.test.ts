/**
 * A deleted queue stays deleted, over real gRPC on loopback with brokers on
 * one shared store: a broker whose cached manifest still says `ready` does
 * not recreate the shard document of a queue deleted through another broker
 * (it answers NOT_FOUND and writes nothing), and a shard document that
 * belongs to no manifest is never adopted by a new queue of the same name
 * (FAILED_PRECONDITION naming it). The legitimate ways of creating a shard
 * document keep working: a half-finished auto-creation or CreateQueue
 * completed later, two brokers auto-creating the same queues at once, a
 * DeleteQueue resumed after part of its shards are gone.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { encodeManifest, manifestKey } from "../../server/src/broker/queue-catalog.ts";
import { DEFAULT_QUEUE_CONFIG } from "../../server/src/model/queue-config.ts";
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

/** Rewrites the state of a stored manifest (what an interrupted create or delete leaves behind). */
async function setManifestState(store: MemoryStore, queue: string, state: string): Promise<void> {
  const stored = await store.get(manifestKey(queue));
  if (!stored) throw new Error(`no manifest for ${queue}`);
  const body = text(stored.body).replace(/"state":"[a-z]+"/, `"state":"${state}"`);
  await store.put(manifestKey(queue), bytes(body), { ifMatch: stored.etag });
}

// A long catalog refresh, so that a broker's cached manifest stays as it was read.
const STALE = { catalogRefreshMs: 600_000 };

describe("a deleted queue", () => {
  it("is not brought back by a broker whose cached manifest still says ready", async () => {
    const inner = new MemoryStore();
    const a = await server({ store: sharedStore(inner), ...STALE });
    const b = await server({ store: sharedStore(inner), ...STALE });
    const viaA = grpcClients(a.address);
    const viaB = grpcClients(b.address);
    await viaA.admin.createQueue({ queue: "q" });
    await viaA.admin.createSubscription({ queue: "q", subscription: "audit" });
    await viaA.queue.enqueue({ queue: "q", messages: [{ payload: bytes("old") }] });
    // B reads (and caches) the ready manifest.
    expect((await viaB.admin.getQueue({ queue: "q" })).shardCount).toBe(1);

    await viaA.admin.deleteQueue({ queue: "q", force: true });
    const stale = await outcome(viaB.queue.enqueue({ queue: "q", messages: [{ payload: bytes("stale") }] }));
    expect(stale.code, stale.message).toBe("NotFound");
    expect(stale.message).toMatch(/queue q does not exist/);
    expect(await inner.get("queues/q/0.json")).toBeUndefined();
    expect(await inner.get(manifestKey("q"))).toBeUndefined();

    // A new queue of the same name starts empty, with the default subscription only.
    const fresh = await viaA.queue.enqueue({ queue: "q", messages: [{ payload: bytes("new") }] });
    expect(fresh.queueCreated).toBe(true);
    expect(fresh.messages[0]?.offset).toBe(0n);
    const status = await viaA.admin.getQueue({ queue: "q" });
    expect(status.totals?.messages).toBe(1n);
    expect(status.subscriptions.map((s) => s.subscription)).toEqual(["default"]);
  });

  it("is not written to while its deletion is under way (manifest deleting, shard document gone)", async () => {
    const inner = new MemoryStore();
    const s = await server({ store: sharedStore(inner), ...STALE });
    const { admin, queue } = grpcClients(s.address);
    await admin.createQueue({ queue: "going" });
    await queue.enqueue({ queue: "going", messages: [{ payload: bytes("x") }] });
    // Another broker is half-way through DeleteQueue: manifest deleting, shard document deleted.
    const other = await server({ store: sharedStore(inner), ...STALE });
    await setManifestState(inner, "going", "deleting");
    await inner.delete("queues/going/0.json");
    for (const address of [s.address, other.address]) {
      const late = await outcome(
        grpcClients(address).queue.enqueue({ queue: "going", messages: [{ payload: bytes("y") }] }),
      );
      expect(late.code, late.message).toBe("NotFound");
      expect(await inner.get("queues/going/0.json")).toBeUndefined();
    }
    // Resending DeleteQueue finishes the deletion although the shard document is gone already.
    await admin.deleteQueue({ queue: "going" });
    expect(await inner.get(manifestKey("going"))).toBeUndefined();
  });
});

describe("a shard document that belongs to no queue", () => {
  it("is refused, not adopted, by Enqueue's auto-creation and by CreateQueue", async () => {
    const inner = new MemoryStore();
    const s = await server({ store: sharedStore(inner) });
    const { queue } = grpcClients(s.address);
    await queue.enqueue({ queue: "orphan", messages: [{ payload: bytes("old") }] });
    // What an older casq left behind: the manifest gone, the shard document still there.
    await s.close({ graceful: true });
    await inner.delete(manifestKey("orphan"));
    const stray = await inner.get("queues/orphan/0.json");
    const next = await server({ store: sharedStore(inner) });
    const c = grpcClients(next.address);

    for (const call of [
      c.queue.enqueue({ queue: "orphan", messages: [{ payload: bytes("new") }] }),
      c.admin.createQueue({ queue: "orphan" }),
    ]) {
      const refused = await outcome(call);
      expect(refused.code, refused.message).toBe("FailedPrecondition");
      expect(refused.message).toMatch(/queues\/orphan\/0\.json already exists but belongs to no queue/);
      expect(refused.message).toMatch(/not adopted/);
      expect(await inner.get(manifestKey("orphan"))).toBeUndefined();
      expect((await inner.get("queues/orphan/0.json"))?.etag).toBe(stray?.etag);
    }
    // Once the operator removed it, the name is free again.
    await inner.delete("queues/orphan/0.json");
    const made = await c.queue.enqueue({ queue: "orphan", messages: [{ payload: bytes("new") }] });
    expect(made.queueCreated).toBe(true);
    expect((await c.admin.getQueue({ queue: "orphan" })).totals?.messages).toBe(1n);
  });
});

describe("shard documents are still created", () => {
  it("by the Enqueue that completes an auto-creation interrupted after its shard document", async () => {
    const inner = new MemoryStore();
    const s = await server({ store: sharedStore(inner) });
    await grpcClients(s.address).admin.createQueue({ queue: "half" });
    await s.close({ graceful: true });
    // The manifest is back to creating; its (empty) shard document exists.
    await setManifestState(inner, "half", "creating");
    const fresh = await server({ store: sharedStore(inner) });
    const c = grpcClients(fresh.address);
    const done = await c.queue.enqueue({ queue: "half", messages: [{ payload: bytes("1") }] });
    expect(done.messages).toHaveLength(1);
    expect(text((await inner.get(manifestKey("half")))?.body)).toMatch(/"state":"ready"/);
  });

  it("by a resent CreateQueue whose first attempt created some of the shard documents", async () => {
    const inner = new MemoryStore();
    const s = await server({ store: sharedStore(inner) });
    await grpcClients(s.address).admin.createQueue({ queue: "two", shardCount: 2 });
    await s.close({ graceful: true });
    await setManifestState(inner, "two", "creating");
    await inner.delete("queues/two/1.json");
    const again = await server({ store: sharedStore(inner) });
    const c = grpcClients(again.address);
    const created = await c.admin.createQueue({ queue: "two", shardCount: 2 });
    expect(created.created).toBe(true);
    expect(await inner.get("queues/two/0.json")).toBeDefined();
    expect(await inner.get("queues/two/1.json")).toBeDefined();
    const sent = await c.queue.enqueue({
      queue: "two",
      messages: Array.from({ length: 4 }, (_, i) => ({ payload: bytes(`m${i}`) })),
    });
    expect(sent.messages).toHaveLength(4);
  });

  it("by two brokers auto-creating the same queues at once", async () => {
    const inner = new MemoryStore();
    const a = await server({ store: sharedStore(inner) });
    const b = await server({ store: sharedStore(inner) });
    const names = Array.from({ length: 8 }, (_, i) => `race-${i}`);
    const results = await Promise.all(
      names.flatMap((name) =>
        [a, b].map((s) =>
          outcome(
            grpcClients(s.address).queue.enqueue({ queue: name, messages: [{ payload: bytes(name) }] }),
          ),
        ),
      ),
    );
    // Each call lands, or is redirected to the broker that leads the new shard: never refused.
    for (const r of results) expect(["OK", "Unavailable"], r.message).toContain(r.code);
    for (const r of results) expect(r.message).not.toMatch(/belongs to no queue|does not exist/);
    for (const name of names) {
      expect(text((await inner.get(manifestKey(name)))?.body)).toMatch(/"state":"ready"/);
      expect(await inner.get(`queues/${name}/0.json`)).toBeDefined();
    }
  });

  it("for a queue whose manifest an older casq wrote ready at once (Enqueue's auto-creation before 'creating')", async () => {
    const inner = new MemoryStore();
    // Older casq auto-created a queue by writing its manifest `ready`, then its shard document.
    const s = await server({ store: sharedStore(inner) });
    await grpcClients(s.address).queue.enqueue({ queue: "legacy", messages: [{ payload: bytes("1") }] });
    await s.close({ graceful: true });
    const fields = { queue: "legacy", shardCount: 1, createdAt: 1, state: "ready" as const };
    const old = await inner.get(manifestKey("legacy"));
    await inner.put(manifestKey("legacy"), encodeManifest({ ...fields, config: DEFAULT_QUEUE_CONFIG }), {
      ifMatch: old?.etag ?? "",
    });
    const next = await server({ store: sharedStore(inner) });
    const c = grpcClients(next.address);
    const sent = await c.queue.enqueue({ queue: "legacy", messages: [{ payload: bytes("2") }] });
    expect(sent.messages[0]?.offset).toBe(1n);
    expect((await c.admin.getQueue({ queue: "legacy" })).totals?.messages).toBe(2n);
  });
});
