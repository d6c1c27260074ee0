import { describe, expect, it } from "vitest";
import { MemoryStore } from "../src/store/memory-store.ts";
import {
  AmbiguousWriteError,
  ConflictError,
  isStoreError,
  UnavailableError,
} from "../src/store/store-errors.ts";
import { seededRandom } from "../src/util/random.ts";
import {
  drawLatency,
  FaultInjectingStore,
  type FaultInjectingStoreOptions,
  type InjectedFault,
} from "./fault-injecting-store.ts";
import { ManualClock } from "./manual-clock.ts";

const bytes = (text: string) => new TextEncoder().encode(text);
const text = (body: Uint8Array | undefined) =>
  body === undefined ? undefined : new TextDecoder().decode(body);

function make(options: FaultInjectingStoreOptions = {}) {
  const memory = new MemoryStore();
  const clock = new ManualClock({ startMs: 0 });
  const faults: InjectedFault[] = [];
  const store = new FaultInjectingStore(memory, {
    clock,
    random: seededRandom(7),
    onFault: (f) => faults.push(f),
    ...options,
  });
  return { memory, clock, store, faults };
}

/** Outcome of a call as a short string: `ok` or the error kind. */
async function outcome(promise: Promise<unknown>): Promise<string> {
  try {
    await promise;
    return "ok";
  } catch (error) {
    return isStoreError(error) ? error.kind : "other";
  }
}

describe("FaultInjectingStore", () => {
  it("passes calls through untouched when no rule is set", async () => {
    const { store, memory } = make();
    const { etag } = await store.put("q/a.json", bytes("v1"), { ifAbsent: true });
    expect((await memory.get("q/a.json"))?.etag).toBe(etag);
    expect(text((await store.get("q/a.json"))?.body)).toBe("v1");
    expect(await store.list("q/")).toHaveLength(1);
    await store.delete("q/a.json");
    expect(await memory.get("q/a.json")).toBeUndefined();
    expect(store.stats().calls).toEqual({ get: 1, put: 1, delete: 1, list: 1 });
    expect(store.description).toBe("fault-injecting(memory:)");
  });

  it("injects the same faults and latencies for the same seed and call sequence", async () => {
    const run = async (seed: number) => {
      const memory = new MemoryStore();
      const clock = new ManualClock({ startMs: 0 });
      const log: string[] = [];
      const store = new FaultInjectingStore(memory, {
        clock,
        random: seededRandom(seed),
        latency: { kind: "exponential", meanMs: 40, minMs: 5 },
        rules: [
          { fault: "unavailable", rate: 0.1 },
          { fault: "ambiguous_applied", rate: 0.05, keyPrefix: "q/" },
          { fault: "conflict", rate: 0.05 },
          { fault: "delay", rate: 0.02, latency: { kind: "fixed", ms: 5000 } },
        ],
        onFault: (f) =>
          log.push(`#${f.call} ${f.op} ${f.key} ${f.fault} ${f.latencyMs.toFixed(3)} @${f.atMs}`),
      });
      const outcomes: string[] = [];
      for (let i = 0; i < 300; i++) {
        const key = `${i % 3 === 0 ? "q" : "r"}/k${i % 7}.json`;
        const call =
          i % 4 === 0
            ? store.get(key)
            : i % 4 === 3
              ? store.list("q/")
              : store.put(key, bytes(`${i}`), { ifAbsent: true });
        const settled = outcome(call);
        await clock.runUntilIdle();
        outcomes.push(`${await settled}@${clock.now()}`);
      }
      return { log, outcomes, stats: store.stats() };
    };
    const a = await run(1234);
    const b = await run(1234);
    expect(b).toEqual(a);
    expect(a.log.length).toBeGreaterThan(20);
    const c = await run(4321);
    expect(c.log).not.toEqual(a.log);
  });

  it("applies an ambiguous_applied write, then loses the answer: a re-read sees it", async () => {
    const { store, memory } = make({ rules: [{ fault: "ambiguous_applied", rate: 1, ops: ["put"] }] });
    const error = await store.put("q/a.json", bytes("landed"), { ifAbsent: true }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(AmbiguousWriteError);
    expect(isStoreError(error, "ambiguous")).toBe(true);
    expect(text((await memory.get("q/a.json"))?.body)).toBe("landed");
    expect(text((await store.get("q/a.json"))?.body)).toBe("landed");
    expect(store.stats().appliedButLost).toBe(1);
    expect(store.stats().injected.ambiguous_applied).toBe(1);
  });

  it("still reports ambiguous (not the 412) when an ambiguous_applied write was refused by the store", async () => {
    const { store, memory } = make();
    await memory.put("q/a.json", bytes("v1"), { ifAbsent: true });
    store.addRule({ fault: "ambiguous_applied", rate: 1 });
    const error = await store.put("q/a.json", bytes("v2"), { ifAbsent: true }).catch((e: unknown) => e);
    expect(isStoreError(error, "ambiguous")).toBe(true);
    expect(isStoreError((error as Error).cause, "precondition_failed")).toBe(true);
    expect(text((await memory.get("q/a.json"))?.body)).toBe("v1");
    expect(store.stats().appliedButLost).toBe(0);
  });

  it("lands an ambiguous_late write after its caller gave up, if its condition still holds then", async () => {
    const latency = { kind: "fixed", ms: 100 } as const;
    const { store, memory, clock } = make({
      rules: [{ fault: "ambiguous_late", rate: 1, limit: 2, latency }],
    });
    await memory.put("q/a.json", bytes("v1"), { ifAbsent: true });
    const etag = (await memory.get("q/a.json"))?.etag as string;
    // The caller hears "ambiguous" after half the latency; nothing has landed yet.
    const late = store.put("q/a.json", bytes("v2"), { ifMatch: etag }).catch((e: unknown) => e);
    await clock.advanceBy(50);
    expect(await late).toBeInstanceOf(AmbiguousWriteError);
    expect(text((await memory.get("q/a.json"))?.body)).toBe("v1");
    // The rest of the latency later it lands.
    await clock.advanceBy(50);
    expect(text((await memory.get("q/a.json"))?.body)).toBe("v2");
    expect(store.stats().landedLate).toBe(1);

    // One whose condition a write made meanwhile broke is refused when it arrives.
    const now = (await memory.get("q/a.json"))?.etag as string;
    const refused = store.put("q/a.json", bytes("v3"), { ifMatch: now }).catch((e: unknown) => e);
    await clock.advanceBy(50);
    expect(await refused).toBeInstanceOf(AmbiguousWriteError);
    await memory.put("q/a.json", bytes("v4"), { ifMatch: now });
    await clock.advanceBy(50);
    expect(text((await memory.get("q/a.json"))?.body)).toBe("v4");
    expect(store.stats().landedLate).toBe(1);
    expect(store.stats().injected.ambiguous_late).toBe(2);
  });

  it("applies an ambiguous delete too", async () => {
    const { store, memory } = make();
    await memory.put("q/a.json", bytes("v1"), { ifAbsent: true });
    store.addRule({ fault: "ambiguous_applied", rate: 1, ops: ["delete"] });
    await expect(store.delete("q/a.json")).rejects.toBeInstanceOf(AmbiguousWriteError);
    expect(await memory.get("q/a.json")).toBeUndefined();
  });

  it("does not apply ambiguous_not_applied, conflict, unavailable or timeout_before_send writes", async () => {
    const cases = [
      ["ambiguous_not_applied", AmbiguousWriteError],
      ["conflict", ConflictError],
      ["unavailable", UnavailableError],
      ["timeout_before_send", UnavailableError],
    ] as const;
    for (const [fault, errorClass] of cases) {
      const { store, memory } = make({ rules: [{ fault, rate: 1 }] });
      await expect(store.put("q/a.json", bytes("x"), { ifAbsent: true })).rejects.toBeInstanceOf(errorClass);
      expect(await memory.get("q/a.json")).toBeUndefined();
      expect(store.stats().injected[fault]).toBe(1);
    }
  });

  it("fails reads with unavailable and timeout_before_send", async () => {
    const { store } = make({ rules: [{ fault: "timeout_before_send", rate: 1, ops: ["list"] }] });
    store.addRule({ fault: "unavailable", rate: 1, ops: ["get"] });
    expect(await outcome(store.get("q/a.json"))).toBe("unavailable");
    expect(await outcome(store.list("q/"))).toBe("unavailable");
  });

  it("respects per-prefix rates over many calls", async () => {
    const { store } = make({
      rules: [
        { fault: "unavailable", rate: 0.3, keyPrefix: "hot/" },
        { fault: "unavailable", rate: 0.05, keyPrefix: "cold/" },
      ],
    });
    const n = 4000;
    const failures = { hot: 0, cold: 0, other: 0 };
    for (let i = 0; i < n; i++) {
      for (const prefix of ["hot", "cold", "other"] as const) {
        if ((await outcome(store.get(`${prefix}/k${i % 10}.json`))) !== "ok") failures[prefix]++;
      }
    }
    // Binomial: 3 standard deviations is about 0.022 for p=0.3 and 0.010 for p=0.05 at n=4000.
    expect(Math.abs(failures.hot / n - 0.3)).toBeLessThan(0.022);
    expect(Math.abs(failures.cold / n - 0.05)).toBeLessThan(0.01);
    expect(failures.other).toBe(0);
    expect(store.stats().injected.unavailable).toBe(failures.hot + failures.cold);
  });

  it("matches rules by operation", async () => {
    const { store } = make({ rules: [{ fault: "unavailable", rate: 1, ops: ["put"] }] });
    expect(await outcome(store.get("q/a.json"))).toBe("ok");
    expect(await outcome(store.put("q/a.json", bytes("x"), { ifAbsent: true }))).toBe("unavailable");
  });

  it("lets rules be removed, cleared and limited at runtime", async () => {
    const { store } = make();
    const id = store.addRule({ fault: "unavailable", rate: 1, ops: ["get"] });
    expect(await outcome(store.get("q/a.json"))).toBe("unavailable");
    expect(store.rules().map((r) => r.id)).toEqual([id]);
    expect(store.removeRule(id)).toBe(true);
    expect(store.removeRule(id)).toBe(false);
    expect(await outcome(store.get("q/a.json"))).toBe("ok");

    store.addRule({ id: "two-puts", fault: "conflict", rate: 1, limit: 2 });
    const outcomes: string[] = [];
    for (let i = 0; i < 4; i++)
      outcomes.push(await outcome(store.put(`q/${i}.json`, bytes("x"), { ifAbsent: true })));
    expect(outcomes).toEqual(["conflict", "conflict", "ok", "ok"]);
    expect(store.rules()[0]?.injected).toBe(2);

    store.addRule({ fault: "unavailable", rate: 1 });
    store.clearRules();
    expect(await outcome(store.get("q/a.json"))).toBe("ok");
    expect(store.stats().byRule).toEqual({ [id]: 1, "two-puts": 2 });
    store.resetStats();
    expect(store.stats().injected.conflict).toBe(0);
  });

  it("refuses rules that make no sense", () => {
    const { store } = make();
    expect(() => store.addRule({ fault: "ambiguous_applied", rate: 1, ops: ["get"] })).toThrow(RangeError);
    expect(() => store.addRule({ fault: "conflict", rate: 1, ops: ["list"] })).toThrow(RangeError);
    expect(() => store.addRule({ fault: "unavailable", rate: 1.5 })).toThrow(RangeError);
    expect(() => store.addRule({ fault: "unavailable", rate: Number.NaN })).toThrow(RangeError);
    expect(() => store.addRule({ fault: "delay", rate: 1 })).toThrow(RangeError);
    expect(() => store.addRule({ fault: "unavailable", rate: 1, limit: -1 })).toThrow(RangeError);
    expect(() => store.setLatency({ kind: "uniform", minMs: 10, maxMs: 5 })).toThrow(RangeError);
    store.addRule({ id: "x", fault: "unavailable", rate: 0 });
    expect(() => store.addRule({ id: "x", fault: "unavailable", rate: 0 })).toThrow(RangeError);
  });

  it("sleeps latency on the injected clock, and a write is visible before its writer hears back", async () => {
    const { store, memory, clock } = make({ latency: { put: { kind: "fixed", ms: 100 } } });
    let acked = false;
    const put = store.put("q/a.json", bytes("v1"), { ifAbsent: true }).then((r) => {
      acked = true;
      return r;
    });
    await clock.advanceBy(49);
    expect(await memory.get("q/a.json")).toBeUndefined();
    await clock.advanceBy(1);
    expect(text((await memory.get("q/a.json"))?.body)).toBe("v1");
    expect(acked).toBe(false);
    await clock.advanceBy(50);
    expect(acked).toBe(true);
    expect((await put).etag).toBe((await memory.get("q/a.json"))?.etag);
    expect(store.stats().totalLatencyMs).toBe(100);
  });

  it("uses a rule's latency for faulted calls (a slow timeout, or a delay)", async () => {
    const { store, clock } = make({
      latency: { kind: "fixed", ms: 10 },
      rules: [
        {
          fault: "timeout_before_send",
          rate: 1,
          ops: ["get"],
          limit: 1,
          latency: { kind: "fixed", ms: 5000 },
        },
      ],
    });
    const first = outcome(store.get("q/a.json"));
    await clock.runUntilIdle();
    expect(await first).toBe("unavailable");
    expect(clock.now()).toBe(5000);
    store.addRule({ fault: "delay", rate: 1, ops: ["get"], latency: { kind: "fixed", ms: 700 } });
    const second = outcome(store.get("q/a.json"));
    await clock.runUntilIdle();
    expect(await second).toBe("ok");
    expect(clock.now()).toBe(5700);
    expect(store.stats().injected.delay).toBe(1);
  });

  it("turns an abort of a write in flight into an ambiguous error, of a read into unavailable", async () => {
    const { store, memory, clock } = make({ latency: { kind: "fixed", ms: 100 } });
    const early = new AbortController();
    const notLanded = store
      .put("q/a.json", bytes("v1"), { ifAbsent: true }, { signal: early.signal })
      .catch((e) => e);
    await clock.advanceBy(10);
    early.abort();
    expect(isStoreError(await notLanded, "ambiguous")).toBe(true);
    expect(await memory.get("q/a.json")).toBeUndefined();

    const late = new AbortController();
    const landed = store
      .put("q/a.json", bytes("v2"), { ifAbsent: true }, { signal: late.signal })
      .catch((e) => e);
    await clock.advanceBy(60);
    late.abort();
    expect(isStoreError(await landed, "ambiguous")).toBe(true);
    expect(text((await memory.get("q/a.json"))?.body)).toBe("v2");

    const reader = new AbortController();
    const read = store.get("q/a.json", { signal: reader.signal }).catch((e) => e);
    await clock.advanceBy(10);
    reader.abort();
    expect(isStoreError(await read, "unavailable")).toBe(true);
    expect(await outcome(store.get("q/a.json", { signal: AbortSignal.abort() }))).toBe("unavailable");
  });

  it("draws latencies within their bounds, with the requested mean", () => {
    const random = seededRandom(3);
    expect(drawLatency({ kind: "none" }, random)).toBe(0);
    expect(drawLatency({ kind: "fixed", ms: 42 }, random)).toBe(42);
    const uniform = Array.from({ length: 1000 }, () =>
      drawLatency({ kind: "uniform", minMs: 20, maxMs: 30 }, random),
    );
    expect(Math.min(...uniform)).toBeGreaterThanOrEqual(20);
    expect(Math.max(...uniform)).toBeLessThan(30);
    const n = 20_000;
    const exponential = Array.from({ length: n }, () =>
      drawLatency({ kind: "exponential", meanMs: 50, minMs: 10, maxMs: 2000 }, random),
    );
    expect(Math.min(...exponential)).toBeGreaterThanOrEqual(10);
    expect(Math.max(...exponential)).toBeLessThanOrEqual(2000);
    const mean = exponential.reduce((a, b) => a + b, 0) / n;
    // min + mean of the tail; the standard error of the mean is 50 / sqrt(n) ~ 0.35 ms.
    expect(mean).toBeGreaterThan(58);
    expect(mean).toBeLessThan(62);
    const capped = drawLatency({ kind: "exponential", meanMs: 1e9, maxMs: 300 }, random);
    expect(capped).toBeLessThanOrEqual(300);
  });

  it("reports each injected fault with its call number", async () => {
    const { store, faults, clock } = make({
      rules: [{ id: "r", fault: "unavailable", rate: 1, ops: ["list"] }],
    });
    await store.get("q/a.json");
    await outcome(store.list("q/"));
    expect(faults).toEqual([
      { call: 2, op: "list", key: "q/", fault: "unavailable", ruleId: "r", latencyMs: 0, atMs: clock.now() },
    ]);
  });
});
