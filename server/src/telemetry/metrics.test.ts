import { Code } from "@connectrpc/connect";
import { Registry } from "prom-client";
import { describe, expect, it } from "vitest";
import { makeBroker } from "../../testing/broker-test-support.ts";
import { InstrumentedStore } from "../store/instrumented-store.ts";
import { MemoryStore } from "../store/memory-store.ts";
import { brokerMetricsObserver, createBrokerRefresher } from "./broker-metrics.ts";
import { CasqMetrics } from "./metrics.ts";
import { codeName } from "./rpc-metrics.ts";
import { storeMetricsObserver } from "./store-metrics.ts";

/** A fresh registry per test, without process metrics (they are slow to set up and irrelevant here). */
function freshMetrics(): CasqMetrics {
  return new CasqMetrics({ registry: new Registry(), defaultMetrics: false });
}

async function value(
  metrics: CasqMetrics,
  name: string,
  labels: Record<string, string> = {},
): Promise<number | undefined> {
  const metric = metrics.registry.getSingleMetric(name);
  if (!metric) throw new Error(`no metric ${name}`);
  const data = await metric.get();
  let total: number | undefined;
  for (const v of data.values) {
    const l = v.labels as Record<string, string | number>;
    if (Object.entries(labels).every(([k, want]) => String(l[k]) === want)) total = (total ?? 0) + v.value;
  }
  return total;
}

const enc = (s: string) => new TextEncoder().encode(s);

describe("storeMetricsObserver", () => {
  it("counts operations by outcome, bytes by direction, and durations", async () => {
    const metrics = freshMetrics();
    const store = new InstrumentedStore(new MemoryStore(), { observer: storeMetricsObserver(metrics) });
    const put = await store.put("a", enc("hello"), { ifAbsent: true });
    await store.get("a");
    await store.get("missing");
    await expect(store.put("a", enc("x"), { ifMatch: `${put.etag}-stale` })).rejects.toThrow();
    await store.list("");

    expect(await value(metrics, "casq_store_operations_total", { op: "put", outcome: "ok" })).toBe(1);
    expect(
      await value(metrics, "casq_store_operations_total", { op: "put", outcome: "precondition_failed" }),
    ).toBe(1);
    expect(await value(metrics, "casq_store_operations_total", { op: "get", outcome: "ok" })).toBe(1);
    expect(await value(metrics, "casq_store_operations_total", { op: "get", outcome: "not_found" })).toBe(1);
    expect(await value(metrics, "casq_store_operations_total", { op: "list", outcome: "ok" })).toBe(1);
    expect(await value(metrics, "casq_store_bytes_total", { op: "put", direction: "out" })).toBe(6);
    expect(await value(metrics, "casq_store_bytes_total", { op: "get", direction: "in" })).toBe(5);
    const text = await metrics.registry.metrics();
    expect(text).toMatch(/casq_store_operation_duration_seconds_count\{op="put"\} 2/);
    expect(text).not.toContain('"a"'); // keys never become labels
  });
});

describe("brokerMetricsObserver", () => {
  it("feeds commits, batch sizes, operations, conflicts and leadership", async () => {
    const metrics = freshMetrics();
    const observer = brokerMetricsObserver(metrics);
    observer.onCommit?.({
      queue: "q",
      shard: 0,
      epoch: 3,
      operations: 4,
      opsByKind: { enqueue: 3, ack: 1 },
      casAttempts: 2,
      outcome: "ok",
      documentBytes: 1234,
      durationMs: 150,
    });
    observer.onCommit?.({
      queue: "q",
      shard: 0,
      epoch: 3,
      operations: 1,
      opsByKind: { read: 1 },
      casAttempts: 0,
      outcome: "no_write",
      documentBytes: 0,
      durationMs: 0,
    });
    observer.onCasAttempt?.({ queue: "q", shard: 0, attempt: 1, outcome: "precondition_failed" });
    expect(await value(metrics, "casq_document_bytes", { queue: "q", shard: "0" })).toBe(1234);
    observer.onLeadership?.({ queue: "q", shard: 1, event: "acquired" });
    observer.onLeadership?.({ queue: "q", shard: 0, event: "lost" });

    expect(await value(metrics, "casq_commits_total", { queue: "q", shard: "0", outcome: "ok" })).toBe(1);
    expect(await value(metrics, "casq_commits_total", { outcome: "no_write" })).toBe(1);
    expect(await value(metrics, "casq_operations_total", { queue: "q", kind: "enqueue" })).toBe(3);
    expect(await value(metrics, "casq_operations_total", { kind: "ack" })).toBe(1);
    expect(await value(metrics, "casq_cas_conflicts_total", { kind: "precondition_failed" })).toBe(1);
    // The size of a document another broker now writes is that broker's to report.
    expect(await value(metrics, "casq_document_bytes", { queue: "q", shard: "0" })).toBeUndefined();
    expect(await value(metrics, "casq_shard_epoch", { queue: "q", shard: "0" })).toBe(3);
    expect(await value(metrics, "casq_shard_leader", { shard: "1" })).toBe(1);
    expect(await value(metrics, "casq_shard_leader", { shard: "0" })).toBe(0);
    expect(await value(metrics, "casq_leadership_changes_total", { event: "acquired" })).toBe(1);
    const text = await metrics.registry.metrics();
    expect(text).toMatch(/casq_commit_duration_seconds_sum\{queue="q",shard="0"\} 0\.15/);
    expect(text).toMatch(/casq_commit_batch_operations_count\{queue="q",shard="0"\} 2/);
  });
});

describe("createBrokerRefresher", () => {
  it("samples the page cache of segment bodies: its bytes, and evictions as a counter", async () => {
    const metrics = freshMetrics();
    let cache = { bytes: 1000, evictions: 2 };
    metrics.setRefresher(
      createBrokerRefresher(metrics, {
        broker: { openShards: () => [], segmentCacheStats: () => cache },
        now: () => Date.now(),
      }),
    );
    await metrics.scrape();
    expect(await value(metrics, "casq_segment_cache_bytes", {})).toBe(1000);
    expect(await value(metrics, "casq_segment_cache_evictions_total", {})).toBe(2);
    cache = { bytes: 500, evictions: 5 };
    await metrics.scrape();
    expect(await value(metrics, "casq_segment_cache_bytes", {})).toBe(500);
    expect(await value(metrics, "casq_segment_cache_evictions_total", {})).toBe(5);
  });

  it("samples queue state, pending ops and leadership of led shards at scrape time", async () => {
    const metrics = freshMetrics();
    const broker = makeBroker(new MemoryStore(), "a", { observer: brokerMetricsObserver(metrics) });
    try {
      await broker.enqueue("jobs", [
        { payload: enc("1") },
        { payload: enc("2") },
        { payload: enc("3"), runAt: Date.now() + 60_000 },
      ]);
      const [delivery] = await broker.claim("jobs", { subscription: "default", workerId: "w", max: 1 });
      expect(delivery).toBeDefined();
      const streams = new Map([["jobs/default", 2]]);
      metrics.setRefresher(
        createBrokerRefresher(metrics, {
          broker,
          work: { activeWorkers: 1, streamsBySubscription: () => streams },
          now: () => Date.now(),
        }),
      );
      await metrics.scrape();
      const sub = { queue: "jobs", subscription: "default" };
      expect(await value(metrics, "casq_queue_depth", sub)).toBe(1);
      expect(await value(metrics, "casq_queue_in_flight", sub)).toBe(1);
      expect(await value(metrics, "casq_queue_delayed", sub)).toBe(1);
      expect(await value(metrics, "casq_queue_dead", sub)).toBe(0);
      expect(await value(metrics, "casq_enqueued_total", sub)).toBe(3);
      expect(await value(metrics, "casq_delivered_total", sub)).toBe(1);
      expect(await value(metrics, "casq_queue_oldest_message_age_seconds", sub)).toBeGreaterThanOrEqual(0);
      expect(await value(metrics, "casq_shard_leader", { queue: "jobs", shard: "0" })).toBe(1);
      expect(await value(metrics, "casq_shard_epoch", { queue: "jobs", shard: "0" })).toBeGreaterThanOrEqual(
        1,
      );
      expect(await value(metrics, "casq_pending_operations", { queue: "jobs", shard: "0" })).toBe(0);
      expect(await value(metrics, "casq_worker_streams_open", sub)).toBe(2);
      expect(await value(metrics, "casq_workers_active")).toBe(1);

      if (delivery)
        await broker.ack("jobs", "default", [{ shard: delivery.shard, ...delivery.message.receipt }]);
      await metrics.scrape();
      expect(await value(metrics, "casq_queue_in_flight", sub)).toBe(0);
      expect(await value(metrics, "casq_acked_total", sub)).toBe(1);
    } finally {
      await broker.stop({ release: true });
    }
  });

  it("bounds a scrape when a shard read hangs, keeping the last stats", async () => {
    const metrics = freshMetrics();
    let hang = false;
    const stats = {
      queue: "q",
      shard: 0,
      currentMode: "leading",
      brokerRecord: { id: "b", address: "x:1", epoch: 7, leaseUntil: 0 },
      pendingCount: 5,
      read<T>(read: (state: never) => T): Promise<T> {
        if (hang) return new Promise<T>(() => {});
        return Promise.resolve(read(undefined as never));
      },
    };
    // A read that never settles must not hang the scrape.
    hang = true;
    metrics.setRefresher(
      createBrokerRefresher(metrics, {
        broker: { openShards: () => [stats] },
        now: () => 0,
        readTimeoutMs: 20,
      }),
    );
    // The hanging read times out per shard (counted below) instead of stalling the whole scrape.
    await metrics.scrape(1_000);
    expect(await value(metrics, "casq_pending_operations", { queue: "q", shard: "0" })).toBe(5);
    expect(await value(metrics, "casq_shard_epoch", { queue: "q", shard: "0" })).toBe(7);
    expect(await value(metrics, "casq_queue_depth")).toBeUndefined();
  });

  it("removes a shard's series: document size when it stops being led, the rest when stale or dropped", async () => {
    const metrics = freshMetrics();
    const observer = brokerMetricsObserver(metrics);
    const shard = (queue: string, mode: string) => ({
      queue,
      shard: 0,
      currentMode: mode,
      brokerRecord: undefined,
      pendingCount: 0,
      read: <T>(): Promise<T> => Promise.reject(new Error("no stats here")),
    });
    const commit = (queue: string) =>
      observer.onCommit?.({
        queue,
        shard: 0,
        epoch: 1,
        operations: 1,
        opsByKind: { enqueue: 1 },
        casAttempts: 1,
        outcome: "ok",
        documentBytes: 100,
        durationMs: 1,
      });
    let open = [shard("moved", "leading"), shard("deleted", "leading")];
    let now = 1_000;
    metrics.setRefresher(
      createBrokerRefresher(metrics, {
        broker: { openShards: () => open },
        now: () => now,
        staleSeriesMs: 60_000,
      }),
    );
    commit("moved");
    commit("deleted");
    await metrics.scrape();
    expect(await value(metrics, "casq_document_bytes", { queue: "moved" })).toBe(100);

    // Another broker took "moved"; "deleted" was deleted through this broker (its leader dropped).
    open = [shard("moved", "following")];
    await metrics.scrape();
    expect(await value(metrics, "casq_document_bytes", { queue: "moved" })).toBeUndefined();
    expect(await value(metrics, "casq_commits_total", { queue: "moved" })).toBe(1);
    expect(await value(metrics, "casq_operations_total", { queue: "moved" })).toBe(1);
    for (const name of ["casq_document_bytes", "casq_commits_total", "casq_operations_total"])
      expect(await value(metrics, name, { queue: "deleted" }), name).toBeUndefined();

    now += 59_999;
    await metrics.scrape();
    expect(await value(metrics, "casq_commits_total", { queue: "moved" })).toBe(1);
    now += 1;
    await metrics.scrape();
    expect(await value(metrics, "casq_commits_total", { queue: "moved" })).toBeUndefined();
    expect(await value(metrics, "casq_operations_total", { queue: "moved" })).toBeUndefined();
    expect(await value(metrics, "casq_commit_duration_seconds", { queue: "moved" })).toBeUndefined();

    // Led again: its series come back from zero.
    open = [shard("moved", "leading")];
    commit("moved");
    await metrics.scrape();
    expect(await value(metrics, "casq_commits_total", { queue: "moved" })).toBe(1);
  });

  it("counts scrapes whose refresh ran out of time", async () => {
    const metrics = freshMetrics();
    metrics.setRefresher(() => new Promise(() => {}));
    await metrics.scrape(10);
    expect(await value(metrics, "casq_metrics_refresh_timeouts_total")).toBe(1);
  });
});

describe("CasqMetrics", () => {
  it("prefixes every family, including process metrics, with casq_", async () => {
    const metrics = new CasqMetrics({ registry: new Registry() });
    const names = metrics.registry.getMetricsAsArray().map((m) => m.name);
    expect(names.length).toBeGreaterThan(30);
    for (const name of names) expect(name).toMatch(/^casq_[a-z0-9_]+$/);
    expect(names).toContain("casq_process_cpu_seconds_total");
  });

  it("names gRPC codes the gRPC way", () => {
    expect(codeName(Code.DeadlineExceeded)).toBe("deadline_exceeded");
    expect(codeName(Code.Unavailable)).toBe("unavailable");
  });
});
