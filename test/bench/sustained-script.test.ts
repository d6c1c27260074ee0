/**
 * `npm run bench:sustained` still runs end to end: a 5-second run through a
 * real `casq serve` (the source launcher, for the reason given in
 * backlog-script.test.ts) and the SDK prints one JSON object of the
 * documented shape, with numbers read from the broker. Only the shape and
 * that the broker was seen working are checked, never how fast it was.
 */
import { describe, expect, test } from "vitest";
import { benchScript } from "./bench-script.ts";

const run = benchScript("sustained.ts");
const usageError = async (args: string[], mentions: string) => {
  const failed = await run(args).catch((e: { code?: number; stderr?: string }) => e);
  expect(failed).toMatchObject({ code: 2 });
  expect(String((failed as { stderr?: string }).stderr)).toContain(mentions);
};

describe("bench:sustained", () => {
  test("--help prints the usage", async () => {
    const { stdout } = await run(["--help"]);
    expect(stdout).toContain("usage: npm run bench:sustained");
    for (const option of [
      "--seconds",
      "--window",
      "--interval",
      "--batch",
      "--dedup-ids",
      "--server built|source",
    ])
      expect(stdout).toContain(option);
  });

  test("bad options are usage errors", async () => {
    await usageError(["--seconds", "0"], "--seconds");
    await usageError(["--batch", "1001"], "--batch");
    await usageError(["--dedup-ids", "maybe"], "--dedup-ids");
    await usageError(["--server", "tsx"], "--server");
  });

  test("a short run past its dedup window prints one JSON object of the documented shape", async () => {
    const args = ["--seconds", "5", "--window", "2", "--interval", "1", "--server", "source", "--json"];
    const { stdout } = await run(args);
    const out = JSON.parse(stdout);
    const row = {
      t_s: expect.any(Number),
      jobs_per_s: expect.any(Number),
      backlog: expect.any(Number),
      head_bytes: expect.any(Number),
      broker_cpu_percent: expect.any(Number),
      rss_mib: expect.any(Number),
    };
    expect(out).toEqual({
      seconds: 5,
      dedup_window_s: 2,
      interval_s: 1,
      batch: 100,
      dedup_ids: true,
      server: "source",
      payload_bytes: 1024,
      rows: expect.arrayContaining([row]),
      summary: {
        jobs_per_s_before_window: expect.any(Number),
        jobs_per_s_after_window: expect.any(Number),
        after_over_before: expect.any(Number),
        head_bytes_max: expect.any(Number),
        rss_mib_max: expect.any(Number),
        backlog: expect.any(Number),
      },
    });
    expect(out.rows.length).toBeGreaterThanOrEqual(2);
    // The numbers come from a broker that did the work: jobs stored, a head written, CPU spent.
    const last = out.rows.at(-1);
    expect(last.backlog).toBeGreaterThan(0);
    expect(out.summary.head_bytes_max).toBeGreaterThan(0);
    expect(out.summary.rss_mib_max).toBeGreaterThan(0);
    expect(out.rows.some((r: { broker_cpu_percent: number }) => r.broker_cpu_percent > 0)).toBe(true);
    for (let i = 1; i < out.rows.length; i++)
      expect(out.rows[i].backlog).toBeGreaterThanOrEqual(out.rows[i - 1].backlog);
  });
});
