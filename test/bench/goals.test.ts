/**
 * The goals `npm run bench` checks (bench/lib/goals.ts): each is judged from
 * the run's medians, met only within its bounds, and left out when the run
 * did not measure what it needs.
 */
import { describe, expect, test } from "vitest";
import { checkGoals, goalLines } from "../../bench/lib/goals.ts";
import { summarize } from "../../bench/lib/report.ts";
import { fakeRuns as runs } from "./fake-runs.ts";

describe("bench goals", () => {
  test("a throughput shape is met when casq's median is at least BullMQ's", () => {
    const checks = checkGoals(
      [
        summarize("casq", "enqueue", runs([900, 1000, 1100], "enqueue")),
        summarize("bullmq", "enqueue", runs([1000, 2000, 3000], "enqueue")),
        summarize("casq", "process", runs([3000, 3000, 3000], "process")),
        summarize("bullmq", "process", runs([3000, 2000, 3100], "process")),
      ],
      200,
    );
    expect(checks).toEqual([
      { goal: "enqueue: casq >= BullMQ", measured: "0.5x (paired 0.5x)", met: false },
      { goal: "process: casq >= BullMQ", measured: "1x (paired 1x)", met: true },
    ]);
  });

  test("latency needs both medians within bounds", () => {
    // p99 is four times p50 in these runs: p50 2 ms gives p99 8 ms (met), p50 3 ms fails both.
    const met = checkGoals([summarize("casq", "latency", runs([1.5, 2, 2.5], "latency"))], 200);
    expect(met).toEqual([
      { goal: "latency at 200 jobs/s: p50 <= 2 ms, p99 <= 10 ms", measured: "p50 2 ms, p99 8 ms", met: true },
    ]);
    // One run's p99 over the bound (10.4 ms) does not fail it: the medians are judged.
    const oneRunOver = checkGoals([summarize("casq", "latency", runs([1, 2, 2.6], "latency"))], 200);
    expect(oneRunOver[0]?.met).toBe(true);
    const slow = checkGoals([summarize("casq", "latency", runs([1, 2, 2], "latency", { p99Ms: 12 }))], 200);
    expect(slow[0]).toMatchObject({ measured: "p50 2 ms, p99 12 ms", met: false });
  });

  test("processing at 100 ms PUTs needs the rate and the PUTs per job", () => {
    const fast = (writesPerJob: number) =>
      checkGoals(
        [summarize("casq-put100ms", "process", runs([5000, 6000], "process", { writesPerJob }))],
        200,
      );
    expect(fast(0.002)).toEqual([
      {
        goal: "process at 100 ms PUTs: >= 5,000 jobs/s, <= 0.01 PUT per job",
        measured: "6,000 jobs/s, 0.002 PUT per job",
        met: true,
      },
    ]);
    expect(fast(0.02)[0]?.met).toBe(false);
    const slow = checkGoals(
      [summarize("casq-put100ms", "process", runs([4999], "process", { writesPerJob: 0.001 }))],
      200,
    );
    expect(slow[0]?.met).toBe(false);
  });

  test("goals the run did not measure are left out; the text says met or NOT MET", () => {
    expect(checkGoals([summarize("casq", "enqueue", runs([1], "enqueue"))], 200)).toEqual([]);
    expect(goalLines([])).toBe("");
    expect(
      goalLines([
        { goal: "a", measured: "1", met: true },
        { goal: "b", measured: "2", met: false },
      ]),
    ).toBe("\ngoals (docs/benchmarks.md):\n  met      a: 1\n  NOT MET  b: 2");
  });
});
