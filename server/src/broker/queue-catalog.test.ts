import { describe, expect, it } from "vitest";
import { ManualClock } from "../../testing/manual-clock.ts";
import { DEFAULT_QUEUE_CONFIG, mergeConfig } from "../model/queue-config.ts";
import { MemoryStore } from "../store/memory-store.ts";
import { decodeManifest, encodeManifest, manifestKey, QueueCatalog } from "./queue-catalog.ts";

const text = (b: Uint8Array | undefined) => new TextDecoder().decode(b);

describe("QueueCatalog", () => {
  it("creates a manifest once: the second creator reads the first one's shard count", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const a = new QueueCatalog({ store, clock });
    const b = new QueueCatalog({ store, clock });
    const [first, second] = await Promise.all([
      a.create("orders", 4, DEFAULT_QUEUE_CONFIG, "ready"),
      b.create("orders", 2, DEFAULT_QUEUE_CONFIG, "ready"),
    ]);
    expect([first.created, second.created].sort()).toEqual([false, true]);
    expect(first.manifest.shardCount).toBe(second.manifest.shardCount);
    expect(b.shardsFor("orders")).toBe(a.shardsFor("orders"));
    expect(JSON.parse(text((await store.get(manifestKey("orders")))?.body))).toMatchObject({
      format: "casq.queue.v1",
      queue: "orders",
      state: "ready",
    });
  });

  it("requires queues in service and auto-creates one-shard queues on demand", async () => {
    const clock = new ManualClock();
    const catalog = new QueueCatalog({ store: new MemoryStore(), clock });
    await expect(catalog.require("missing")).rejects.toMatchObject({ code: "not_found" });
    expect(() => catalog.shardsFor("missing")).toThrow(/does not exist/);
    await expect(catalog.ensure("missing", false)).rejects.toMatchObject({ code: "not_found" });
    const made = await catalog.ensure("auto", true);
    expect(made).toMatchObject({ shardCount: 1, state: "ready" });
    const creating = await catalog.create("half", 2, DEFAULT_QUEUE_CONFIG);
    await expect(catalog.require("half")).rejects.toThrow(/still being created/);
    await expect(catalog.ensure("half", true)).rejects.toMatchObject({ code: "not_found" });
    const ready = await catalog.setState(creating.manifest, "ready");
    expect((await catalog.require("half")).etag).toBe(ready.etag);
  });

  it("notices a queue deleted by another broker once its cached copy is stale", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const here = new QueueCatalog({ store, clock, refreshMs: 1_000 });
    const there = new QueueCatalog({ store, clock, refreshMs: 1_000 });
    await here.create("gone", 1, DEFAULT_QUEUE_CONFIG, "ready");
    await there.require("gone");
    await here.remove(await here.require("gone"));
    expect((await there.require("gone")).queue).toBe("gone"); // still fresh in there's cache
    clock.advance(1_001);
    await there.require("gone"); // stale: served once while it is re-read in the background
    await new Promise((resolve) => setImmediate(resolve));
    await expect(there.require("gone")).rejects.toMatchObject({ code: "not_found" });
  });

  it("lists queues in service, sorted, a page at a time", async () => {
    const clock = new ManualClock();
    const store = new MemoryStore();
    const catalog = new QueueCatalog({ store, clock });
    for (const name of ["c", "a", "d", "b"]) await catalog.create(name, 1, DEFAULT_QUEUE_CONFIG, "ready");
    await catalog.create("b2", 1, DEFAULT_QUEUE_CONFIG, "creating");
    const first = await catalog.list(2);
    expect(first.queues.map((m) => m.queue)).toEqual(["a", "b"]);
    const second = await catalog.list(2, first.nextAfter);
    expect(second.queues.map((m) => m.queue)).toEqual(["c", "d"]);
    expect(second.nextAfter).toBeUndefined();
  });

  it("round-trips manifests and refuses ones it cannot read", () => {
    const config = mergeConfig(DEFAULT_QUEUE_CONFIG, { maxAttempts: 9, backoff: { jitter: 0 } });
    const fields = { queue: "q", shardCount: 3, createdAt: 123, state: "ready" as const, config };
    expect(decodeManifest("q", encodeManifest(fields))).toEqual(fields);
    const bad = (doc: unknown) => new TextEncoder().encode(JSON.stringify(doc));
    expect(() => decodeManifest("q", new TextEncoder().encode("{"))).toThrow(/not UTF-8 JSON/);
    expect(() => decodeManifest("q", bad({ format: "casq.queue.v2" }))).toThrow(/format/);
    const doc = JSON.parse(text(encodeManifest(fields)));
    expect(() => decodeManifest("other", bad(doc))).toThrow(/names queue "q"/);
    expect(() => decodeManifest("q", bad({ ...doc, shard_count: 0 }))).toThrow(/shard_count/);
    try {
      decodeManifest("q", bad({ ...doc, state: "weird" }));
    } catch (error) {
      expect(error).toMatchObject({ code: "data_loss" });
    }
  });
});
