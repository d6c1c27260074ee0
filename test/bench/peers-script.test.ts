/**
 * The peers `npm run bench` compares casq with still run: BullMQ on Redis,
 * pg-boss on PostgreSQL and NATS JetStream, each server started by the script
 * from the programs `scripts/setup-bench-peers.sh` installs (`npm test` runs
 * it first). A tiny run drives every method of each peer's adapter (one
 * enqueue at a time, batches, workers) beside casq, so the JSON holds casq's
 * ratio to each. A peer whose server is missing is skipped with the command
 * that installs it, and the run goes on. Only which runs happened and the
 * shape of the JSON are checked, never how fast anything was.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { benchScript } from "./bench-script.ts";

const run = benchScript("run.ts");
const PEERS = ["bullmq", "pg-boss", "jetstream"];
const SHAPES = ["enqueue", "enqueue_batch", "process"];
const TINY = ["--quick", "--runs", "1", "--jobs", "300", "--no-other-sdks", "--clients", "", "--json"];

interface Report {
  skipped: Record<string, string>;
  durability: Record<string, string>;
  results: { system: string; shape: string; runs: { jobsPerSecond: number }[] }[];
  ratios: { shape: string; peer: string; median_ratio: number }[];
}

const empty = mkdtempSync(join(tmpdir(), "casq-bench-no-peers-"));
afterAll(() => rmSync(empty, { recursive: true, force: true }));

describe("npm run bench against the peers", () => {
  test("BullMQ, pg-boss and JetStream each run every shape's adapter beside casq; casq's ratio to each is printed", async () => {
    const { stdout, stderr } = await run([
      ...TINY,
      "--systems",
      ["casq", ...PEERS].join(","),
      "--shapes",
      SHAPES.join(","),
      "--server",
      "source",
    ]);
    const report = JSON.parse(stdout) as Report;
    // Missing servers here mean `bash scripts/setup-bench-peers.sh` was not run (npm test runs it).
    expect(report.skipped, stderr).toEqual({});
    expect(report.results.map((r) => `${r.system} ${r.shape}`)).toEqual(
      ["casq", ...PEERS].flatMap((system) => SHAPES.map((shape) => `${system} ${shape}`)),
    );
    for (const r of report.results)
      expect(r.runs[0]?.jobsPerSecond, `${r.system} ${r.shape}`).toBeGreaterThan(0);
    expect(Object.keys(report.durability).sort()).toEqual(["bullmq", "casq", "jetstream", "pg-boss"]);
    expect(report.ratios.map((r) => `${r.shape} ${r.peer}`)).toEqual(
      SHAPES.flatMap((shape) => PEERS.map((peer) => `${shape} ${peer}`)),
    );
    for (const r of report.ratios) expect(r.median_ratio).toBeGreaterThan(0);
  }, 180_000);

  test("a peer whose server is not installed is skipped with the command that installs it", async () => {
    // No program on PATH and no PostgreSQL where the benchmark is told to look.
    const env = { ...process.env, PATH: empty, CASQ_BENCH_POSTGRES_BIN: empty };
    const { stdout, stderr } = await run(
      [...TINY, "--systems", PEERS.join(","), "--shapes", "enqueue_batch"],
      env,
    );
    const hint = "(bash scripts/setup-bench-peers.sh)";
    expect(stderr).toContain(`bench: bullmq: skipped: install redis-server ${hint}`);
    expect(stderr).toContain(`bench: pg-boss: skipped: install postgresql ${hint}`);
    expect(stderr).toContain(`bench: jetstream: skipped: install nats-server ${hint}`);
    const report = JSON.parse(stdout) as Report;
    expect(Object.keys(report.skipped).sort()).toEqual(["bullmq", "jetstream", "pg-boss"]);
    expect(report.results).toEqual([]);
  }, 120_000);
});
