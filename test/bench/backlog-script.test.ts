/**
 * `npm run bench:backlog` still runs end to end: its smallest case (a
 * 200-job backlog, 1 s phases, no latency) through a real `casq serve` and
 * the SDK prints one JSON object of the documented shape, with numbers read
 * from the broker. Only the shape and that the broker was seen working are
 * checked, never how fast it was. It runs the source server (`--server
 * source`): the default, `built`, runs `npm run build` in the checkout, which
 * would race with the packaging tests that build it too.
 */
import { describe, expect, test } from "vitest";
import { benchScript } from "./bench-script.ts";

const run = benchScript("backlog.ts");

const phase = {
  jobs: expect.any(Number),
  seconds: expect.any(Number),
  jobs_per_s: expect.any(Number),
  commits: expect.any(Number),
  ops_per_commit: expect.any(Number),
  commit_ms_p50: expect.any(Number),
  commit_ms_p99: expect.any(Number),
  bytes_per_commit: expect.any(Number),
  puts_per_1000_jobs: expect.any(Number),
  gets_per_1000_jobs: expect.any(Number),
  broker_cpu_s: expect.any(Number),
};
const memory = { rss_mib: expect.any(Number), peak_mib: expect.any(Number) };

describe("bench:backlog", () => {
  test("--help prints the usage", async () => {
    const { stdout } = await run(["--help"]);
    expect(stdout).toContain("usage: npm run bench:backlog");
    expect(stdout).toContain("--dedup-ids");
    expect(stdout).toContain("--server built|source");
    expect(stdout).toContain("--settle-seconds");
    expect(stdout).toContain("--load-batch");
  });

  test("a bad --load-batch is a usage error", async () => {
    const failed = await run(["--load-batch", "0"]).catch((e: { code?: number; stderr?: string }) => e);
    expect(failed).toMatchObject({ code: 2 });
    expect(String((failed as { stderr?: string }).stderr)).toContain("--load-batch");
  });

  test("a bad --server is a usage error", async () => {
    const failed = await run(["--server", "tsx"]).catch((e: { code?: number; stderr?: string }) => e);
    expect(failed).toMatchObject({ code: 2 });
    expect(String((failed as { stderr?: string }).stderr)).toContain("--server");
  });

  test("a bad --dedup-ids is a usage error", async () => {
    const failed = await run(["--dedup-ids", "maybe"]).catch((e: { code?: number; stderr?: string }) => e);
    expect(failed).toMatchObject({ code: 2 });
    expect(String((failed as { stderr?: string }).stderr)).toContain("--dedup-ids");
  });

  test("the smallest case prints one JSON object of the documented shape", async () => {
    const { stdout } = await run([
      "--sizes",
      "200",
      "--seconds",
      "1",
      "--latency",
      "0",
      "--dead-letters",
      "0",
      "--server",
      "source",
      "--settle-seconds",
      "1",
      "--load-batch",
      "1",
      "--json",
    ]);
    const out = JSON.parse(stdout);
    expect(out).toEqual({
      seconds_per_phase: 1,
      payload_bytes: 1024,
      enqueue_callers: 64,
      worker_concurrency: 50,
      dedup_ids: true,
      load_batch: 1,
      settle_seconds: 1,
      cases: [
        {
          backlog: 200,
          put_latency_ms: 0,
          server: "source",
          load_seconds: expect.any(Number),
          enqueue: phase,
          process: phase,
          head_bytes_after_load: expect.any(Number),
          head_bytes: expect.any(Number),
          broker_memory: {
            after_load: memory,
            after_enqueue: memory,
            after_process: memory,
            settled: { ...memory, heap_used_mib: expect.any(Number), external_mib: expect.any(Number) },
            after_gc: {
              rss_mib: expect.any(Number),
              heap_used_mib: expect.any(Number),
              external_mib: expect.any(Number),
            },
          },
        },
      ],
    });
    const [c] = out.cases;
    // The numbers come from a broker that did the work: its commits, PUTs, head and memory.
    for (const p of [c.enqueue, c.process]) {
      expect(p.jobs).toBeGreaterThan(0);
      expect(p.commits).toBeGreaterThan(0);
      expect(p.puts_per_1000_jobs).toBeGreaterThan(0);
      expect(p.bytes_per_commit).toBeGreaterThan(0);
      expect(p.commit_ms_p99).toBeGreaterThanOrEqual(p.commit_ms_p50);
    }
    expect(c.head_bytes).toBeGreaterThan(0);
    expect(c.broker_memory.after_process.rss_mib).toBeGreaterThan(0);
    expect(c.broker_memory.settled.heap_used_mib).toBeGreaterThan(0);
    // the forced collections reached the broker: its heap is no larger after them than before
    expect(c.broker_memory.after_gc.heap_used_mib).toBeGreaterThan(0);
    expect(c.broker_memory.after_gc.heap_used_mib).toBeLessThanOrEqual(c.broker_memory.settled.heap_used_mib);
    expect(c.broker_memory.settled.peak_mib).toBeGreaterThanOrEqual(c.broker_memory.after_process.peak_mib);
    expect(c.broker_memory.after_process.peak_mib).toBeGreaterThanOrEqual(
      c.broker_memory.after_load.peak_mib,
    );
  });
});
