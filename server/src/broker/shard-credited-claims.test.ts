/**
 * Claims submitted with a consumer's credit (a Work stream's): they claim
 * what the credit holds when their batch is applied, take it from the credit
 * then, and give it back when the write does not count.
 */
import { describe, expect, it } from "vitest";
import { flush, GatedStore, makeBroker } from "../../testing/broker-test-support.ts";
import { FaultInjectingStore } from "../../testing/fault-injecting-store.ts";
import { ManualClock } from "../../testing/manual-clock.ts";
import { ShardState } from "../model/shard-state.ts";
import { MemoryStore } from "../store/memory-store.ts";
import type { CallOptions, ObjectStore, PutCondition } from "../store/object-store.ts";
import { AmbiguousWriteError } from "../store/store-errors.ts";
import { seededRandom } from "../util/random.ts";
import { expectKind } from "./operation-effects.ts";
import { type ClaimCredit, ShardLeader } from "./shard-leader.ts";
import { shardForKey } from "./shard-routing.ts";

const payload = (text: string) => new TextEncoder().encode(text);

function leader(store: ObjectStore): ShardLeader {
  return new ShardLeader({
    store,
    queue: "jobs",
    shard: 0,
    identity: { id: "broker-a", address: "a:50051" },
    clock: new ManualClock(),
    random: seededRandom(1),
  });
}

async function enqueue(shard: ShardLeader, n: number): Promise<void> {
  await shard.submit({
    kind: "enqueue",
    messages: Array.from({ length: n }, (_, i) => ({ id: `m${i}`, payload: payload(String(i)) })),
  });
}

function claim(shard: ShardLeader, credit: ClaimCredit) {
  return shard.submit(
    { kind: "claim", subscription: "default", workerId: "w", max: credit.available },
    { credit },
  );
}

/** Stands a claim of worker `w` on `default` with `credit`; the ids it is sent gather in `delivered`. */
function standFor(shard: ShardLeader, credit: ClaimCredit): { delivered: string[]; withdraw: () => void } {
  const delivered: string[] = [];
  const withdraw = shard.stand({
    subscription: "default",
    workerId: "w",
    leaseTtlMs: undefined,
    credit,
    deliver: (messages) => delivered.push(...messages.map((m) => m.id)),
  });
  return { delivered, withdraw };
}

/** Starts a write and waits until the store holds it (later submits wait for the next batch). */
async function writeInFlight(store: GatedStore, shard: ShardLeader): Promise<{ done: Promise<unknown> }> {
  store.hold = true;
  const inFlight = shard.submit({ kind: "enqueue", messages: [{ id: "x", payload: payload("x") }] });
  for (let i = 0; i < 20 && store.held === 0; i++) await flush();
  expect(store.held).toBe(1);
  return { done: inFlight };
}

/** Lets held writes through until `done` settles. */
async function releaseUntil<T>(store: GatedStore, done: Promise<T>): Promise<T> {
  let settled = false;
  done.then(
    () => {
      settled = true;
    },
    () => {
      settled = true;
    },
  );
  store.hold = false;
  for (let i = 0; i < 100 && !settled; i++) {
    store.releaseAll();
    await flush();
  }
  return done;
}

describe("ShardLeader credited claims", () => {
  it("claims the credit held when the batch is applied, including credit gained while it waited", async () => {
    const store = new GatedStore();
    const shard = leader(store);
    await enqueue(shard, 10);
    const inFlight = await writeInFlight(store, shard);
    const credit: ClaimCredit = { available: 2 };
    const claimed = claim(shard, credit);
    // The worker grants more while the claim waits for the write in flight.
    credit.available += 5;
    const result = expectKind(await releaseUntil(store, claimed), "claim");
    await inFlight.done;
    expect(result.messages).toHaveLength(7);
    expect(credit.available).toBe(0);
  });

  it("claims the messages enqueued in its batch, though it was submitted before them", async () => {
    const store = new GatedStore();
    const shard = leader(store);
    await shard.submit({ kind: "createSubscription", name: "other" }); // the shard exists, nothing runnable
    // A write in flight that makes nothing runnable: the claim and the enqueue wait for the next batch.
    store.hold = true;
    const inFlight = shard.submit({ kind: "createSubscription", name: "third" });
    for (let i = 0; i < 20 && store.held === 0; i++) await flush();
    expect(store.held).toBe(1);
    const credit: ClaimCredit = { available: 5 };
    const claimed = claim(shard, credit); // first in the buffer, as a Work stream's next claim is
    const enqueued = enqueue(shard, 2);
    const result = expectKind(await releaseUntil(store, claimed), "claim");
    await inFlight;
    await enqueued;
    expect(result.messages.map((m) => m.id)).toEqual(["m0", "m1"]);
    expect(credit.available).toBe(3);
  });

  it("claims up to its credit past the queue's max_batch (1000), which still caps a plain claim", async () => {
    const store = new MemoryStore();
    const shard = leader(store);
    for (let part = 0; part < 3; part++)
      await shard.submit({
        kind: "enqueue",
        messages: Array.from({ length: 1000 }, (_, i) => ({ id: `p${part}-${i}`, payload: payload("x") })),
      });
    const credit: ClaimCredit = { available: 1500 };
    expect(expectKind(await claim(shard, credit), "claim").messages).toHaveLength(1500);
    expect(credit.available).toBe(0);
    const plain = await shard.submit({ kind: "claim", subscription: "default", workerId: "w", max: 1500 });
    expect(expectKind(plain, "claim").messages).toHaveLength(1000);
    // A standing claim's fill is a stream's claim too: of the 1,300 runnable then, its credit's 1,200.
    const stood = standFor(shard, { available: 1200 });
    await enqueue(shard, 800);
    expect(stood.delivered).toHaveLength(1200);
    stood.withdraw();
  });

  it("takes only what it claimed when fewer messages are runnable than the credit", async () => {
    const store = new GatedStore();
    const shard = leader(store);
    await enqueue(shard, 3);
    const credit: ClaimCredit = { available: 8 };
    const result = expectKind(await claim(shard, credit), "claim");
    expect(result.messages).toHaveLength(3);
    expect(credit.available).toBe(5);
  });

  it("answers an empty claim without a write when the credit is gone by the time it applies", async () => {
    const store = new GatedStore();
    const shard = leader(store);
    await enqueue(shard, 4);
    const inFlight = await writeInFlight(store, shard);
    const puts = store.puts;
    const credit: ClaimCredit = { available: 1 };
    const claimed = claim(shard, credit);
    credit.available = 0;
    const result = expectKind(await releaseUntil(store, claimed), "claim");
    await inFlight.done;
    expect(result.messages).toHaveLength(0);
    expect(credit.available).toBe(0);
    expect(store.puts).toBe(puts);
    const again = expectKind(
      await shard.submit({ kind: "claim", subscription: "default", workerId: "w", max: 10 }),
      "claim",
    );
    expect(again.messages).toHaveLength(5); // the 4 and the one enqueued by the write in flight
  });

  it("gives the credit back when the write fails", async () => {
    const faults = new FaultInjectingStore(new MemoryStore(), { random: seededRandom(3) });
    const shard = leader(faults);
    await enqueue(shard, 5);
    faults.addRule({ fault: "unavailable", rate: 1, ops: ["put"], limit: 1 });
    let returned = 0;
    const credit: ClaimCredit = { available: 3, returned: () => returned++ };
    await expect(claim(shard, credit)).rejects.toMatchObject({ code: "unavailable" });
    expect(credit.available).toBe(3);
    expect(returned).toBe(1); // told, so that a consumer parked for want of credit claims again
    const result = expectKind(await claim(shard, credit), "claim");
    expect(result.messages).toHaveLength(3);
    expect(credit.available).toBe(0);
  });

  it("gives a standing claim's credit back, and says so, when the write that filled it fails", async () => {
    // A Work stream that stood a claim, saw its credit taken by a write that then failed and
    // stopped claiming for want of credit was never woken again (simulation seed 91001413).
    const faults = new FaultInjectingStore(new MemoryStore(), { random: seededRandom(4) });
    const shard = leader(faults);
    await shard.submit({ kind: "createSubscription", name: "other" }); // the shard exists, nothing runnable
    let returned = 0;
    const credit: ClaimCredit = { available: 2, returned: () => returned++ };
    const { delivered, withdraw } = standFor(shard, credit);
    faults.addRule({ fault: "unavailable", rate: 1, ops: ["put"], limit: 1 });
    await expect(enqueue(shard, 2)).rejects.toMatchObject({ code: "unavailable" });
    expect(delivered).toHaveLength(0);
    expect(credit.available).toBe(2);
    expect(returned).toBe(1);
    await enqueue(shard, 2);
    expect(delivered).toHaveLength(2);
    expect(credit.available).toBe(0);
    withdraw();
  });

  it("sends and takes what the attempt that landed claimed, when an earlier attempt lands after a later one was made", async () => {
    // The first head write is answered as ambiguous and lands only as the second attempt is
    // sent (a PUT the store applies late), so the second loses its race and the first is
    // what the store holds. Credit granted between the attempts let the second claim more.
    const memory = new MemoryStore();
    let late: (() => Promise<unknown>) | undefined;
    let onAmbiguous = () => {};
    let armed = false;
    const store: ObjectStore = Object.assign(Object.create(memory) as MemoryStore, {
      put: async (key: string, body: Uint8Array, condition: PutCondition, options?: CallOptions) => {
        if (armed && key === "queues/jobs/0.json") {
          armed = false;
          late = () => memory.put(key, body, condition, options);
          onAmbiguous();
          throw new AmbiguousWriteError(key, "the answer was lost");
        }
        if (late !== undefined) {
          const landing = late;
          late = undefined;
          await landing();
        }
        return memory.put(key, body, condition, options);
      },
    });
    const shard = leader(store);
    await enqueue(shard, 6);
    const credit: ClaimCredit = { available: 2 };
    onAmbiguous = () => {
      credit.available += 3;
    };
    const { delivered, withdraw } = standFor(shard, credit);
    armed = true;
    await shard.submit({ kind: "createSubscription", name: "other" }); // a write that fills the standing claim
    withdraw();
    const stored = ShardState.decode((await memory.get("queues/jobs/0.json"))?.body as Uint8Array);
    const leased = stored
      .sortedMessages()
      .filter((m) => stored.subs.get("default")?.deliveries.get(m.msg.offset)?.lease);
    expect(leased.map((m) => m.msg.id)).toEqual(["m0", "m1"]);
    expect(delivered).toEqual(["m0", "m1"]);
    expect(credit.available).toBe(3);
  });

  it("tells the consumer when a batch applied again after a lost race gives back credit its first attempt took", async () => {
    // The standing claim is withdrawn while the first attempt's write is in flight (its stream
    // stopped waiting, and then claiming, for want of credit); the attempt after the lost race
    // fills nothing, so the credit comes back, and the stream must hear of it.
    const memory = new MemoryStore();
    let beforePut: (() => Promise<void>) | undefined;
    const store: ObjectStore = Object.assign(Object.create(memory) as MemoryStore, {
      put: async (key: string, body: Uint8Array, condition: PutCondition, options?: CallOptions) => {
        const hook = key === "queues/jobs/0.json" ? beforePut : undefined;
        beforePut = undefined;
        await hook?.();
        return memory.put(key, body, condition, options);
      },
    });
    const shard = leader(store);
    await shard.submit({ kind: "createSubscription", name: "other" }); // the shard exists, nothing runnable
    let returned = 0;
    const credit: ClaimCredit = { available: 1, returned: () => returned++ };
    const { delivered, withdraw } = standFor(shard, credit);
    beforePut = async () => {
      expect(credit.available).toBe(0); // the first attempt filled the standing claim
      withdraw();
      // Someone edits the head behind the leader's back, keeping its lease: this write loses its race.
      const stored = await memory.get("queues/jobs/0.json");
      if (!stored) throw new Error("missing");
      const edited = ShardState.decode(stored.body);
      edited.writeId = "operator.1";
      await memory.put("queues/jobs/0.json", edited.encode(), { ifMatch: stored.etag });
    };
    await enqueue(shard, 1);
    expect(delivered).toHaveLength(0);
    expect(credit.available).toBe(1);
    expect(returned).toBeGreaterThan(0);
  });

  it("takes the credit once when a lost race makes the batch apply again", async () => {
    const memory = new MemoryStore();
    const shard = leader(memory);
    await enqueue(shard, 6);
    // Someone edits the document behind the leader's back, keeping its lease: the next write loses its race.
    const stored = await memory.get("queues/jobs/0.json");
    if (!stored) throw new Error("missing");
    const edited = ShardState.decode(stored.body);
    edited.writeId = "operator.1";
    await memory.put("queues/jobs/0.json", edited.encode(), { ifMatch: stored.etag });
    const credit: ClaimCredit = { available: 4 };
    const result = expectKind(await claim(shard, credit), "claim");
    expect(result.messages).toHaveLength(4);
    expect(credit.available).toBe(0);
  });
});

describe("ShardClaimer with a consumer's credit", () => {
  it("walks the shards while credit is left and claims from each what the credit holds", async () => {
    const broker = makeBroker(new MemoryStore(), "a", { shardsFor: () => 2 });
    const keyFor = (shard: number) =>
      ["k0", "k1", "k2", "k3", "k4", "k5"].find((k) => shardForKey(k, 2) === shard) as string;
    for (const shard of [0, 1])
      await broker.enqueue(
        "jobs",
        Array.from({ length: 3 }, (_, i) => ({ payload: payload(`${shard}.${i}`), key: keyFor(shard) })),
      );
    const credit: ClaimCredit = { available: 4 };
    const params = { queue: "jobs", subscription: "default", workerId: "w", leaseTtlMs: undefined };
    const pass = await broker.claims.claimOnce({ ...params, max: 4, credit }, [0, 1]);
    expect(pass.deliveries).toHaveLength(4);
    expect(new Set(pass.deliveries.map((d) => d.shard))).toEqual(new Set([0, 1]));
    expect(credit.available).toBe(0);
    // No credit left: the pass asks no shard.
    const none = await broker.claims.claimOnce({ ...params, max: 1, credit }, [0, 1]);
    expect(none.deliveries).toHaveLength(0);
    expect(none.served).toHaveLength(0);
    await broker.stop({ release: false });
  });

  it("gives back the credit of deliveries whose lease ran out before the answer", async () => {
    const clock = new ManualClock({ settleTurns: 2 });
    const store = new GatedStore();
    const broker = makeBroker(store, "a", { clock, initialConfig: { leaseTtlMs: 1_000 } });
    await broker.enqueue("jobs", [{ payload: payload("a") }, { payload: payload("b") }]);
    store.hold = true;
    const credit: ClaimCredit = { available: 5 };
    const claiming = broker.claims.claimOnce(
      { queue: "jobs", subscription: "default", workerId: "w", leaseTtlMs: undefined, max: 5, credit },
      [0],
    );
    for (let i = 0; i < 5 && store.held === 0; i++) await flush();
    expect(store.held).toBe(1);
    expect(credit.available).toBe(3); // taken as the claim applied
    clock.advance(1_500); // the write takes longer than the lease
    store.hold = false;
    store.releaseAll();
    expect((await claiming).deliveries).toEqual([]);
    expect(credit.available).toBe(5);
    await broker.stop({ release: false });
  });
});
