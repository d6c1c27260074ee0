/**
 * Producer.enqueue merging concurrent calls, against a real casq server (in
 * process, memory store, metrics on): the broker's own RPC counter shows how
 * many Enqueue requests (on the producer's EnqueueStream) 64 concurrent
 * callers cost, and a message the broker
 * refuses fails only its own caller while the others are stored.
 */
import { InvalidArgumentError, Producer } from "@casq/sdk";
import { afterAll, describe, expect, it } from "vitest";
import { parseExposition } from "../telemetry/exposition.ts";
import { closeServers, startServer } from "./support.ts";

afterAll(closeServers);

/** Sum of the samples of `name` whose labels include `labels`. */
async function metric(address: string, name: string, labels: Record<string, string> = {}): Promise<number> {
  const text = await (await fetch(`http://${address}/metrics`)).text();
  return parseExposition(text)
    .samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    .reduce((sum, s) => sum + s.value, 0);
}

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

describe("Producer.enqueue batching against casq", () => {
  it("stores 64 concurrent enqueues in one Enqueue request, each caller with its own message", async () => {
    const server = await startServer({ metricsListen: "127.0.0.1:0" });
    const metrics = server.metricsAddress as string;
    const producer = new Producer({ brokers: [server.address] });
    // The queue exists first, so that its creation is no part of the count.
    await producer.enqueue("merged", "first");
    const before = await metric(metrics, "casq_rpc_requests_total", { method: "EnqueueStream" });

    const results = await Promise.all(
      range(64).map((i) => producer.enqueue("merged", `m${i}`, { key: "k" })),
    );

    expect(await metric(metrics, "casq_rpc_requests_total", { method: "EnqueueStream" })).toBe(before + 1);
    expect(new Set(results.map((r) => r.id)).size).toBe(64);
    // One key, so one shard, in call order.
    expect(results.map((r) => r.offset)).toEqual(
      range(64).map((i) => (results[0]?.offset ?? 0n) + BigInt(i)),
    );
    expect(results.every((r) => !r.duplicate)).toBe(true);
    expect(await metric(metrics, "casq_enqueued_total", { queue: "merged" })).toBe(65);
  });

  it("fails only the caller whose message the broker refuses", async () => {
    const server = await startServer({ metricsListen: "127.0.0.1:0" });
    const producer = new Producer({ brokers: [server.address] });
    await producer.enqueue("refusing", "first");
    const settled = await Promise.allSettled(
      range(16).map((i) => producer.enqueue("refusing", `r${i}`, i === 5 ? { priority: 5000 } : {})),
    );

    expect(settled.map((s) => s.status)).toEqual(range(16).map((i) => (i === 5 ? "rejected" : "fulfilled")));
    const error = (settled[5] as PromiseRejectedResult).reason as InvalidArgumentError;
    expect(error).toBeInstanceOf(InvalidArgumentError);
    // The error a lone call gets: about its own (only) message.
    expect(error.message).toMatch(/messages\[0\]\.priority/);
    const metrics = server.metricsAddress as string;
    expect(await metric(metrics, "casq_enqueued_total", { queue: "refusing" })).toBe(16);
  });
});
