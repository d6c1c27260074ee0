/**
 * `npm run bench` still runs end to end, and its systems take turns: a tiny
 * run of two shapes, two runs each, on casq and casq with 100 ms PUTs (both
 * real `casq serve` processes from the source launcher; the peers' servers
 * are not installed everywhere). Only the order of the runs and the shape of
 * the JSON are checked, never how fast anything was.
 */
import { describe, expect, test } from "vitest";
import { benchScript } from "./bench-script.ts";

const run = benchScript("run.ts");
const TINY = [
  "--quick",
  "--systems",
  "casq,casq-put100ms",
  "--shapes",
  "enqueue_batch,process",
  "--runs",
  "2",
  "--jobs",
  "300",
  "--no-other-sdks",
  "--clients",
  "",
  "--json",
  "--server",
  "source",
];

/** The measured runs in the order the progress lines report them: "system shape run". */
function runOrder(stderr: string): string[] {
  return [...stderr.matchAll(/^bench: (\S+) (\S+) run (\d+)\/\d+:/gm)].map((m) => `${m[1]} ${m[2]} ${m[3]}`);
}

describe("npm run bench", () => {
  test("--help names the run order and its --sequential switch", async () => {
    const { stdout } = await run(["--help"]);
    expect(stdout).toContain("usage: npm run bench");
    expect(stdout).toContain("--sequential");
  });

  test("each shape's runs take turns between the systems; the JSON holds every run of each", async () => {
    const { stdout, stderr } = await run(TINY);
    expect(runOrder(stderr)).toEqual([
      "casq enqueue_batch 1",
      "casq-put100ms enqueue_batch 1",
      "casq enqueue_batch 2",
      "casq-put100ms enqueue_batch 2",
      "casq process 1",
      "casq-put100ms process 1",
      "casq process 2",
      "casq-put100ms process 2",
    ]);
    const report = JSON.parse(stdout) as {
      results: { system: string; shape: string; runs: { jobsPerSecond: number }[] }[];
      ratios: { shape: string; peer: string; median_ratio: number; paired_ratio: number }[];
      goals: { at_goal_sizes: boolean; checks: { goal: string; met: boolean }[]; not_checked: string[] };
    };
    expect(report.results.map((r) => `${r.system} ${r.shape} ${r.runs.length}`)).toEqual([
      "casq enqueue_batch 2",
      "casq process 2",
      "casq-put100ms enqueue_batch 2",
      "casq-put100ms process 2",
    ]);
    for (const r of report.results) for (const m of r.runs) expect(m.jobsPerSecond).toBeGreaterThan(0);
    expect(report.ratios.map((r) => `${r.shape} ${r.peer}`)).toEqual([
      "enqueue_batch casq-put100ms",
      "process casq-put100ms",
    ]);
    for (const r of report.ratios) {
      expect(r.median_ratio).toBeGreaterThan(0);
      expect(r.paired_ratio).toBeGreaterThan(0);
    }
    // The goals this run has the systems and shapes for (the 100 ms-PUT profile only); a tiny run says it is one.
    expect(report.goals.checks.map((c) => `${c.goal}: ${typeof c.met}`)).toEqual([
      "process at 100 ms PUTs: >= 5,000 jobs/s: boolean",
      "process at 100 ms PUTs: <= 0.01 PUT per job: boolean",
    ]);
    expect(report.goals.not_checked).toHaveLength(4);
    expect(report.goals.at_goal_sizes).toBe(false);
  }, 120_000);

  test("--sequential runs every run of one system before the next system's", async () => {
    const { stderr } = await run([...TINY, "--sequential"]);
    expect(runOrder(stderr)).toEqual([
      "casq enqueue_batch 1",
      "casq enqueue_batch 2",
      "casq process 1",
      "casq process 2",
      "casq-put100ms enqueue_batch 1",
      "casq-put100ms enqueue_batch 2",
      "casq-put100ms process 1",
      "casq-put100ms process 2",
    ]);
  }, 120_000);
});
