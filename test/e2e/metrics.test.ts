/**
 * `casq serve --metrics-listen` as a real process: it prints where metrics
 * are served, and `GET /metrics` there returns the casq families after a
 * CLI enqueue.
 */
import { afterEach, describe, expect, it } from "vitest";
import { parseExposition, sampleValue } from "../telemetry/exposition.ts";
import { type CasqServerProcess, casq, startServer, tempDir } from "./support/processes.ts";

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function metricsAddress(server: CasqServerProcess): Promise<string> {
  const until = Date.now() + 10_000;
  for (;;) {
    const match = /metrics on http:\/\/(\S+)\/metrics/.exec(server.output());
    if (match?.[1]) return match[1];
    if (Date.now() > until) throw new Error(`no "metrics on" line; output:\n${server.output()}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe("casq serve --metrics-listen", () => {
  it("serves Prometheus metrics on its own port", async () => {
    const dir = tempDir("metrics");
    cleanups.push(dir.remove);
    const server = await startServer({
      store: `file:${dir.path}`,
      args: ["--metrics-listen", "127.0.0.1:0"],
    });
    cleanups.push(() => server.stop());
    const address = await metricsAddress(server);

    const enq = await casq(["enqueue", "mail", "hello", "--server", server.address]);
    expect(enq.code, enq.stderr).toBe(0);

    const res = await fetch(`http://${address}/metrics`);
    expect(res.status).toBe(200);
    const metrics = parseExposition(await res.text());
    expect(sampleValue(metrics, "casq_enqueued_total", { queue: "mail", subscription: "default" })).toBe(1);
    expect(sampleValue(metrics, "casq_store_operations_total", { op: "put", outcome: "ok" })).toBeGreaterThan(
      0,
    );
    expect(sampleValue(metrics, "casq_shard_leader", { queue: "mail", shard: "0" })).toBe(1);
    expect(metrics.types.get("casq_process_resident_memory_bytes")).toBe("gauge");
  });
});
