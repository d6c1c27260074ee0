/**
 * Holding settle-only batches after fast writes: when nothing but acks and
 * nacks is buffered, the leader waits (up to 5 ms on the injected clock)
 * for an enqueue or a claim to ride with, instead of spending a write of
 * their own while the next enqueue would wait for it. Claims that find
 * nothing and heartbeats are answered at once meanwhile; settles are still
 * answered only after the write that carries them lands. Writes that take
 * no time (this clock's memory store) and slow writes (the gathering's
 * domain) never hold.
 */
import { describe, expect, it } from "vitest";
import { ack, settle, shardWithClaims } from "../../testing/timed-settles-support.ts";
import { expectKind } from "./operation-effects.ts";
import type { ShardLeader } from "./shard-leader.ts";

const payload = (text: string) => new TextEncoder().encode(text);

function enqueue(shard: ShardLeader, id: string) {
  return shard.submit({ kind: "enqueue", messages: [{ id, payload: payload(id) }] });
}

/** Tracks whether a promise has settled yet. */
function watch<T>(promise: Promise<T>): { readonly done: boolean; readonly promise: Promise<T> } {
  const state = { done: false, promise };
  promise.then(
    () => {
      state.done = true;
    },
    () => {
      state.done = true;
    },
  );
  return state;
}

describe("ShardLeader holding settle-only batches", () => {
  it("holds an ack until an enqueue comes in, then writes both in one write", async () => {
    const { clock, store, shard, receipts } = await shardWithClaims(2, 4, 2);
    const puts = store.puts;
    const acked = watch(ack(shard, receipts.slice(0, 1)));
    await settle();
    clock.advance(3);
    await settle();
    expect(store.puts).toBe(puts);
    expect(acked.done).toBe(false);
    expect((await enqueue(shard, "n1")).kind).toBe("enqueue");
    expect(expectKind(await acked.promise, "ack").results.map((r) => r.outcome)).toEqual(["acked"]);
    expect(store.puts).toBe(puts + 1);
  });

  it("writes a held ack once the hold runs out with nothing else", async () => {
    const { clock, store, shard, receipts } = await shardWithClaims(2, 4, 2);
    const puts = store.puts;
    const acked = watch(ack(shard, receipts.slice(0, 1)));
    await settle();
    clock.advance(4);
    await settle();
    expect(store.puts).toBe(puts);
    clock.advance(1);
    expect(expectKind(await acked.promise, "ack").results.map((r) => r.outcome)).toEqual(["acked"]);
    expect(store.puts).toBe(puts + 1);
  });

  it("answers a claim that finds nothing at once, without a write, and keeps holding the ack", async () => {
    const { clock, store, shard, receipts } = await shardWithClaims(2, 4, 2);
    // Claim the rest: nothing is runnable any more.
    expectKind(
      await shard.submit({ kind: "claim", subscription: "default", workerId: "w", max: 2 }),
      "claim",
    );
    const puts = store.puts;
    const acked = watch(ack(shard, receipts.slice(0, 1)));
    await settle();
    const empty = expectKind(
      await shard.submit({ kind: "claim", subscription: "default", workerId: "w", max: 5 }),
      "claim",
    );
    expect(empty.messages).toHaveLength(0);
    expect(store.puts).toBe(puts);
    expect(acked.done).toBe(false);
    clock.advance(5);
    expect((await acked.promise).kind).toBe("ack");
    expect(store.puts).toBe(puts + 1);
  });

  it("ends the hold for a claim that finds something: the acks ride with it", async () => {
    const { store, shard, receipts } = await shardWithClaims(2, 4, 2);
    const puts = store.puts;
    const acked = ack(shard, receipts);
    await settle();
    // No clock advance: this would hang if the claim waited with the acks.
    const claimed = expectKind(
      await shard.submit({ kind: "claim", subscription: "default", workerId: "w", max: 2 }),
      "claim",
    );
    expect(claimed.messages).toHaveLength(2);
    expect((await acked).kind).toBe("ack");
    expect(store.puts).toBe(puts + 1);
  });

  it("does not hold a release nack (its messages are claimable at once)", async () => {
    const { store, shard, receipts } = await shardWithClaims(2, 4, 2);
    const puts = store.puts;
    const nacked = await shard.submit({
      kind: "nack",
      subscription: "default",
      receipts: receipts.slice(0, 1),
      release: true,
    });
    expect(nacked.kind).toBe("nack");
    expect(store.puts).toBe(puts + 1);
  });

  it("ends the hold when a standing claim has something to take", async () => {
    const { store, shard, receipts } = await shardWithClaims(2, 4, 2);
    const puts = store.puts;
    const acked = ack(shard, receipts.slice(0, 1));
    await settle();
    // Something is runnable and a consumer stands for it: the batch goes at once.
    const delivered = new Promise<number>((resolve) => {
      shard.stand({
        subscription: "default",
        workerId: "s",
        leaseTtlMs: undefined,
        credit: { available: 1 },
        deliver: (messages) => resolve(messages.length),
      });
    });
    expect(await delivered).toBe(1);
    expect((await acked).kind).toBe("ack");
    expect(store.puts).toBe(puts + 1);
  });

  it("never holds when writes take no time", async () => {
    const { store, shard, receipts } = await shardWithClaims(0, 4, 2);
    const puts = store.puts;
    // No clock advance: this would hang if the ack were held.
    expect((await ack(shard, receipts.slice(0, 1))).kind).toBe("ack");
    expect(store.puts).toBe(puts + 1);
  });

  it("writes the held acks when the shard stops", async () => {
    const { store, shard, receipts } = await shardWithClaims(2, 4, 2);
    const puts = store.puts;
    const acked = ack(shard, receipts.slice(0, 1));
    await settle();
    await shard.stop({ release: false });
    expect((await acked).kind).toBe("ack");
    expect(store.puts).toBe(puts + 1);
  });
});
