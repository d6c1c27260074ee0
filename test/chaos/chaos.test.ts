/**
 * The chaos suite in `npm test`: a short run on the file store and a shorter
 * one on the S3 test server (the one the vitest global setup started), each
 * with three `casq serve` processes, a producer and a worker per SDK
 * language, and the seeded nemesis killing and freezing leaders and killing
 * workers mid-job. The checker must find nothing; the summaries are printed.
 *
 * Longer runs: `npm run chaos -- --seconds N --seed S [--store file|s3]`.
 * `CASQ_CHAOS_SEED` replaces the fixed seeds below (printed either way).
 */
import { describe, expect, inject, it } from "vitest";
import type { ChaosSummary } from "./run-chaos.ts";
import { runChaos } from "./run-chaos.ts";

const seedOverride = process.env.CASQ_CHAOS_SEED;

function seed(fixed: number): number {
  return seedOverride === undefined ? fixed : Number(seedOverride);
}

/** The run did real work in every language, and every fault kind happened at least once. */
function expectMeaningful(summary: ChaosSummary): void {
  for (const lang of ["ts", "go", "python"]) {
    const produced = Object.entries(summary.clients)
      .filter(([name]) => name.startsWith(`${lang}-producer`))
      .reduce((n, [, c]) => n + (c.enqueued ?? 0), 0);
    const worked = Object.entries(summary.clients)
      .filter(([name]) => name.startsWith(`${lang}-worker`))
      .reduce((n, [, c]) => n + (c.acked ?? 0), 0);
    expect(produced, `${lang} producers' acknowledged enqueues`).toBeGreaterThan(0);
    expect(worked, `${lang} workers' acks`).toBeGreaterThan(0);
  }
  expect(summary.counts.delivered).toBeGreaterThanOrEqual(summary.counts.enqueued);
}

describe("chaos: three brokers, three SDKs, a seeded nemesis", () => {
  it("file store: nothing lost, stored twice, redelivered after an ack or leased twice", {
    timeout: 240_000,
  }, async () => {
    const summary = await runChaos({
      seconds: 60,
      seed: seed(1001),
      store: "file",
      log: (line) => console.log(line),
    });
    console.log(JSON.stringify(summary, null, 2));
    expect(summary.violations).toEqual([]);
    expectMeaningful(summary);
    expect(Object.values(summary.counts.nemesis).reduce((a, b) => a + b, 0)).toBeGreaterThan(5);
  });

  it("S3 store: the same over the S3 test server", { timeout: 180_000 }, async () => {
    const summary = await runChaos({
      seconds: 30,
      seed: seed(2002),
      store: "s3",
      s3: { endpoint: inject("s3Endpoint"), bucket: inject("s3Bucket") },
      log: (line) => console.log(line),
    });
    console.log(JSON.stringify(summary, null, 2));
    expect(summary.violations).toEqual([]);
    expectMeaningful(summary);
  });
});
