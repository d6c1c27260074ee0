/**
 * What a broker does with a shard whose document is missing, by the state of
 * the queue's manifest (the default `documentExpected`): created while
 * `creating`, refused with `data_loss` while `ready`, `not_found` with nothing
 * written when there is no manifest or it is `deleting`. A refusal for a
 * missing document is repeated for a second without store reads.
 */
import { describe, expect, it } from "vitest";
import { makeBroker } from "../../testing/broker-test-support.ts";
import { ManualClock } from "../../testing/manual-clock.ts";
import { DEFAULT_QUEUE_CONFIG } from "../model/queue-config.ts";
import { ShardState } from "../model/shard-state.ts";
import { MemoryStore } from "../store/memory-store.ts";
import type { ObjectStore } from "../store/object-store.ts";
import { encodeManifest, manifestKey, type QueueState } from "./queue-catalog.ts";
import { MISSING_HEAD_RECHECK_MS } from "./shard-head-store.ts";

const bytes = (text: string) => new TextEncoder().encode(text);

/** A store that counts GETs by key. */
function countingStore(inner: ObjectStore): { store: ObjectStore; gets: Map<string, number> } {
  const gets = new Map<string, number>();
  const store: ObjectStore = {
    description: inner.description,
    get: (key, options) => {
      gets.set(key, (gets.get(key) ?? 0) + 1);
      return inner.get(key, options);
    },
    put: (key, body, condition, options) => inner.put(key, body, condition, options),
    delete: (key, options) => inner.delete(key, options),
    list: (prefix, options) => inner.list(prefix, options),
    close: () => inner.close(),
  };
  return { store, gets };
}

async function writeManifest(store: ObjectStore, queue: string, state: QueueState): Promise<void> {
  const fields = { queue, shardCount: 1, createdAt: 0, state, config: DEFAULT_QUEUE_CONFIG };
  await store.put(manifestKey(queue), encodeManifest(fields), { ifAbsent: true });
}

/** A broker that decides by the manifests in the store (the server's default; makeBroker runs without). */
function makeBrokerWithManifests(store: ObjectStore, clock: ManualClock) {
  return makeBroker(store, "a", { clock, documentExpected: undefined });
}

describe("a missing shard document", () => {
  it("is created only while the queue's manifest is creating", async () => {
    const memory = new MemoryStore();
    const broker = makeBrokerWithManifests(memory, new ManualClock());
    await writeManifest(memory, "new", "creating");
    await expect(broker.enqueue("new", [{ payload: bytes("1") }])).resolves.toHaveLength(1);
    expect(await memory.get("queues/new/0.json")).toBeDefined();
  });

  it.each(["absent", "deleting"] as const)(
    "is not_found and not written when the manifest is %s",
    async (state) => {
      const memory = new MemoryStore();
      const broker = makeBrokerWithManifests(memory, new ManualClock());
      if (state === "deleting") await writeManifest(memory, "gone", "deleting");
      await expect(broker.enqueue("gone", [{ payload: bytes("1") }])).rejects.toMatchObject({
        code: "not_found",
        message: expect.stringMatching(/queue gone does not exist/),
      });
      expect(await memory.get("queues/gone/0.json")).toBeUndefined();
    },
  );

  it("under a ready manifest is refused with data_loss, without re-reading the store for a second", async () => {
    const memory = new MemoryStore();
    const { store, gets } = countingStore(memory);
    const clock = new ManualClock();
    const broker = makeBrokerWithManifests(store, clock);
    await writeManifest(memory, "lost", "ready");
    const reads = () => (gets.get("queues/lost/0.json") ?? 0) + (gets.get(manifestKey("lost")) ?? 0);
    for (let i = 0; i < 5; i++)
      await expect(broker.enqueue("lost", [{ payload: bytes("x") }])).rejects.toMatchObject({
        code: "data_loss",
      });
    expect(reads()).toBe(2); // one document GET, one manifest GET
    clock.advance(MISSING_HEAD_RECHECK_MS);
    await expect(broker.enqueue("lost", [{ payload: bytes("x") }])).rejects.toMatchObject({
      code: "data_loss",
    });
    expect(reads()).toBe(4);
    // A restored document is used once the refusal is re-checked.
    const restored = ShardState.create({ queue: "lost", shard: 0, config: DEFAULT_QUEUE_CONFIG, now: 0 });
    await memory.put("queues/lost/0.json", restored.encode(), { ifAbsent: true });
    clock.advance(MISSING_HEAD_RECHECK_MS);
    await expect(broker.enqueue("lost", [{ payload: bytes("y") }])).resolves.toHaveLength(1);
  });
});
