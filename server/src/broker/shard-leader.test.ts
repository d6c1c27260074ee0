import { describe, expect, it } from "vitest";
import { flush, GatedStore, makeBroker } from "../../testing/broker-test-support.ts";
import { FaultInjectingStore } from "../../testing/fault-injecting-store.ts";
import { ManualClock } from "../../testing/manual-clock.ts";
import { isCasqError } from "../errors.ts";
import { ShardState, WRITE_HISTORY } from "../model/shard-state.ts";
import { MemoryStore } from "../store/memory-store.ts";
import type { PutCondition, PutResult } from "../store/object-store.ts";
import { AmbiguousWriteError } from "../store/store-errors.ts";
import { seededRandom } from "../util/random.ts";
import { expectKind } from "./broker.ts";
import { ShardLeader } from "./shard-leader.ts";
import { shardForKey } from "./shard-routing.ts";

const payload = (text: string) => new TextEncoder().encode(text);

function leader(
  store: GatedStore | MemoryStore | FaultInjectingStore,
  name: string,
  clock = new ManualClock(),
) {
  return new ShardLeader({
    store,
    queue: "jobs",
    shard: 0,
    identity: { id: `broker-${name}`, address: `${name}:50051` },
    clock,
    random: seededRandom(1),
  });
}

async function readDoc(store: { get(key: string): Promise<{ body: Uint8Array } | undefined> }) {
  const stored = await store.get("queues/jobs/0.json");
  if (!stored) throw new Error("no document");
  return ShardState.decode(stored.body);
}

describe("ShardLeader group commit", () => {
  it("answers an enqueue only after the write containing it has landed", async () => {
    const store = new GatedStore();
    const shard = leader(store, "a");
    store.hold = true;
    let settled = false;
    const done = shard
      .submit({ kind: "enqueue", messages: [{ id: "m1", payload: payload("x") }] })
      .then((r) => {
        settled = true;
        return r;
      });
    for (let i = 0; i < 5; i++) await flush();
    expect(store.held).toBe(1);
    expect(settled).toBe(false);
    expect(await store.inner.get("queues/jobs/0.json")).toBeUndefined();
    store.releaseAll();
    const result = expectKind(await done, "enqueue");
    expect(result.results[0]?.offset).toBe(0);
    expect((await readDoc(store.inner)).nextOffset).toBe(1);
  });

  it("writes everything buffered during one in-flight write as the next single write", async () => {
    const store = new GatedStore();
    const shard = leader(store, "a");
    await shard.submit({ kind: "enqueue", messages: [{ id: "first", payload: payload("0") }] });
    const putsBefore = store.puts;
    store.hold = true;
    const first = shard.submit({ kind: "enqueue", messages: [{ id: "m0", payload: payload("0") }] });
    for (let i = 0; i < 3; i++) await flush();
    const rest = Array.from({ length: 100 }, (_, i) =>
      shard.submit({ kind: "enqueue", messages: [{ id: `m${i + 1}`, payload: payload(String(i)) }] }),
    );
    for (let i = 0; i < 3; i++) await flush();
    expect(store.puts - putsBefore).toBe(1);
    store.releaseAll();
    for (let i = 0; i < 10 && store.held === 0; i++) await flush();
    expect(store.puts - putsBefore).toBe(2);
    store.releaseAll();
    await Promise.all([first, ...rest]);
    expect(store.puts - putsBefore).toBe(2);
    expect((await readDoc(store.inner)).nextOffset).toBe(102);
  });

  it("fails only the bad operation of a batch, not its neighbours", async () => {
    const store = new MemoryStore();
    const shard = leader(store, "a");
    const good = shard.submit({ kind: "enqueue", messages: [{ id: "ok", payload: payload("1") }] });
    const bad = shard.submit({
      kind: "enqueue",
      messages: [{ id: "bad", payload: payload("1"), priority: 5000 }],
    });
    const claimMissing = shard.submit({ kind: "claim", subscription: "nope", workerId: "w", max: 1 });
    await expect(good).resolves.toMatchObject({ kind: "enqueue" });
    await expect(bad).rejects.toMatchObject({ code: "invalid_argument" });
    await expect(claimMissing).rejects.toMatchObject({ code: "not_found" });
    expect((await readDoc(store)).nextOffset).toBe(1);
  });

  it("answers heartbeats inside the persisted lease without a write", async () => {
    const store = new GatedStore();
    const clock = new ManualClock();
    const shard = leader(store, "a", clock);
    await shard.submit({ kind: "enqueue", messages: [{ id: "m", payload: payload("1") }] });
    const claim = expectKind(
      await shard.submit({ kind: "claim", subscription: "default", workerId: "w", max: 1 }),
      "claim",
    );
    const receipt = claim.messages[0]?.receipt;
    if (!receipt) throw new Error("nothing claimed");
    const puts = store.puts;
    clock.advance(1000);
    const beat = expectKind(
      await shard.submit({ kind: "heartbeat", subscription: "default", workerId: "w", receipts: [receipt] }),
      "heartbeat",
    );
    expect(beat.changed).toBe(false);
    expect(store.puts).toBe(puts);
  });
});

describe("ShardLeader resolves lost races and ambiguous writes", () => {
  it("treats a write that landed but whose answer was lost as landed, exactly once", async () => {
    const memory = new MemoryStore();
    const faults = new FaultInjectingStore(memory, { random: seededRandom(3) });
    const shard = leader(faults, "a");
    await shard.submit({ kind: "enqueue", messages: [{ id: "warmup", payload: payload("w") }] });
    faults.addRule({ fault: "ambiguous_applied", rate: 1, ops: ["put"], limit: 1 });
    const result = expectKind(
      await shard.submit({ kind: "enqueue", messages: [{ id: "once", payload: payload("1") }] }),
      "enqueue",
    );
    expect(faults.stats().appliedButLost).toBe(1);
    expect(result.results[0]?.offset).toBe(1);
    const doc = await readDoc(memory);
    expect(doc.nextOffset).toBe(2);
  });

  it("retries a write whose answer was lost and that did not land", async () => {
    const memory = new MemoryStore();
    const faults = new FaultInjectingStore(memory, { random: seededRandom(3) });
    const shard = leader(faults, "a");
    await shard.submit({ kind: "enqueue", messages: [{ id: "warmup", payload: payload("w") }] });
    faults.addRule({ fault: "ambiguous_not_applied", rate: 1, ops: ["put"], limit: 2 });
    await shard.submit({ kind: "enqueue", messages: [{ id: "once", payload: payload("1") }] });
    expect((await readDoc(memory)).nextOffset).toBe(2);
  });

  it("re-applies the batch on top of a foreign write with the same epoch (e.g. an operator repair)", async () => {
    const memory = new MemoryStore();
    const shard = leader(memory, "a");
    await shard.submit({ kind: "enqueue", messages: [{ id: "m0", payload: payload("0") }] });
    // Someone edits the document behind the leader's back, keeping its lease.
    const stored = await memory.get("queues/jobs/0.json");
    if (!stored) throw new Error("missing");
    const edited = ShardState.decode(stored.body);
    edited.writeId = "operator.1";
    await memory.put("queues/jobs/0.json", edited.encode(), { ifMatch: stored.etag });
    const result = expectKind(
      await shard.submit({ kind: "enqueue", messages: [{ id: "m1", payload: payload("1") }] }),
      "enqueue",
    );
    expect(result.results[0]?.offset).toBe(1);
    expect((await readDoc(memory)).nextOffset).toBe(2);
  });

  it("does not say a batch failed plainly when an earlier write of it may still land", async () => {
    // The first write's answer is lost and the head is unchanged when re-read: not landed yet,
    // but a PUT the store applies late may still land. The second attempt finds the store down.
    const memory = new MemoryStore();
    const faults = new FaultInjectingStore(memory, { random: seededRandom(3) });
    const shard = leader(faults, "a");
    await shard.submit({ kind: "enqueue", messages: [{ id: "m0", payload: payload("0") }] });
    faults.addRule({ fault: "ambiguous_not_applied", rate: 1, ops: ["put"], limit: 1 });
    faults.addRule({ fault: "unavailable", rate: 1, ops: ["put"], limit: 1 });
    const failed = shard.submit({ kind: "enqueue", messages: [{ id: "maybe", payload: payload("1") }] });
    await expect(failed).rejects.toMatchObject({
      code: "unavailable",
      message: expect.stringMatching(/may or may not have landed/),
    });
  });

  it("never says nothing is runnable while a commit is under way: a failed write gives back what it claimed", async () => {
    const faults = new FaultInjectingStore(new MemoryStore(), { random: seededRandom(4) });
    const store = new GatedStore(faults);
    const shard = leader(store, "a");
    await shard.submit({ kind: "enqueue", messages: [{ id: "m0", payload: payload("0") }] });
    expect(shard.runnableNow("default")).toBe(true);
    faults.addRule({ fault: "unavailable", rate: 1, ops: ["put"], limit: 1 });
    store.hold = true;
    const claim = { kind: "claim", subscription: "default", workerId: "w", max: 1 } as const;
    const failing = shard.submit(claim);
    for (let i = 0; i < 5 && store.held === 0; i++) await flush();
    expect(store.held).toBe(1);
    // The state holds the claim applied (m0 leased), but its write may yet fail.
    expect(shard.runnableNow("default")).toBeUndefined();
    store.hold = false;
    store.releaseAll();
    await expect(failing).rejects.toMatchObject({ code: "unavailable" });
    expect(shard.runnableNow("default")).toBe(true);
    expect(expectKind(await shard.submit(claim), "claim").messages).toHaveLength(1);
    expect(shard.runnableNow("default")).toBe(false);
  });

  it("restores its state after an unavailable store and keeps serving", async () => {
    const memory = new MemoryStore();
    const faults = new FaultInjectingStore(memory, { random: seededRandom(3) });
    const shard = leader(faults, "a");
    await shard.submit({ kind: "enqueue", messages: [{ id: "m0", payload: payload("0") }] });
    faults.addRule({ fault: "unavailable", rate: 1, ops: ["put"], limit: 1 });
    await expect(
      shard.submit({ kind: "enqueue", messages: [{ id: "lost", payload: payload("1") }] }),
    ).rejects.toMatchObject({ code: "unavailable" });
    const next = expectKind(
      await shard.submit({ kind: "enqueue", messages: [{ id: "m1", payload: payload("1") }] }),
      "enqueue",
    );
    expect(next.results[0]?.offset).toBe(1);
    const doc = await readDoc(memory);
    expect(doc.nextOffset).toBe(2);
  });
});

/**
 * A store whose next put is answered "ambiguous" after rival writes landed on
 * top: the put itself lands first (`applied`) or not, then a rival broker
 * writes `rivalWrites` times (holding a live lease, or having released it).
 */
class RivalOnTopStore extends MemoryStore {
  armed: { applied: boolean; rivalWrites: number; rivalLeaseUntil: number } | undefined;

  override async put(key: string, body: Uint8Array, condition: PutCondition): Promise<PutResult> {
    const armed = this.armed;
    if (!armed) return super.put(key, body, condition);
    this.armed = undefined;
    if (armed.applied) await super.put(key, body, condition);
    for (let i = 1; i <= armed.rivalWrites; i++) {
      const current = await super.get(key);
      if (!current) throw new Error("no document");
      const doc = ShardState.decode(current.body);
      doc.broker = { id: "broker-r", address: "r:50051", epoch: 9, leaseUntil: armed.rivalLeaseUntil };
      doc.recordWrite(`broker-r.${i}`);
      await super.put(key, doc.encode(), { ifMatch: current.etag });
    }
    throw new AmbiguousWriteError(key, "response lost (test)");
  }
}

describe("ShardLeader finds out whether an ambiguous write landed under later writes", () => {
  async function setUp() {
    const store = new RivalOnTopStore();
    const clock = new ManualClock();
    const shard = leader(store, "a", clock);
    await shard.submit({ kind: "enqueue", messages: [{ id: "m0", payload: payload("0") }] });
    return { store, clock, shard };
  }

  it("answers OK when its write landed and a rival then took over and wrote on top", async () => {
    const { store, clock, shard } = await setUp();
    store.armed = { applied: true, rivalWrites: 3, rivalLeaseUntil: clock.now() + 60_000 };
    const result = expectKind(
      await shard.submit({ kind: "enqueue", messages: [{ id: "m1", payload: payload("1") }] }),
      "enqueue",
    );
    expect(result.results[0]?.offset).toBe(1);
    const doc = await readDoc(store);
    expect(doc.nextOffset).toBe(2); // stored once, not re-applied
    expect(doc.recentWriteIds.slice(-3)).toEqual(["broker-a.2", "broker-r.1", "broker-r.2"]);
    // The rival leads now: the next batch is redirected to it.
    await expect(
      shard.submit({ kind: "enqueue", messages: [{ id: "m2", payload: payload("2") }] }),
    ).rejects.toMatchObject({ code: "redirect", details: { leaderAddress: "r:50051" } });
  });

  it("re-applies the batch when its write did not land and the rival released the shard", async () => {
    const { store, shard } = await setUp();
    store.armed = { applied: false, rivalWrites: 2, rivalLeaseUntil: 0 };
    const result = expectKind(
      await shard.submit({ kind: "enqueue", messages: [{ id: "m1", payload: payload("1") }] }),
      "enqueue",
    );
    expect(result.results[0]?.offset).toBe(1);
    expect((await readDoc(store)).nextOffset).toBe(2);
  });

  it("does not apply a landed batch twice when the rival released the shard afterwards", async () => {
    const { store, shard } = await setUp();
    store.armed = { applied: true, rivalWrites: 2, rivalLeaseUntil: 0 };
    const result = expectKind(
      await shard.submit({ kind: "enqueue", messages: [{ id: "m1", payload: payload("1") }] }),
      "enqueue",
    );
    expect(result.results[0]?.offset).toBe(1);
    const doc = await readDoc(store);
    expect(doc.nextOffset).toBe(2);
    expect([...doc.sortedMessages()].map((m) => m.msg.id)).toEqual(["m0", "m1"]);
  });

  it("answers 'outcome unknown' and changes nothing more when too many writes followed to tell", async () => {
    const { store, shard } = await setUp();
    store.armed = { applied: true, rivalWrites: WRITE_HISTORY + 2, rivalLeaseUntil: 0 };
    const error = await shard
      .submit({ kind: "enqueue", messages: [{ id: "m1", payload: payload("1") }] })
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(error).toMatchObject({ code: "unavailable" });
    expect(String((error as Error).message)).toMatch(/may or may not have landed/);
    expect((await readDoc(store)).nextOffset).toBe(2); // the landed write only, never re-applied
  });
});

describe("ShardLeader leadership", () => {
  it("takes over an expired lease with a higher epoch and fences the old leader out", async () => {
    const memory = new MemoryStore();
    const clock = new ManualClock();
    // a reaches the store through a link that can be cut (a network partition).
    const linkA = new FaultInjectingStore(memory, { random: seededRandom(5), clock });
    const a = leader(linkA, "a", clock);
    const b = leader(memory, "b", clock);
    await a.submit({ kind: "enqueue", messages: [{ id: "m0", payload: payload("0") }] });
    expect((await readDoc(memory)).broker).toMatchObject({ id: "broker-a", epoch: 1 });

    // While a's lease is valid, b redirects to a.
    const early = b.submit({ kind: "enqueue", messages: [{ id: "x", payload: payload("x") }] });
    await expect(early).rejects.toMatchObject({
      code: "redirect",
      details: { leaderAddress: "a:50051", epoch: 1 },
    });

    // Cut a off: its renewals fail, its lease runs out, b takes over.
    const cut = linkA.addRule({ fault: "unavailable", rate: 1 });
    await clock.runUntil(clock.now() + 11_000);
    await b.submit({ kind: "enqueue", messages: [{ id: "m1", payload: payload("1") }] });
    expect((await readDoc(memory)).broker).toMatchObject({ id: "broker-b", epoch: 2 });

    // Healed, a still believes it leads; its write carries a stale etag and is fenced.
    linkA.removeRule(cut);
    const fenced = a.submit({ kind: "enqueue", messages: [{ id: "m2", payload: payload("2") }] });
    await expect(fenced).rejects.toMatchObject({ code: "redirect", details: { leaderId: "broker-b" } });
    const doc = await readDoc(memory);
    expect(doc.nextOffset).toBe(2);
    expect(doc.broker?.epoch).toBe(2);
    expect(a.currentMode).toBe("following");
    await a.stop({ release: false });
    await b.stop({ release: false });
  });

  it("hands the lease back on a graceful stop so another broker takes over at once", async () => {
    const memory = new MemoryStore();
    const clock = new ManualClock();
    const a = leader(memory, "a", clock);
    await a.submit({ kind: "enqueue", messages: [{ id: "m0", payload: payload("0") }] });
    await a.stop({ release: true });
    expect((await readDoc(memory)).broker?.leaseUntil).toBe(0);
    const b = leader(memory, "b", clock);
    await b.submit({ kind: "enqueue", messages: [{ id: "m1", payload: payload("1") }] });
    expect((await readDoc(memory)).broker).toMatchObject({ id: "broker-b", epoch: 2 });
    await expect(a.submit({ kind: "expire" })).rejects.toMatchObject({ code: "unavailable" });
  });

  it("renews its lease when idle, about once per half lease", async () => {
    const store = new GatedStore();
    // The commit loop hops one setImmediate before each batch; the clock must settle
    // past it, or runUntil jumps to the end before the renewal batch runs.
    const clock = new ManualClock({ settleTurns: 2 });
    const a = leader(store, "a", clock);
    await a.submit({ kind: "enqueue", messages: [{ id: "m0", payload: payload("0") }] });
    const puts = store.puts;
    await clock.runUntil(clock.now() + 60_000);
    for (let i = 0; i < 5; i++) await flush();
    // 60 s idle with a 10 s lease renewed at half-life: about 12 renewal writes.
    expect(store.puts - puts).toBeGreaterThanOrEqual(10);
    expect(store.puts - puts).toBeLessThanOrEqual(13);
    const doc = await readDoc(store.inner);
    expect(doc.broker?.leaseUntil).toBeGreaterThan(clock.now());
    await a.stop({ release: false });
  });

  it("refuses a document it cannot parse and never overwrites it", async () => {
    const memory = new MemoryStore();
    const garbage = new TextEncoder().encode('{"format":"casq.shard.v99","surprise":true}');
    await memory.put("queues/jobs/0.json", garbage, { ifAbsent: true });
    const a = leader(memory, "a");
    const error = await a
      .submit({ kind: "enqueue", messages: [{ id: "m", payload: payload("1") }] })
      .catch((e) => e);
    expect(isCasqError(error, "data_loss")).toBe(true);
    expect(String(error.message)).toMatch(/will not be overwritten/);
    const after = await memory.get("queues/jobs/0.json");
    expect(after?.body).toEqual(garbage);
  });
});

describe("ShardLeader regressions found by the simulation (test/sim)", () => {
  it("works on a clock whose time is not a whole millisecond (jittered sleeps on a manual clock)", async () => {
    // Jittered backoffs and drawn store latencies are fractional; slept on a
    // ManualClock they leave now() between milliseconds. The model takes whole ms.
    const clock = new ManualClock();
    clock.advance(0.25);
    const shard = leader(new MemoryStore(), "a", clock);
    const result = expectKind(
      await shard.submit({ kind: "enqueue", messages: [{ id: "m0", payload: payload("0") }] }),
      "enqueue",
    );
    expect(result.results[0]?.offset).toBe(0);
    clock.advance(1000.5);
    const claim = expectKind(
      await shard.submit({ kind: "claim", subscription: "default", workerId: "w", max: 1 }),
      "claim",
    );
    expect(claim.messages[0]?.leaseDeadline).toBe(Math.floor(clock.now()) + 60_000);
    await shard.stop({ release: false });
  });

  it("places unkeyed messages on shards this broker leads, so a batch never needs two leaders", async () => {
    // Shard 0 led by a, shard 1 by b. A batch of unkeyed messages sent to a used to be
    // spread round-robin over both shards: the part for shard 1 was redirected to b, the
    // part for shard 0 was committed anyway, and no broker could ever accept the batch.
    const clock = new ManualClock();
    const memory = new MemoryStore();
    const a = makeBroker(memory, "a", { clock, shardsFor: () => 2 });
    const b = makeBroker(memory, "b", { clock, shardsFor: () => 2 });
    const keyFor = (shard: number) =>
      ["k0", "k1", "k2", "k3", "k4"].find((k) => shardForKey(k, 2) === shard) as string;
    await a.enqueue("jobs", [{ payload: payload("a"), key: keyFor(0) }]);
    await b.enqueue("jobs", [{ payload: payload("b"), key: keyFor(1) }]);
    // Each broker has learned (from a redirect) who leads the other shard.
    await expect(a.enqueue("jobs", [{ payload: payload("a"), key: keyFor(1) }])).rejects.toMatchObject({
      code: "redirect",
    });
    await expect(b.enqueue("jobs", [{ payload: payload("b"), key: keyFor(0) }])).rejects.toMatchObject({
      code: "redirect",
    });
    const batch = await a.enqueue(
      "jobs",
      Array.from({ length: 4 }, (_, i) => ({ payload: payload(String(i)) })),
    );
    expect(batch.map((o) => o.shard)).toEqual([0, 0, 0, 0]);
    const other = await b.enqueue("jobs", [{ payload: payload("x") }, { payload: payload("y") }]);
    expect(other.map((o) => o.shard)).toEqual([1, 1]);
    await a.stop({ release: false });
    await b.stop({ release: false });
  });

  it("does not hand out a claimed delivery whose lease ran out before the answer (slow or ambiguous write)", async () => {
    // Seen in the simulation (seed 2971): a claim's write landed, the answer was lost, the
    // link was cut while the leader tried to find out, and when it finally could, the lease
    // had expired, the message had been redelivered and acked — yet the old claim was answered.
    const clock = new ManualClock({ settleTurns: 2 });
    const store = new GatedStore();
    const broker = makeBroker(store, "a", { clock, initialConfig: { leaseTtlMs: 1_000 } });
    await broker.enqueue("jobs", [{ payload: payload("slow") }]);
    store.hold = true;
    const claiming = broker.claim("jobs", { subscription: "default", workerId: "w", max: 1 });
    for (let i = 0; i < 5 && store.held === 0; i++) await flush();
    expect(store.held).toBe(1);
    clock.advance(1_500); // the write takes longer than the lease
    store.hold = false;
    store.releaseAll();
    expect(await claiming).toEqual([]);
    // The message is not lost: the lease is swept and it is delivered again, as attempt 2.
    const again = await broker.claim("jobs", { subscription: "default", workerId: "w", max: 1 });
    expect(again.map((d) => d.message.attempt)).toEqual([2]);
    await broker.stop({ release: false });
  });

  it("does not hand out a delivery whose lease ran out while the claim walked a slow shard", async () => {
    // The path of simulation seed 2971: shard 1's claim committed at once, then the walk
    // waited on shard 0 (its store link cut) for longer than the lease.
    const clock = new ManualClock({ settleTurns: 2 });
    const link = new FaultInjectingStore(new MemoryStore(), { clock, random: seededRandom(9) });
    const broker = makeBroker(link, "a", { clock, shardsFor: () => 2, initialConfig: { leaseTtlMs: 1_000 } });
    const keyFor = (shard: number) =>
      ["k0", "k1", "k2", "k3", "k4"].find((k) => shardForKey(k, 2) === shard) as string;
    await broker.enqueue("jobs", [{ payload: payload("0"), key: keyFor(0) }]);
    await broker.enqueue("jobs", [{ payload: payload("1"), key: keyFor(1) }]);
    // The first claim starts at shard 0 and takes its message; the next one starts at shard 1.
    expect((await broker.claim("jobs", { subscription: "default", workerId: "w", max: 1 }))[0]?.shard).toBe(
      0,
    );
    await clock.runUntil(clock.now() + 6_000); // both shards now renew their leadership on the next batch
    link.addRule({
      fault: "delay",
      rate: 1,
      keyPrefix: "queues/jobs/0.json",
      latency: { kind: "fixed", ms: 5_000 },
    });
    let result: unknown;
    const started = clock.now();
    broker.claim("jobs", { subscription: "default", workerId: "w", max: 2 }).then((r) => {
      result = r;
    });
    // Step the clock until the claim returns (shard 1 answers at once, shard 0 after 5 s).
    for (let i = 0; i < 200 && result === undefined; i++) await clock.runUntil(clock.now() + 50);
    expect(clock.now() - started).toBeGreaterThanOrEqual(5_000);
    expect(result).toEqual([]);
    link.clearRules();
    let stopped = false;
    broker.stop({ release: false }).then(() => {
      stopped = true;
    });
    for (let i = 0; i < 200 && !stopped; i++) await clock.runUntil(clock.now() + 50);
    expect(stopped).toBe(true);
  });

  it("does not redirect clients to itself while an earlier process at its address holds the lease", async () => {
    // After a crash and restart, the document still names the dead process (same address,
    // other id) until its lease runs out. A redirect would send the client right back here.
    const clock = new ManualClock();
    const memory = new MemoryStore();
    const old = new ShardLeader({
      store: memory,
      queue: "jobs",
      shard: 0,
      identity: { id: "broker-a-1", address: "a:50051" },
      clock,
      random: seededRandom(1),
    });
    await old.submit({ kind: "enqueue", messages: [{ id: "m0", payload: payload("0") }] });
    await old.stop({ release: false }); // it crashed: it renews nothing (its lease is left to run out)
    const restarted = new ShardLeader({
      store: memory,
      queue: "jobs",
      shard: 0,
      identity: { id: "broker-a-2", address: "a:50051" },
      clock,
      random: seededRandom(2),
    });
    const error = await restarted
      .submit({ kind: "enqueue", messages: [{ id: "m1", payload: payload("1") }] })
      .catch((e) => e);
    expect(error).toMatchObject({ code: "unavailable" });
    expect(String(error.message)).toMatch(/retry in \d+ ms/);
    clock.advance(10_001);
    await restarted.submit({ kind: "enqueue", messages: [{ id: "m1", payload: payload("1") }] });
    expect((await readDoc(memory)).broker).toMatchObject({ id: "broker-a-2", epoch: 2 });
  });

  it("keeps serving claims from the shards it leads while another shard cannot answer", async () => {
    const clock = new ManualClock();
    const memory = new MemoryStore();
    const keyFor = (shard: number) =>
      ["k0", "k1", "k2", "k3", "k4"].find((k) => shardForKey(k, 2) === shard) as string;
    const identity = (id: string) => ({ identity: { id, address: "a:50051" }, clock, shardsFor: () => 2 });
    const first = makeBroker(memory, "a", identity("broker-a-1"));
    await first.enqueue("jobs", [{ payload: payload("0"), key: keyFor(0) }]); // a-1 leads shard 0, then dies
    const second = makeBroker(memory, "a", identity("broker-a-2"));
    await second.enqueue("jobs", [{ payload: payload("1"), key: keyFor(1) }]); // a-2 leads shard 1
    const claimed = await second.claim("jobs", { subscription: "default", workerId: "w", max: 2 });
    expect(claimed.map((d) => d.shard)).toEqual([1]);
    await expect(second.claim("jobs", { subscription: "default", workerId: "w", max: 2 })).resolves.toEqual(
      [],
    );
    await second.stop({ release: false });
  });

  it("takes over soon after a graceful release even when it had cached the old leader's record", async () => {
    // A follower redirects from its cached record without reading the store. It used to trust
    // that record until the old lease time, so after a graceful stop (lease_until = 0) clients
    // were sent to the stopped broker for up to a whole lease.
    const clock = new ManualClock();
    const memory = new MemoryStore();
    const a = leader(memory, "a", clock);
    const b = leader(memory, "b", clock);
    await a.submit({ kind: "enqueue", messages: [{ id: "m0", payload: payload("0") }] });
    await expect(
      b.submit({ kind: "enqueue", messages: [{ id: "x", payload: payload("x") }] }),
    ).rejects.toMatchObject({
      code: "redirect",
    });
    await a.stop({ release: true });
    clock.advance(1_000); // a tenth of the 10 s lease
    await b.submit({ kind: "enqueue", messages: [{ id: "m1", payload: payload("1") }] });
    expect((await readDoc(memory)).broker).toMatchObject({ id: "broker-b", epoch: 2 });
  });
});
