import { describe, expect, it } from "vitest";
import { FaultInjectingStore } from "../../testing/fault-injecting-store.ts";
import { ManualClock } from "../../testing/manual-clock.ts";
import { seededRandom } from "../util/random.ts";
import {
  combineObservers,
  InstrumentedStore,
  type StoreObserver,
  type StoreOpEnd,
  type StoreOpStart,
} from "./instrumented-store.ts";
import { MemoryStore } from "./memory-store.ts";

const bytes = (text: string) => new TextEncoder().encode(text);

function make(
  options: { latencyMs?: number; observer?: StoreObserver; onObserverError?: (e: unknown) => void } = {},
) {
  const memory = new MemoryStore();
  const clock = new ManualClock({ startMs: 1000 });
  const faults = new FaultInjectingStore(memory, {
    clock,
    random: seededRandom(1),
    latency: { kind: "fixed", ms: options.latencyMs ?? 0 },
  });
  const starts: StoreOpStart[] = [];
  const ends: StoreOpEnd[] = [];
  const recorder: StoreObserver = { onStart: (s) => void starts.push(s), onEnd: (e) => void ends.push(e) };
  const store = new InstrumentedStore(faults, {
    clock,
    observer: options.observer ? combineObservers(recorder, options.observer) : recorder,
    ...(options.onObserverError ? { onObserverError: options.onObserverError } : {}),
  });
  return { memory, clock, faults, store, starts, ends };
}

describe("InstrumentedStore", () => {
  it("reports each operation with its outcome, bytes and etags", async () => {
    const { store, starts, ends } = make();
    expect(await store.get("q/a.json")).toBeUndefined();
    const created = await store.put("q/a.json", bytes("hello"), { ifAbsent: true });
    const read = await store.get("q/a.json");
    const updated = await store.put("q/a.json", bytes("hello, world"), { ifMatch: created.etag });
    await store.put("q/a.json", bytes("late"), { ifMatch: created.etag }).catch(() => undefined);
    expect(await store.list("q/")).toHaveLength(1);
    await store.delete("q/a.json", { ifMatch: updated.etag });

    expect(starts.map((s) => s.op)).toEqual(["get", "put", "get", "put", "put", "list", "delete"]);
    const summary = ends.map((e) => ({
      op: e.op,
      key: e.key,
      outcome: e.outcome,
      condition: e.condition,
      bytesOut: e.bytesOut,
      bytesIn: e.bytesIn,
      etagBefore: e.etagBefore,
      etagAfter: e.etagAfter,
      itemCount: e.itemCount,
    }));
    expect(summary).toEqual([
      {
        op: "get",
        key: "q/a.json",
        outcome: "not_found",
        condition: "none",
        bytesOut: 0,
        bytesIn: 0,
        etagBefore: undefined,
        etagAfter: undefined,
        itemCount: undefined,
      },
      {
        op: "put",
        key: "q/a.json",
        outcome: "ok",
        condition: "if_absent",
        bytesOut: 5,
        bytesIn: 0,
        etagBefore: undefined,
        etagAfter: created.etag,
        itemCount: undefined,
      },
      {
        op: "get",
        key: "q/a.json",
        outcome: "ok",
        condition: "none",
        bytesOut: 0,
        bytesIn: 5,
        etagBefore: undefined,
        etagAfter: read?.etag,
        itemCount: undefined,
      },
      {
        op: "put",
        key: "q/a.json",
        outcome: "ok",
        condition: "if_match",
        bytesOut: 12,
        bytesIn: 0,
        etagBefore: created.etag,
        etagAfter: updated.etag,
        itemCount: undefined,
      },
      {
        op: "put",
        key: "q/a.json",
        outcome: "precondition_failed",
        condition: "if_match",
        bytesOut: 4,
        bytesIn: 0,
        etagBefore: created.etag,
        etagAfter: undefined,
        itemCount: undefined,
      },
      {
        op: "list",
        key: "q/",
        outcome: "ok",
        condition: "none",
        bytesOut: 0,
        bytesIn: 0,
        etagBefore: undefined,
        etagAfter: undefined,
        itemCount: 1,
      },
      {
        op: "delete",
        key: "q/a.json",
        outcome: "ok",
        condition: "if_match",
        bytesOut: 0,
        bytesIn: 0,
        etagBefore: updated.etag,
        etagAfter: undefined,
        itemCount: undefined,
      },
    ]);
    expect(ends[4]?.error).toBeInstanceOf(Error);
    expect(ends[0]?.error).toBeUndefined();
    for (const [i, end] of ends.entries()) expect(end.start).toBe(starts[i]);
  });

  it("reports store error kinds and non-store errors", async () => {
    const { store, faults, ends } = make();
    await store.get("../bad").catch(() => undefined);
    faults.addRule({ fault: "ambiguous_applied", rate: 1, limit: 1 });
    await store.put("q/a.json", bytes("x"), { ifAbsent: true }).catch(() => undefined);
    faults.addRule({ fault: "conflict", rate: 1, limit: 1 });
    await store.put("q/a.json", bytes("x"), { ifAbsent: true }).catch(() => undefined);
    faults.addRule({ fault: "unavailable", rate: 1, limit: 1, ops: ["list"] });
    await store.list("q/").catch(() => undefined);
    const broken = new MemoryStore();
    broken.get = () => Promise.reject(new TypeError("bug"));
    const seen: StoreOpEnd[] = [];
    await new InstrumentedStore(broken, { observer: { onEnd: (e) => void seen.push(e) } })
      .get("k")
      .catch(() => undefined);
    expect(ends.map((e) => e.outcome)).toEqual(["invalid", "ambiguous", "conflict", "unavailable"]);
    expect(seen.map((e) => e.outcome)).toEqual(["error"]);
  });

  it("measures durations on the injected clock", async () => {
    const { store, clock, ends } = make({ latencyMs: 120 });
    const put = store.put("q/a.json", bytes("x"), { ifAbsent: true });
    await clock.runUntilIdle();
    await put;
    expect(ends[0]).toMatchObject({ startedAtMs: 1000, durationMs: 120, outcome: "ok" });
  });

  it("hands each call's end event to the finisher its onStart returned", async () => {
    const spans: string[] = [];
    const tracer: StoreObserver = {
      onStart: (start) => {
        const name = `${start.op} ${start.key}`;
        spans.push(`start ${name}`);
        return (end) => void spans.push(`end ${name} ${end.outcome}`);
      },
    };
    const { store } = make({ observer: tracer });
    await store.get("q/a.json");
    await store.put("q/a.json", bytes("x"), { ifAbsent: true });
    expect(spans).toEqual([
      "start get q/a.json",
      "end get q/a.json not_found",
      "start put q/a.json",
      "end put q/a.json ok",
    ]);
  });

  it("runs the inner call inside around hooks, first observer outermost", async () => {
    const trail: string[] = [];
    const wrap =
      (name: string): StoreObserver["around"] =>
      async (start, run) => {
        trail.push(`${name}>${start.op}`);
        try {
          return await run();
        } finally {
          trail.push(`<${name}`);
        }
      };
    const { store } = make({
      observer: combineObservers({ around: wrap("outer") }, { around: wrap("inner") }),
    });
    await store.get("q/a.json");
    expect(trail).toEqual(["outer>get", "inner>get", "<inner", "<outer"]);
  });

  it("reports the attempt number a wrapper above passes down", async () => {
    const { store, starts } = make();
    await store.get("q/a.json", { attempt: 3 });
    await store.get("q/a.json");
    expect(starts.map((s) => s.attempt)).toEqual([3, undefined]);
  });

  it("is unaffected by an observer that throws", async () => {
    const errors: unknown[] = [];
    const { store, memory } = make({
      observer: {
        onStart: () => {
          throw new Error("start broke");
        },
        onEnd: () => {
          throw new Error("end broke");
        },
      },
      onObserverError: (e) => errors.push(e),
    });
    const { etag } = await store.put("q/a.json", bytes("x"), { ifAbsent: true });
    expect((await memory.get("q/a.json"))?.etag).toBe(etag);
    expect(errors.map((e) => (e as Error).message)).toEqual(["start broke", "end broke"]);
  });

  it("is transparent: same description, close reaches the inner store", async () => {
    const memory = new MemoryStore();
    let closed = false;
    memory.close = async () => {
      closed = true;
    };
    const store = new InstrumentedStore(memory);
    expect(store.description).toBe("memory:");
    await store.close();
    expect(closed).toBe(true);
  });
});
