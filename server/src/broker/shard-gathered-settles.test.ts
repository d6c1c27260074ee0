/**
 * Gathering settles after a slow write: a write of at least 20 ms (on the
 * injected clock) that handed out jobs makes the next batch wait for their
 * acks and nacks (90% of them) or half the write's latency (at most 50 ms),
 * so that they ride in one write instead of the first one starting a write
 * of its own and the rest trailing into the next; settles that came in then
 * wait a tenth of the write more for the claim the workers' returned credit
 * makes. A fast write never waits.
 */
import { describe, expect, it } from "vitest";
import { makeShardLeader } from "../../testing/broker-test-support.ts";
import { ManualClock } from "../../testing/manual-clock.ts";
import { ack, settle, shardWithClaims, TimedStore } from "../../testing/timed-settles-support.ts";
import type { Receipt } from "../model/operations.ts";
import { expectKind } from "./operation-effects.ts";

const payload = (text: string) => new TextEncoder().encode(text);

describe("ShardLeader gathering settles after a slow write", () => {
  it("waits for the acks of the jobs a slow write handed out, then writes them (and a claim) in one write", async () => {
    const { store, shard, receipts } = await shardWithClaims(100, 10, 4);
    const puts = store.puts;
    const first = ack(shard, receipts.slice(0, 1));
    const second = ack(shard, receipts.slice(1, 3));
    const next = shard.submit({ kind: "claim", subscription: "default", workerId: "w", max: 4 });
    await settle();
    // 3 of 4 settles are in (under 90%): nothing is written yet.
    expect(store.puts).toBe(puts);
    const last = ack(shard, receipts.slice(3));
    const results = await Promise.all([first, second, last]);
    for (const result of results) expect(result.kind).toBe("ack");
    expect(expectKind(await next, "claim").messages).toHaveLength(4);
    expect(store.puts).toBe(puts + 1);
  });

  it("writes when half the slow write's latency has passed, settles or not", async () => {
    const { clock, store, shard, receipts } = await shardWithClaims(60, 10, 4);
    const puts = store.puts;
    let acked = false;
    const first = ack(shard, receipts.slice(0, 1)).then((result) => {
      acked = true;
      return result;
    });
    await settle();
    clock.advance(29);
    await settle();
    expect(store.puts).toBe(puts);
    expect(acked).toBe(false);
    clock.advance(1);
    expect((await first).kind).toBe("ack");
    expect(store.puts).toBe(puts + 1);
  });

  it("waits at most 50 ms after a very slow write", async () => {
    const { clock, store, shard, receipts } = await shardWithClaims(400, 10, 4);
    const puts = store.puts;
    const first = ack(shard, receipts.slice(0, 1));
    await settle();
    clock.advance(49);
    await settle();
    expect(store.puts).toBe(puts);
    clock.advance(1);
    expect((await first).kind).toBe("ack");
    expect(store.puts).toBe(puts + 1);
  });

  it("once the settles came in, holds them a tenth of the write for the claim the returned credit makes", async () => {
    const { clock, store, shard, receipts } = await shardWithClaims(100, 10, 4);
    const puts = store.puts;
    const acked = ack(shard, receipts);
    await settle();
    clock.advance(9); // the hold is 10 ms (a tenth of the 100 ms write)
    await settle();
    expect(store.puts).toBe(puts);
    // The worker's credit comes in after its acks: its claim ends the hold and rides in the write.
    const claimed = shard.submit({ kind: "claim", subscription: "default", workerId: "w", max: 3 });
    expect((await acked).kind).toBe("ack");
    expect(expectKind(await claimed, "claim").messages).toHaveLength(3);
    expect(store.puts).toBe(puts + 1);
  });

  it("writes the gathered settles when no claim comes within the hold", async () => {
    const { clock, store, shard, receipts } = await shardWithClaims(100, 10, 4);
    const puts = store.puts;
    let done = false;
    const acked = ack(shard, receipts).then((result) => {
      done = true;
      return result;
    });
    await settle();
    clock.advance(9);
    await settle();
    expect(done).toBe(false);
    clock.advance(1);
    expect((await acked).kind).toBe("ack");
    expect(store.puts).toBe(puts + 1);
  });

  it("never waits after a fast write", async () => {
    const { store, shard, receipts } = await shardWithClaims(5, 10, 4);
    const puts = store.puts;
    // No clock advance: this write would hang if it waited. (A claim comes along: an ack
    // alone would be held a little for one, see shard-held-settles.test.ts.)
    const acked = ack(shard, receipts.slice(0, 1));
    const claimed = shard.submit({ kind: "claim", subscription: "default", workerId: "w", max: 1 });
    expect((await acked).kind).toBe("ack");
    expect(expectKind(await claimed, "claim").messages).toHaveLength(1);
    expect(store.puts).toBe(puts + 1);
  });

  it("does not wait after a slow write that handed out nothing", async () => {
    const clock = new ManualClock();
    const store = new TimedStore(clock, 100);
    const shard = makeShardLeader(store, "a", { clock });
    await shard.submit({ kind: "enqueue", messages: [{ id: "m0", payload: payload("0") }] });
    expect(
      (await shard.submit({ kind: "enqueue", messages: [{ id: "m1", payload: payload("1") }] })).kind,
    ).toBe("enqueue");
  });

  it("skips the gathering after one that ran out of time (handlers slower than the wait)", async () => {
    const { clock, store, shard, receipts } = await shardWithClaims(60, 10, 4);
    const first = ack(shard, receipts.slice(0, 1));
    await settle();
    clock.advance(30); // the gathering runs out with 1 of 4 settles
    expect((await first).kind).toBe("ack");
    const claimed = expectKind(
      await shard.submit({ kind: "claim", subscription: "default", workerId: "w", max: 2 }),
      "claim",
    );
    expect(claimed.messages).toHaveLength(2);
    const puts = store.puts;
    // No clock advance: this write would hang if it waited for the other settles.
    expect((await ack(shard, [claimed.messages[0]?.receipt as Receipt])).kind).toBe("ack");
    expect(store.puts).toBe(puts + 1);
  });

  it("stops without waiting for the gathering", async () => {
    const { shard, receipts } = await shardWithClaims(100, 10, 4);
    const first = ack(shard, receipts.slice(0, 1));
    await settle();
    await shard.stop({ release: false });
    expect((await first).kind).toBe("ack");
  });
});
