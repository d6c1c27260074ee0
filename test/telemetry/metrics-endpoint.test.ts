/**
 * The metrics endpoint end to end in one process: a real casq server on a
 * memory store with `metricsListen`, a real gRPC client running a small
 * workload, and `GET /metrics` over HTTP, parsed strictly.
 */
import { afterEach, describe, expect, it } from "vitest";
import { type RunningCasqServer, startCasqServer } from "../../server/src/service/casq-server.ts";
import { bytes, grpcClients, quietLogger } from "../service/support.ts";
import { type Exposition, parseExposition, sampleValue } from "./exposition.ts";

let server: RunningCasqServer | undefined;
afterEach(async () => {
  await server?.close({ graceful: false });
  server = undefined;
});

async function scrape(address: string) {
  const res = await fetch(`http://${address}/metrics`);
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toContain("text/plain");
  return parseExposition(await res.text());
}

describe("GET /metrics", () => {
  it("reports the workload: store calls, commits, RPCs, queue state and leadership", async () => {
    server = await startCasqServer({
      store: "memory:",
      listen: "127.0.0.1:0",
      metricsListen: "127.0.0.1:0",
      logger: quietLogger,
    });
    expect(server.metricsAddress).toMatch(/^127\.0\.0\.1:\d+$/);
    const { queue } = grpcClients(server.address);
    const enqueued = 7;
    for (let i = 0; i < enqueued; i++)
      await queue.enqueue({ queue: "mail", messages: [{ payload: bytes(`m${i}`) }] });
    const claimed = await queue.claim({ queue: "mail", workerId: "w1", maxMessages: 3 });
    expect(claimed.messages).toHaveLength(3);
    await queue.ack({ queue: "mail", receipts: claimed.messages.slice(0, 2).map((m) => m.receipt) });
    const acked = 2;

    const metrics = await scrape(server.metricsAddress as string);

    // Every family a broker declares is typed and documented.
    for (const name of [
      "casq_store_operations_total",
      "casq_store_operation_duration_seconds",
      "casq_store_bytes_total",
      "casq_commit_duration_seconds",
      "casq_commit_batch_operations",
      "casq_commits_total",
      "casq_cas_conflicts_total",
      "casq_operations_total",
      "casq_pending_operations",
      "casq_document_bytes",
      "casq_segment_cache_bytes",
      "casq_segment_cache_evictions_total",
      "casq_rpc_requests_total",
      "casq_rpc_duration_seconds",
      "casq_queue_depth",
      "casq_queue_in_flight",
      "casq_queue_delayed",
      "casq_queue_dead",
      "casq_queue_oldest_message_age_seconds",
      "casq_enqueued_total",
      "casq_acked_total",
      "casq_redeliveries_total",
      "casq_dead_lettered_total",
      "casq_consumer_lag_messages",
      "casq_lease_expiries_total",
      "casq_nacks_total",
      "casq_repeat_deliveries_total",
      "casq_claim_to_ack_seconds",
      "casq_worker_streams_open",
      "casq_workers_active",
      "casq_shard_leader",
      "casq_shard_epoch",
      "casq_leadership_changes_total",
      "casq_process_cpu_seconds_total",
      "casq_nodejs_eventloop_lag_seconds",
    ]) {
      expect(metrics.types.has(name), name).toBe(true);
      expect(metrics.help.get(name), name).toBeTruthy();
    }
    expect(metrics.types.get("casq_commit_duration_seconds")).toBe("histogram");
    expect(metrics.types.get("casq_queue_depth")).toBe("gauge");
    expect(metrics.types.get("casq_enqueued_total")).toBe("counter");

    const sub = { queue: "mail", subscription: "default" };
    expect(sampleValue(metrics, "casq_enqueued_total", sub)).toBe(enqueued);
    expect(sampleValue(metrics, "casq_acked_total", sub)).toBe(acked);
    expect(sampleValue(metrics, "casq_queue_depth", sub)).toBe(enqueued - 3);
    expect(sampleValue(metrics, "casq_queue_in_flight", sub)).toBe(1);
    // Ready + in flight = enqueued - acked.
    expect(
      (sampleValue(metrics, "casq_queue_depth", sub) ?? 0) +
        (sampleValue(metrics, "casq_queue_in_flight", sub) ?? 0),
    ).toBe(enqueued - acked);
    expect(sampleValue(metrics, "casq_queue_dead", sub)).toBe(0);
    expect(sampleValue(metrics, "casq_queue_oldest_message_age_seconds", sub)).toBeGreaterThanOrEqual(0);

    expect(sampleValue(metrics, "casq_store_operations_total", { op: "put", outcome: "ok" })).toBeGreaterThan(
      0,
    );
    expect(sampleValue(metrics, "casq_store_bytes_total", { op: "put", direction: "out" })).toBeGreaterThan(
      0,
    );
    expect(
      sampleValue(metrics, "casq_store_operation_duration_seconds_count", { op: "put" }),
    ).toBeGreaterThan(0);

    const shard = { queue: "mail", shard: "0" };
    expect(sampleValue(metrics, "casq_shard_leader", shard)).toBe(1);
    expect(sampleValue(metrics, "casq_shard_epoch", shard)).toBeGreaterThanOrEqual(1);
    expect(sampleValue(metrics, "casq_leadership_changes_total", { ...shard, event: "acquired" })).toBe(1);
    expect(sampleValue(metrics, "casq_commits_total", { ...shard, outcome: "ok" })).toBeGreaterThanOrEqual(
      enqueued,
    );
    expect(sampleValue(metrics, "casq_operations_total", { queue: "mail", kind: "enqueue" })).toBe(enqueued);
    expect(sampleValue(metrics, "casq_operations_total", { queue: "mail", kind: "ack" })).toBe(1);
    expect(sampleValue(metrics, "casq_pending_operations", shard)).toBe(0);
    expect(sampleValue(metrics, "casq_document_bytes", shard)).toBeGreaterThan(0);
    expect(sampleValue(metrics, "casq_commit_duration_seconds_count", shard)).toBeGreaterThan(0);
    expect(
      sampleValue(metrics, "casq_commit_batch_operations_bucket", { ...shard, le: "+Inf" }),
    ).toBeGreaterThan(0);

    expect(sampleValue(metrics, "casq_rpc_requests_total", { method: "Enqueue", code: "ok" })).toBe(enqueued);
    expect(sampleValue(metrics, "casq_rpc_duration_seconds_count", { method: "Enqueue" })).toBe(enqueued);
    expect(sampleValue(metrics, "casq_workers_active")).toBe(0);

    // No message ids, payloads or store keys as label values.
    for (const s of metrics.samples)
      for (const v of Object.values(s.labels)) expect(v).not.toMatch(/queues\/|\.json|^m\d$/);
  });

  it("drops every series of a deleted queue and keeps the others", async () => {
    server = await startCasqServer({
      store: "memory:",
      listen: "127.0.0.1:0",
      metricsListen: "127.0.0.1:0",
      logger: quietLogger,
    });
    const { queue, admin } = grpcClients(server.address);
    for (const name of ["gone", "kept"]) {
      await queue.enqueue({ queue: name, messages: [{ payload: bytes("a") }, { payload: bytes("b") }] });
      const claimed = await queue.claim({ queue: name, workerId: "w1", maxMessages: 2 });
      await queue.ack({ queue: name, receipts: [claimed.messages[0]?.receipt ?? ""] });
      await queue.nack({ queue: name, receipts: [claimed.messages[1]?.receipt ?? ""] });
    }
    const seriesOf = (metrics: Exposition, name: string) =>
      metrics.samples.filter((s) => s.labels.queue === name).map((s) => s.name);
    const before = await scrape(server.metricsAddress as string);
    for (const name of [
      "casq_document_bytes",
      "casq_commits_total",
      "casq_commit_duration_seconds_count",
      "casq_operations_total",
      "casq_leadership_changes_total",
      "casq_claim_to_ack_seconds_count",
      "casq_nacks_total",
      "casq_queue_depth",
    ])
      expect(seriesOf(before, "gone"), name).toContain(name);

    await admin.deleteQueue({ queue: "gone", force: true });

    const after = await scrape(server.metricsAddress as string);
    expect(seriesOf(after, "gone")).toEqual([]);
    // The other queue keeps all of its series.
    expect(new Set(seriesOf(after, "kept"))).toEqual(new Set(seriesOf(before, "kept")));
    expect(sampleValue(after, "casq_document_bytes", { queue: "kept", shard: "0" })).toBeGreaterThan(0);
  });

  it("counts lease expiries apart from nacks, repeated deliveries, claim-to-ack time and consumer lag", async () => {
    server = await startCasqServer({
      store: "memory:",
      listen: "127.0.0.1:0",
      metricsListen: "127.0.0.1:0",
      logger: quietLogger,
    });
    const address = server.metricsAddress as string;
    const { queue } = grpcClients(server.address);
    await queue.enqueue({
      queue: "jobs",
      messages: ["a", "b", "c", "d", "e"].map((p) => ({ payload: bytes(p) })),
    });
    const sub = { queue: "jobs", subscription: "default" };
    expect(sampleValue(await scrape(address), "casq_consumer_lag_messages", sub)).toBe(5);

    // One lease runs out (no heartbeat), one is nacked, one is acked.
    const [expiring] = (
      await queue.claim({ queue: "jobs", workerId: "w1", maxMessages: 1, leaseTtl: { nanos: 100_000_000 } })
    ).messages;
    const [nacked, acked] = (await queue.claim({ queue: "jobs", workerId: "w1", maxMessages: 2 })).messages;
    await queue.nack({ queue: "jobs", receipts: [nacked?.receipt ?? ""], delay: { seconds: 0n } });
    await queue.ack({ queue: "jobs", receipts: [acked?.receipt ?? ""] });
    expect(expiring?.attempt).toBe(1);

    let metrics = await scrape(address);
    for (let deadline = Date.now() + 10_000; ; ) {
      metrics = await scrape(address);
      if ((sampleValue(metrics, "casq_lease_expiries_total", { queue: "jobs" }) ?? 0) > 0) break;
      if (Date.now() > deadline) throw new Error("the lease expiry was never counted");
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    expect(sampleValue(metrics, "casq_lease_expiries_total", { queue: "jobs", outcome: "redelivered" })).toBe(
      1,
    );
    expect(
      sampleValue(metrics, "casq_lease_expiries_total", { queue: "jobs", outcome: "dead_lettered" }),
    ).toBe(undefined);
    expect(sampleValue(metrics, "casq_nacks_total", { ...sub, outcome: "retry_scheduled" })).toBe(1);
    expect(sampleValue(metrics, "casq_nacks_total", sub)).toBe(1);
    // The document counter mixes both; the new series tell them apart.
    expect(sampleValue(metrics, "casq_redeliveries_total", sub)).toBe(2);
    expect(sampleValue(metrics, "casq_repeat_deliveries_total", sub)).toBe(undefined);
    expect(sampleValue(metrics, "casq_claim_to_ack_seconds_count", sub)).toBe(1);
    expect(sampleValue(metrics, "casq_claim_to_ack_seconds_sum", sub)).toBeGreaterThanOrEqual(0);
    expect(sampleValue(metrics, "casq_claim_to_ack_seconds_bucket", { ...sub, le: "+Inf" })).toBe(1);
    // Offset 1 (acked) is settled; 0, 2, 3 and 4 are not: lag = next offset 5 - lowest unsettled 0.
    expect(sampleValue(metrics, "casq_consumer_lag_messages", sub)).toBe(5);

    // The expired and the nacked message come back as attempt 2: two repeated executions.
    const again = (await queue.claim({ queue: "jobs", workerId: "w2", maxMessages: 5 })).messages;
    expect(again.filter((m) => m.attempt === 2)).toHaveLength(2);
    await queue.ack({ queue: "jobs", receipts: again.map((m) => m.receipt) });
    metrics = await scrape(address);
    expect(sampleValue(metrics, "casq_repeat_deliveries_total", sub)).toBe(2);
    expect(sampleValue(metrics, "casq_claim_to_ack_seconds_count", sub)).toBe(1 + again.length);
    expect(sampleValue(metrics, "casq_consumer_lag_messages", sub)).toBe(0);
    expect(metrics.types.get("casq_claim_to_ack_seconds")).toBe("histogram");
    expect(metrics.types.get("casq_lease_expiries_total")).toBe("counter");
  });

  it("counts failed RPCs by code and answers 404 off /metrics", async () => {
    server = await startCasqServer({
      store: "memory:",
      listen: "127.0.0.1:0",
      metricsListen: "127.0.0.1:0",
      logger: quietLogger,
      autoCreateQueues: false,
    });
    const { queue } = grpcClients(server.address);
    await expect(queue.enqueue({ queue: "nope", messages: [{ payload: bytes("x") }] })).rejects.toThrow();
    const metrics = await scrape(server.metricsAddress as string);
    expect(sampleValue(metrics, "casq_rpc_requests_total", { method: "Enqueue", code: "not_found" })).toBe(1);
    expect((await fetch(`http://${server.metricsAddress}/other`)).status).toBe(404);
  });

  it("collects nothing and serves nothing without metricsListen", async () => {
    server = await startCasqServer({ store: "memory:", listen: "127.0.0.1:0", logger: quietLogger });
    expect(server.metricsAddress).toBeUndefined();
    expect(server.metrics).toBeUndefined();
  });

  it("fails to start when the metrics address is taken, naming the flag", async () => {
    server = await startCasqServer({
      store: "memory:",
      listen: "127.0.0.1:0",
      metricsListen: "127.0.0.1:0",
      logger: quietLogger,
    });
    await expect(
      startCasqServer({
        store: "memory:",
        listen: "127.0.0.1:0",
        metricsListen: server.metricsAddress as string,
        logger: quietLogger,
      }),
    ).rejects.toThrow(/cannot serve metrics on .*in use.*--metrics-listen/);
  });
});
