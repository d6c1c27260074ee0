import { backoffCap, backoffDelay } from "@casq/sdk/backoff.ts";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { FaultInjectingStore, type FaultKind, type FaultRule } from "../../testing/fault-injecting-store.ts";
import { ManualClock } from "../../testing/manual-clock.ts";
import type { Clock } from "../util/clock.ts";
import { type Random, seededRandom } from "../util/random.ts";
import { InstrumentedStore, type StoreOpEnd } from "./instrumented-store.ts";
import { MemoryStore } from "./memory-store.ts";
import {
  DEFAULT_RETRY_POLICY,
  type RetryEvent,
  RetryingStore,
  type RetryingStoreOptions,
  type RetryPolicy,
  resolveRetryPolicy,
} from "./retrying-store.ts";
import { isStoreError, StoreError } from "./store-errors.ts";

const bytes = (text: string) => new TextEncoder().encode(text);

/** A ManualClock that records every sleep it is asked for. */
class RecordingClock implements Clock {
  readonly sleeps: number[] = [];
  constructor(readonly manual = new ManualClock({ startMs: 0 })) {}
  now(): number {
    return this.manual.now();
  }
  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    this.sleeps.push(ms);
    return this.manual.sleep(ms, signal);
  }
}

interface Setup {
  readonly memory: MemoryStore;
  readonly faults: FaultInjectingStore;
  readonly store: RetryingStore;
  readonly clock: RecordingClock;
  readonly retries: RetryEvent[];
}

function setup(rules: FaultRule[], options: Omit<RetryingStoreOptions, "clock"> = {}): Setup {
  const memory = new MemoryStore();
  const clock = new RecordingClock();
  // The injector gets no latency and its own random, so the retry jitter stream is untouched.
  const faults = new FaultInjectingStore(memory, { rules, random: seededRandom(99) });
  const retries: RetryEvent[] = [];
  const store = new RetryingStore(faults, {
    clock,
    random: seededRandom(1),
    onRetry: (event) => retries.push(event),
    ...options,
  });
  return { memory, faults, store, clock, retries };
}

/** Runs `promise` to completion while driving the manual clock. */
async function drive<T>(clock: RecordingClock, promise: Promise<T>): Promise<T> {
  const settled = promise.then(
    (value) => ({ ok: true as const, value }),
    (error: unknown) => ({ ok: false as const, error }),
  );
  await clock.manual.runUntilIdle();
  const result = await settled;
  if (!result.ok) throw result.error;
  return result.value;
}

const noJitter: Partial<RetryPolicy> = { jitter: "none" };

describe("backoffDelay", () => {
  it("follows the default schedule: one immediate retry, then 50, 100, 200, 400, 800 ms caps", () => {
    const caps = [1, 2, 3, 4, 5, 6].map((attempt) => backoffCap(attempt, DEFAULT_RETRY_POLICY));
    expect(caps).toEqual([0, 50, 100, 200, 400, 800]);
    expect(backoffCap(7, DEFAULT_RETRY_POLICY)).toBe(1600);
    expect(backoffCap(8, DEFAULT_RETRY_POLICY)).toBe(2000);
    expect(backoffCap(1000, DEFAULT_RETRY_POLICY)).toBe(2000);
  });

  it("applies the jitter mode below the cap", () => {
    const half: Random = { next: () => 0.5 };
    const policy = resolveRetryPolicy();
    expect(backoffDelay(3, { ...policy, jitter: "none" }, half)).toBe(100);
    expect(backoffDelay(3, { ...policy, jitter: "full" }, half)).toBe(50);
    expect(backoffDelay(3, { ...policy, jitter: "equal" }, half)).toBe(75);
  });

  it("draws randomness only when it jitters a positive cap", () => {
    let draws = 0;
    const counting: Random = {
      next: () => {
        draws++;
        return 0.25;
      },
    };
    backoffDelay(1, DEFAULT_RETRY_POLICY, counting); // immediate
    backoffDelay(4, { ...DEFAULT_RETRY_POLICY, jitter: "none" }, counting);
    expect(draws).toBe(0);
    backoffDelay(4, DEFAULT_RETRY_POLICY, counting);
    expect(draws).toBe(1);
  });

  const policyArb = fc
    .record({
      maxAttempts: fc.integer({ min: 1, max: 20 }),
      immediateRetries: fc.integer({ min: 0, max: 5 }),
      baseDelayMs: fc.integer({ min: 0, max: 1000 }),
      extraMaxMs: fc.integer({ min: 0, max: 60_000 }),
      jitter: fc.constantFrom("full" as const, "equal" as const, "none" as const),
    })
    .map(({ extraMaxMs, ...rest }) =>
      resolveRetryPolicy({ ...rest, maxDelayMs: rest.baseDelayMs + extraMaxMs }),
    );

  it("always stays within [0, cap] and [0, maxDelayMs]", () => {
    fc.assert(
      fc.property(
        policyArb,
        fc.integer({ min: 1, max: 10_000 }),
        fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }),
        (policy, attempt, u) => {
          const delay = backoffDelay(attempt, policy, { next: () => u });
          const cap = backoffCap(attempt, policy);
          expect(delay).toBeGreaterThanOrEqual(0);
          expect(delay).toBeLessThanOrEqual(cap);
          expect(cap).toBeLessThanOrEqual(policy.maxDelayMs);
          if (policy.jitter === "equal") expect(delay).toBeGreaterThanOrEqual(cap / 2);
          if (attempt <= policy.immediateRetries) expect(delay).toBe(0);
        },
      ),
    );
  });

  it("has a cap that never decreases from one attempt to the next", () => {
    fc.assert(
      fc.property(policyArb, fc.integer({ min: 1, max: 200 }), (policy, attempt) => {
        expect(backoffCap(attempt + 1, policy)).toBeGreaterThanOrEqual(backoffCap(attempt, policy));
      }),
    );
  });

  it("rejects policies that cannot work", () => {
    expect(() => resolveRetryPolicy({ maxAttempts: 0 })).toThrow(RangeError);
    expect(() => resolveRetryPolicy({ maxAttempts: 1.5 })).toThrow(RangeError);
    expect(() => resolveRetryPolicy({ immediateRetries: -1 })).toThrow(RangeError);
    expect(() => resolveRetryPolicy({ baseDelayMs: -1 })).toThrow(RangeError);
    expect(() => resolveRetryPolicy({ baseDelayMs: 100, maxDelayMs: 50 })).toThrow(RangeError);
    expect(() => resolveRetryPolicy({ jitter: "some" as never })).toThrow(RangeError);
    expect(resolveRetryPolicy({ maxAttempts: undefined })).toEqual(DEFAULT_RETRY_POLICY);
  });
});

describe("RetryingStore", () => {
  it("retries unavailable puts: first retry immediate, then exponential backoff", async () => {
    const { store, clock, faults, memory, retries } = setup(
      [{ fault: "unavailable", rate: 1, ops: ["put"], limit: 4 }],
      { policy: noJitter },
    );
    const result = await drive(clock, store.put("q/a.json", bytes("v1"), { ifAbsent: true }));
    expect(faults.stats().calls.put).toBe(5);
    expect(clock.sleeps).toEqual([50, 100, 200]);
    expect(retries.map((r) => [r.op, r.attempt, r.delayMs])).toEqual([
      ["put", 1, 0],
      ["put", 2, 50],
      ["put", 3, 100],
      ["put", 4, 200],
    ]);
    expect((await memory.get("q/a.json"))?.etag).toBe(result.etag);
    expect(clock.now()).toBe(350);
  });

  it("sleeps the jittered delays backoffDelay computes for the same seed", async () => {
    const { store, clock } = setup([{ fault: "unavailable", rate: 1, ops: ["get"], limit: 5 }], {
      random: seededRandom(42),
    });
    await drive(clock, store.get("q/a.json"));
    const replay = seededRandom(42);
    const expected = [1, 2, 3, 4, 5]
      .map((attempt) => backoffDelay(attempt, DEFAULT_RETRY_POLICY, replay))
      .filter((ms) => ms > 0);
    expect(clock.sleeps).toEqual(expected);
    expect(clock.sleeps).toHaveLength(4);
  });

  it("retries reads, lists and deletes on unavailable too", async () => {
    const { store, clock, faults, memory } = setup([{ fault: "unavailable", rate: 1, limit: 1 }]);
    await memory.put("q/x.json", bytes("x"), { ifAbsent: true });
    const put = await memory.get("q/x.json");
    expect((await drive(clock, store.get("q/x.json")))?.etag).toBe(put?.etag);
    faults.addRule({ fault: "unavailable", rate: 1, ops: ["list"], limit: 2 });
    expect((await drive(clock, store.list("q/"))).map((o) => o.key)).toEqual(["q/x.json"]);
    faults.addRule({ fault: "unavailable", rate: 1, ops: ["delete"], limit: 1 });
    await drive(clock, store.delete("q/x.json", { ifMatch: put?.etag ?? "" }));
    expect(await memory.get("q/x.json")).toBeUndefined();
    expect(faults.stats().calls).toEqual({ get: 2, list: 3, delete: 2, put: 0 });
  });

  it("gives up after maxAttempts with an unavailable error naming the attempts", async () => {
    const { store, clock, faults } = setup([{ fault: "unavailable", rate: 1 }], { policy: noJitter });
    const error = await drive(clock, store.put("q/a.json", bytes("v"), { ifAbsent: true })).catch(
      (e: unknown) => e,
    );
    expect(isStoreError(error, "unavailable")).toBe(true);
    expect((error as Error).message).toMatch(/gave up after 7 attempts/);
    expect((error as Error).cause).toBeInstanceOf(StoreError);
    expect(faults.stats().calls.put).toBe(7);
    expect(clock.sleeps).toEqual([50, 100, 200, 400, 800]);
  });

  it("honours a custom policy", async () => {
    const { store, clock, faults } = setup([{ fault: "unavailable", rate: 1 }], {
      policy: { maxAttempts: 4, immediateRetries: 2, baseDelayMs: 10, maxDelayMs: 15, jitter: "none" },
    });
    await expect(drive(clock, store.get("k"))).rejects.toThrow(/gave up after 4 attempts/);
    expect(faults.stats().calls.get).toBe(4);
    expect(clock.sleeps).toEqual([10]);
    const once = setup([{ fault: "unavailable", rate: 1 }], { policy: { maxAttempts: 1 } });
    await expect(drive(once.clock, once.store.get("k"))).rejects.toThrow(/gave up after 1 attempt;/);
    expect(once.faults.stats().calls.get).toBe(1);
  });

  const neverRetried: FaultKind[] = ["conflict", "ambiguous_applied", "ambiguous_not_applied"];
  for (const fault of neverRetried) {
    it(`never retries ${fault}`, async () => {
      const { store, clock, faults, retries } = setup([{ fault, rate: 1, ops: ["put"] }]);
      const error = await drive(clock, store.put("q/a.json", bytes("v"), { ifAbsent: true })).catch(
        (e: unknown) => e,
      );
      expect(isStoreError(error)).toBe(true);
      expect((error as StoreError).kind).toBe(fault === "conflict" ? "conflict" : "ambiguous");
      expect(faults.stats().calls.put).toBe(1);
      expect(clock.sleeps).toEqual([]);
      expect(retries).toEqual([]);
    });
  }

  it("never retries a lost CAS race (precondition_failed)", async () => {
    const { store, clock, faults, memory } = setup([]);
    await memory.put("q/a.json", bytes("v1"), { ifAbsent: true });
    await expect(drive(clock, store.put("q/a.json", bytes("v2"), { ifMatch: '"stale"' }))).rejects.toSatisfy(
      (e) => isStoreError(e, "precondition_failed"),
    );
    expect(faults.stats().calls.put).toBe(1);
    expect(clock.sleeps).toEqual([]);
  });

  it("never retries an invalid request", async () => {
    const { store, clock, faults } = setup([]);
    await expect(drive(clock, store.get("../escape"))).rejects.toSatisfy((e) => isStoreError(e, "invalid"));
    expect(faults.stats().calls.get).toBe(1);
  });

  it("passes non-store errors through untouched", async () => {
    const boom = new TypeError("bug");
    const inner = new MemoryStore();
    inner.get = () => Promise.reject(boom);
    const store = new RetryingStore(inner, { clock: new ManualClock() });
    await expect(store.get("k")).rejects.toBe(boom);
  });

  it("stops retrying when the call is aborted during backoff", async () => {
    const { store, clock, faults } = setup([{ fault: "unavailable", rate: 1 }], { policy: noJitter });
    const controller = new AbortController();
    const settled = store.get("q/a.json", { signal: controller.signal }).catch((e: unknown) => e);
    await clock.manual.advanceBy(60); // attempt 1, immediate attempt 2, 50 ms, attempt 3, now sleeping 100 ms
    expect(faults.stats().calls.get).toBe(3);
    expect(clock.manual.pendingTimers()).toBe(1);
    controller.abort(new Error("client went away"));
    const error = await settled;
    expect(isStoreError(error, "unavailable")).toBe(true);
    expect((error as Error).message).toMatch(/stopped retrying after 3 attempts: the call was aborted/);
    expect(clock.manual.pendingTimers()).toBe(0);
    await clock.manual.runUntilIdle();
    expect(faults.stats().calls.get).toBe(3);
  });

  it("does not retry a call whose signal was aborted before it started", async () => {
    const { store, clock, faults } = setup([]);
    const error = await drive(clock, store.get("q/a.json", { signal: AbortSignal.abort() })).catch(
      (e: unknown) => e,
    );
    expect(isStoreError(error, "unavailable")).toBe(true);
    expect(faults.stats().calls.get).toBe(1);
    expect(clock.sleeps).toEqual([]);
  });

  it("stops pending backoffs when closed", async () => {
    const { store, clock } = setup([{ fault: "unavailable", rate: 1 }], { policy: noJitter });
    const settled = store.get("q/a.json").catch((e: unknown) => e);
    await clock.manual.advanceBy(10);
    expect(clock.manual.pendingTimers()).toBe(1);
    await store.close();
    const error = await settled;
    expect(isStoreError(error, "unavailable")).toBe(true);
    expect((error as Error).message).toMatch(/the store is closing/);
  });

  it("tells an instrumented store inside which attempt each request is", async () => {
    const memory = new MemoryStore();
    const clock = new RecordingClock();
    const faults = new FaultInjectingStore(memory, {
      rules: [{ fault: "unavailable", rate: 1, limit: 2 }],
      random: seededRandom(5),
    });
    const ends: StoreOpEnd[] = [];
    const instrumented = new InstrumentedStore(faults, { clock, observer: { onEnd: (e) => ends.push(e) } });
    const store = new RetryingStore(instrumented, { clock, random: seededRandom(6) });
    await drive(clock, store.put("q/a.json", bytes("abc"), { ifAbsent: true }));
    expect(ends.map((e) => [e.attempt, e.outcome])).toEqual([
      [1, "unavailable"],
      [2, "unavailable"],
      [3, "ok"],
    ]);
  });

  it("keeps retrying if an onRetry hook throws", async () => {
    const { store, clock, faults } = setup([{ fault: "unavailable", rate: 1, limit: 2 }], {
      onRetry: () => {
        throw new Error("logging broke");
      },
    });
    await drive(clock, store.get("q/a.json"));
    expect(faults.stats().calls.get).toBe(3);
  });
});
