/**
 * Per-shard gauges follow leadership across real processes: two `casq serve`
 * brokers on one file store; the leader is frozen (SIGSTOP) past its lease, the
 * other takes the shard over, and once the old leader runs again and learns
 * it lost the shard, its /metrics no longer reports the shard's document size
 * or queue state (the new leader does), so sums over brokers stay right.
 */
import { afterAll, describe, expect, it } from "vitest";
import { type CasqServerProcess, casq, startServer, tempDir, waitFor } from "../e2e/support/processes.ts";
import { type Exposition, parseExposition, sampleValue } from "./exposition.ts";

const store = tempDir("leader-move-metrics");
const servers: CasqServerProcess[] = [];

afterAll(async () => {
  for (const s of servers) s.child.kill("SIGCONT");
  await Promise.all(servers.map((s) => s.stop("SIGKILL")));
  store.remove();
});

function metricsAddress(server: CasqServerProcess): string {
  const match = /metrics on http:\/\/(\S+)\/metrics/.exec(server.output());
  if (!match?.[1]) throw new Error(`no "metrics on" line; output:\n${server.output()}`);
  return match[1];
}

async function scrape(server: CasqServerProcess): Promise<Exposition> {
  const res = await fetch(`http://${metricsAddress(server)}/metrics`);
  expect(res.status).toBe(200);
  return parseExposition(await res.text());
}

describe("metrics when leadership moves", () => {
  it("the old leader stops reporting the shard's document size and queue state", async () => {
    const args = ["--leader-lease", "1s", "--metrics-listen", "127.0.0.1:0"];
    const [first, second] = await Promise.all([
      startServer({ store: `file:${store.path}`, args }),
      startServer({ store: `file:${store.path}`, args }),
    ]);
    if (!first || !second) throw new Error("brokers did not start");
    servers.push(first, second);
    for (const s of [first, second])
      await waitFor("the metrics address", () => /metrics on/.test(s.output()));

    const enq = await casq(["enqueue", "moving", "one", "--server", first.address]);
    expect(enq.code, enq.stderr).toBe(0);
    const shard = { queue: "moving", shard: "0" };
    const sub = { queue: "moving", subscription: "default" };
    const led = await scrape(first);
    expect(sampleValue(led, "casq_shard_leader", shard)).toBe(1);
    expect(sampleValue(led, "casq_document_bytes", shard)).toBeGreaterThan(0);
    expect(sampleValue(led, "casq_queue_depth", sub)).toBe(1);

    // Freeze the leader past its lease: the other broker takes the shard over.
    first.child.kill("SIGSTOP");
    // A short per-request timeout: a redirect to the frozen leader must not use up the wait.
    await waitFor(
      "the second broker to take the shard over",
      async () => {
        const r = await casq(["enqueue", "moving", "two", "--server", second.address, "--timeout", "2s"]);
        return r.code === 0;
      },
      90_000,
    );
    first.child.kill("SIGCONT");

    // The old leader finds out (its next renewal loses the CAS race) and drops the shard's gauges.
    let old = await scrape(first);
    await waitFor("the old leader to see it lost the shard", async () => {
      old = await scrape(first);
      return sampleValue(old, "casq_shard_leader", shard) === 0;
    });
    expect(sampleValue(old, "casq_document_bytes", shard)).toBeUndefined();
    expect(sampleValue(old, "casq_queue_depth", sub)).toBeUndefined();
    expect(sampleValue(old, "casq_leadership_changes_total", { ...shard, event: "lost" })).toBe(1);
    // Its own past activity stays for a while (see docs/operations.md).
    expect(sampleValue(old, "casq_commits_total", shard)).toBeGreaterThan(0);

    const now = await scrape(second);
    expect(sampleValue(now, "casq_shard_leader", shard)).toBe(1);
    expect(sampleValue(now, "casq_document_bytes", shard)).toBeGreaterThan(0);
    expect(sampleValue(now, "casq_queue_depth", sub)).toBe(2);
  });
});
