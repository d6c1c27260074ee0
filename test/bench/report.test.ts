/**
 * The bench report's ratios (bench/lib/report.ts): casq's median over a
 * peer's, and the median of their run-by-run ratios, each oriented so that
 * > 1 means casq is ahead.
 */
import { describe, expect, test } from "vitest";
import { advantage, pairedAdvantage, ratios, summarize } from "../../bench/lib/report.ts";
import { fakeRuns as runs } from "./fake-runs.ts";

describe("bench report ratios", () => {
  test("paired: run k against run k, so a slow spell that hit both sides cancels out", () => {
    // Run 2 of each ran in a slow spell: casq is 10 % ahead in every pair.
    const casq = summarize("casq", "process", runs([1100, 440, 1650, 1210]));
    const peer = summarize("bullmq", "process", runs([1000, 400, 1500, 1100]));
    expect(pairedAdvantage(casq, peer)).toBeCloseTo(1.1, 10);
    // Ahead in four pairs of five, behind in one: the medians (1,100 and 1,100) say 1.0, the pairs 1.1.
    const one = summarize("casq", "process", runs([1100, 440, 1650, 1210, 900]));
    const other = summarize("bullmq", "process", runs([1000, 400, 1500, 1100, 1200]));
    expect(advantage(one, other)).toBeCloseTo(1, 10);
    expect(pairedAdvantage(one, other)).toBeCloseTo(1.1, 10);
  });

  test("latency: the peer's over casq's; different run counts give none", () => {
    const casq = summarize("casq", "latency", runs([2, 4, 3], "latency"));
    const peer = summarize("bullmq", "latency", runs([1, 1, 1.5], "latency"));
    expect(pairedAdvantage(casq, peer)).toBeCloseTo(0.5, 10); // [0.5, 0.25, 0.5]
    expect(advantage(casq, peer)).toBeCloseTo(1 / 3, 10);
    expect(pairedAdvantage(casq, summarize("bullmq", "latency", runs([1, 1], "latency")))).toBeUndefined();
  });

  test("ratios() lists casq against every other system of each shape", () => {
    const results = [
      summarize("casq", "process", runs([10, 20])),
      summarize("casq", "enqueue", runs([5, 5])),
      summarize("bullmq", "process", runs([5, 10])),
      summarize("nats", "process", runs([20])),
    ];
    expect(ratios(results)).toEqual([
      { shape: "process", peer: "bullmq", median_ratio: 2, paired_ratio: 2 },
      { shape: "process", peer: "nats", median_ratio: 1 },
    ]);
  });
});
