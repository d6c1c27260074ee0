import { describe, expect, it } from "vitest";
import { flush, makeBroker } from "../../testing/broker-test-support.ts";
import { ManualClock } from "../../testing/manual-clock.ts";
import { ShardState } from "../model/shard-state.ts";
import { MemoryStore } from "../store/memory-store.ts";
import { type EnqueueInput, expectKind, withMessageId } from "./broker.ts";
import { shardForKey } from "./shard-routing.ts";

const bytes = (text: string) => new TextEncoder().encode(text);

describe("Broker", () => {
  it("enqueues, claims, acks and the state survives in the store for the next broker", async () => {
    const store = new MemoryStore();
    const a = makeBroker(store, "a");
    const [out] = await a.enqueue("mail", [{ payload: bytes("hello"), headers: { to: "x" } }]);
    expect(out?.id).toMatch(/^[0-9A-Z]{26}$/);
    const [delivery] = await a.claim("mail", { subscription: "default", workerId: "w1", max: 10 });
    expect(new TextDecoder().decode(delivery?.message.payload)).toBe("hello");
    expect(delivery?.message.attempt).toBe(1);
    if (!delivery) throw new Error("nothing claimed");
    const acks = await a.ack("mail", "default", [{ shard: delivery.shard, ...delivery.message.receipt }]);
    expect(acks.flatMap((part) => expectKind(part.result, "ack").results.map((r) => r.outcome))).toEqual([
      "acked",
    ]);
    await a.stop({ release: true });

    const b = makeBroker(store, "b");
    expect(await b.claim("mail", { subscription: "default", workerId: "w2", max: 10 })).toEqual([]);
    const stored = await store.get("queues/mail/0.json");
    const doc = ShardState.decode(stored?.body ?? new Uint8Array());
    expect(doc.nextOffset).toBe(1);
    await b.stop({ release: true });
  });

  it("routes keyed messages to a stable shard and spreads unkeyed requests round-robin, each on one shard", async () => {
    const store = new MemoryStore();
    const broker = makeBroker(store, "a", { shardsFor: () => 4 });
    const keyed = await broker.enqueue("orders", [
      { payload: bytes("1"), key: "customer-7" },
      { payload: bytes("2"), key: "customer-7" },
    ]);
    expect(keyed.map((o) => o.shard)).toEqual([shardForKey("customer-7", 4), shardForKey("customer-7", 4)]);
    expect(keyed[1]?.offset).toBe((keyed[0]?.offset ?? 0) + 1);
    const spread: number[] = [];
    for (let r = 0; r < 4; r++) {
      const request = await broker.enqueue(
        "orders",
        Array.from({ length: 3 }, (_, i) => ({ payload: bytes(`${r}.${i}`) })),
      );
      // A request's messages without key or dedup id share one shard, at consecutive offsets.
      expect(new Set(request.map((o) => o.shard)).size).toBe(1);
      expect(request.map((o) => o.offset - (request[0]?.offset ?? 0))).toEqual([0, 1, 2]);
      spread.push(request[0]?.shard ?? -1);
    }
    expect(new Set(spread).size).toBe(4);
    // Keyed messages and ones with a dedup id keep their own shard in such a request.
    const mixed = await broker.enqueue("orders", [
      { payload: bytes("a") },
      { payload: bytes("b"), key: "customer-7" },
      { payload: bytes("c") },
    ]);
    expect(mixed[1]?.shard).toBe(shardForKey("customer-7", 4));
    expect(mixed[2]?.shard).toBe(mixed[0]?.shard);
    const claimed = await broker.claim("orders", { subscription: "default", workerId: "w", max: 100 });
    expect(claimed).toHaveLength(17);
    await broker.stop({ release: true });
  });

  it("names a rejected message by its place in the request, though its shard got only part of it, and stores none of it", async () => {
    const broker = makeBroker(new MemoryStore(), "a", {
      shardsFor: () => 2,
      initialConfig: { maxPayloadBytes: 4 },
    });
    const keyFor = (shard: number) =>
      ["k0", "k1", "k2", "k3", "k4", "k5"].find((k) => shardForKey(k, 2) === shard) as string;
    const rejected = broker.enqueue("orders", [
      { payload: bytes("ok"), key: keyFor(0) },
      { payload: bytes("ok"), key: keyFor(0) },
      { payload: bytes("too long"), key: keyFor(1) }, // the first of shard 1's part
    ]);
    await expect(rejected).rejects.toMatchObject({
      code: "resource_exhausted",
      message: expect.stringMatching(/^message 2: payload/),
    });
    // Shard 0's part was refused with it: nothing of the request is stored.
    for (const shard of [0, 1]) {
      const claimed = await broker.claim("orders", { subscription: "default", workerId: "w", max: 3 });
      expect(claimed, `shard ${shard}`).toEqual([]);
    }
    await broker.stop({ release: true });
  });

  it("bounds a request by max_batch as a whole, though no shard's part is over it, and stores none of it", async () => {
    const broker = makeBroker(new MemoryStore(), "a", { shardsFor: () => 2, initialConfig: { maxBatch: 3 } });
    const keys = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];
    const onShard = (shard: number) => keys.filter((k) => shardForKey(k, 2) === shard).slice(0, 2);
    // Two messages for each shard: 4 in the request, over max_batch 3, each part within it.
    const messages = [...onShard(0), ...onShard(1)].map((key) => ({ payload: bytes("x"), key }));
    expect(messages).toHaveLength(4);
    await expect(broker.enqueue("orders", messages)).rejects.toMatchObject({
      code: "resource_exhausted",
      message: expect.stringMatching(/^batch of 4 messages exceeds the queue's max_batch of 3/),
    });
    for (const shard of [0, 1]) {
      const claimed = await broker.claim("orders", { subscription: "default", workerId: "w", max: 3 });
      expect(claimed, `shard ${shard}`).toEqual([]);
    }
    // Within the limit it is stored, split over both shards.
    const stored = await broker.enqueue("orders", messages.slice(1));
    expect(new Set(stored.map((o) => o.shard))).toEqual(new Set([0, 1]));
    await broker.stop({ release: true });
  });

  it("wakes a long-poll claim as soon as a message is committed", async () => {
    const broker = makeBroker(new MemoryStore(), "a");
    await broker.claim("q", { subscription: "default", workerId: "w", max: 1 });
    const waiting = broker.claim("q", { subscription: "default", workerId: "w", max: 1, waitMs: 30_000 });
    await flush();
    await broker.enqueue("q", [{ payload: bytes("now") }]);
    const got = await waiting;
    expect(got).toHaveLength(1);
    await broker.stop({ release: true });
  });

  it("wakes a long-poll claim when a delayed message becomes runnable", async () => {
    const clock = new ManualClock();
    const broker = makeBroker(new MemoryStore(), "a", { clock });
    await broker.enqueue("q", [{ payload: bytes("later"), delayMs: 5_000 }]);
    let result: unknown;
    const waiting = broker
      .claim("q", { subscription: "default", workerId: "w", max: 1, waitMs: 20_000 })
      .then((r) => {
        result = r;
      });
    await clock.runUntil(clock.now() + 4_000);
    expect(result).toBeUndefined();
    await clock.runUntil(clock.now() + 1_500);
    for (let i = 0; i < 5; i++) await flush();
    await waiting;
    expect(result).toHaveLength(1);
    await broker.stop({ release: true });
  });

  it("returns an empty claim when the wait runs out", async () => {
    const clock = new ManualClock();
    const broker = makeBroker(new MemoryStore(), "a", { clock });
    const waiting = broker.claim("q", { subscription: "default", workerId: "w", max: 1, waitMs: 1_000 });
    await clock.runUntil(clock.now() + 1_001);
    expect(await waiting).toEqual([]);
    await broker.stop({ release: true });
  });

  it("rejects bad names with invalid_argument", async () => {
    const broker = makeBroker(new MemoryStore(), "a");
    await expect(broker.enqueue("Bad Name", [{ payload: bytes("x") }])).rejects.toMatchObject({
      code: "invalid_argument",
    });
    await expect(broker.claim("ok", { subscription: "../x", workerId: "w", max: 1 })).rejects.toMatchObject({
      code: "invalid_argument",
    });
    await broker.stop({ release: true });
  });
});

describe("withMessageId", () => {
  it("copies every field of the input and adds the id", () => {
    const input: Required<EnqueueInput> = {
      payload: new Uint8Array([1, 2]),
      headers: { a: "1" },
      key: "k",
      priority: 3,
      runAt: 4,
      delayMs: 5,
      maxAttempts: 6,
      dedupId: "d",
      traceContext: { traceparent: "t" },
    };
    expect(withMessageId(input, "id-1")).toStrictEqual({ ...input, id: "id-1" });
  });

  it("gives inputs with different fields one shape: unset fields are present as undefined", () => {
    const a = withMessageId({ payload: new Uint8Array(0) }, "a");
    const b = withMessageId({ payload: new Uint8Array(0), dedupId: "x", key: "k" }, "b");
    expect(Object.keys(a)).toEqual(Object.keys(b));
    expect(a.dedupId).toBeUndefined();
  });
});
