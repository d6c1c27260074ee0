/**
 * The performance goals casq is measured against (docs/benchmarks.md,
 * "Goals"), checked on every `npm run bench` from the run's own results, so
 * that a run says what it met without a reader redoing the arithmetic.
 *
 * A goal is checked only when the run measured the systems and shapes it
 * names; the others are listed as not checked. A run smaller than the goals'
 * sizes (`--quick`, `--jobs`, fewer runs) is checked all the same, and says
 * that its verdicts are indicative only. The unary-call goal is
 * `npm run bench:rpc`'s.
 */
import { advantage, fmt as formatNumber, pairedAdvantage, type ShapeResult } from "./report.ts";
import type { ShapeName, ShapeSizes } from "./shapes.ts";

/** The peer the throughput goals name: BullMQ on Redis with AOF everysec. */
export const GOAL_PEER = "bullmq";
/** The system with every PUT delayed 100 ms (the S3-like profile). */
export const SLOW_PUT_SYSTEM = "casq-put100ms";
/** Enqueue → handler start at the latency shape's offered rate: medians, ms. */
export const LATENCY_P50_MS = 2;
export const LATENCY_P99_MS = 10;
/** Processing at 100 ms PUTs: at least this many jobs/s, at most this many PUTs per job. */
export const SLOW_PUT_JOBS_PER_SECOND = 5_000;
export const SLOW_PUT_WRITES_PER_JOB = 0.01;
/** The sizes the goals are stated for: `npm run bench`'s defaults. */
export const GOAL_SIZES = { jobs: 20_000, runs: 3, latencyRate: 200, latencySeconds: 10 } as const;

/** One goal as this run measured it. */
export interface GoalCheck {
  /** What the goal asks, in words. */
  readonly goal: string;
  /** What the run measured for it, in words. */
  readonly measured: string;
  /** The number judged: a ratio to BullMQ, ms, jobs/s or PUTs per job. */
  readonly value: number;
  /** The bound it is judged against: `value` >= it (`at_least`) or <= it (`at_most`). */
  readonly bound: number;
  readonly direction: "at_least" | "at_most";
  readonly met: boolean;
}

/** Every goal of one run: those checked, those it could not check, and whether it ran at the goals' sizes. */
export interface GoalReport {
  readonly at_goal_sizes: boolean;
  readonly checks: GoalCheck[];
  /** Goals left unchecked, each with what the run lacked. */
  readonly not_checked: string[];
}

const THROUGHPUT_SHAPES: readonly ShapeName[] = ["enqueue", "enqueue_batch", "process"];

function check(
  goal: string,
  measured: string,
  value: number,
  bound: number,
  direction: GoalCheck["direction"],
): GoalCheck {
  return {
    goal,
    measured,
    value,
    bound,
    direction,
    met: direction === "at_least" ? value >= bound : value <= bound,
  };
}

/**
 * Checks the goals against `results` (each system's median over its runs). A
 * throughput shape is met when casq's median is at least BullMQ's (the
 * paired ratio is shown beside it); latency and the 100 ms-PUT profile are
 * two checks each, one per bound.
 */
export function checkGoals(
  results: readonly ShapeResult[],
  sizes: Pick<ShapeSizes, "jobs" | "latencyRate" | "latencySeconds">,
  runs: number,
): GoalReport {
  const find = (system: string, shape: ShapeName) =>
    results.find((r) => r.system === system && r.shape === shape && r.runs.length > 0);
  const checks: GoalCheck[] = [];
  const notChecked: string[] = [];
  for (const shape of THROUGHPUT_SHAPES) {
    const casq = find("casq", shape);
    const peer = find(GOAL_PEER, shape);
    const goal = `${shape}: casq / BullMQ`;
    if (casq === undefined || peer === undefined) {
      notChecked.push(`${goal} (the run has no ${shape} of ${casq === undefined ? "casq" : GOAL_PEER})`);
      continue;
    }
    const ratio = advantage(casq, peer);
    const paired = pairedAdvantage(casq, peer);
    const pairedText = paired === undefined ? "" : ` (paired ${formatNumber(paired, 2)}x)`;
    checks.push(check(`${goal} >= 1`, `${formatNumber(ratio, 2)}x${pairedText}`, ratio, 1, "at_least"));
  }
  const latency = find("casq", "latency");
  const at = `at ${formatNumber(sizes.latencyRate)} jobs/s`;
  if (latency?.p99 === undefined) {
    notChecked.push(`latency ${at} (the run has no latency shape of casq)`);
  } else {
    const p50 = latency.value.median;
    const p99 = latency.p99.median;
    checks.push(
      check(
        `latency ${at}: p50 <= ${LATENCY_P50_MS} ms`,
        `${formatNumber(p50, 2)} ms`,
        p50,
        LATENCY_P50_MS,
        "at_most",
      ),
    );
    checks.push(
      check(
        `latency ${at}: p99 <= ${LATENCY_P99_MS} ms`,
        `${formatNumber(p99, 2)} ms`,
        p99,
        LATENCY_P99_MS,
        "at_most",
      ),
    );
  }
  const slow = find(SLOW_PUT_SYSTEM, "process");
  if (slow?.writesPerJob === undefined) {
    notChecked.push(`process at 100 ms PUTs (the run has no process shape of ${SLOW_PUT_SYSTEM})`);
  } else {
    const jobsPerSecond = slow.value.median;
    checks.push(
      check(
        `process at 100 ms PUTs: >= ${formatNumber(SLOW_PUT_JOBS_PER_SECOND)} jobs/s`,
        `${formatNumber(jobsPerSecond)} jobs/s`,
        jobsPerSecond,
        SLOW_PUT_JOBS_PER_SECOND,
        "at_least",
      ),
    );
    checks.push(
      check(
        `process at 100 ms PUTs: <= ${SLOW_PUT_WRITES_PER_JOB} PUT per job`,
        `${formatNumber(slow.writesPerJob, 4)} PUT per job`,
        slow.writesPerJob,
        SLOW_PUT_WRITES_PER_JOB,
        "at_most",
      ),
    );
  }
  const atGoalSizes =
    sizes.jobs === GOAL_SIZES.jobs &&
    runs >= GOAL_SIZES.runs &&
    sizes.latencyRate === GOAL_SIZES.latencyRate &&
    sizes.latencySeconds === GOAL_SIZES.latencySeconds;
  return { at_goal_sizes: atGoalSizes, checks, not_checked: notChecked };
}

/** The report as text lines: "met" / "NOT MET", the goal, what was measured; then what was not checked. */
export function goalLines(report: GoalReport): string {
  const lines = [
    "\ngoals (docs/benchmarks.md):",
    ...report.checks.map((c) => `  ${(c.met ? "met" : "NOT MET").padEnd(8)} ${c.goal}: ${c.measured}`),
    ...report.not_checked.map((what) => `  ${"-".padEnd(8)} not checked: ${what}`),
  ];
  if (!report.at_goal_sizes)
    lines.push(
      `  (this run is not at the goals' sizes, ${formatNumber(GOAL_SIZES.jobs)} jobs and ${GOAL_SIZES.runs} runs a shape, latency ${GOAL_SIZES.latencySeconds} s at ${GOAL_SIZES.latencyRate} jobs/s: the verdicts are indicative only)`,
    );
  return lines.join("\n");
}
