/**
 * The performance goals casq is measured against (docs/benchmarks.md,
 * "Goals"), checked on every `npm run bench` from the run's own results, so
 * that a run says what it met without a reader redoing the arithmetic.
 *
 * A goal is checked only when the run measured what it needs (the systems
 * and shapes named below); the unary-call goal is `npm run bench:rpc`'s.
 */
import { advantage, pairedAdvantage, type ShapeResult } from "./report.ts";
import type { ShapeName } from "./shapes.ts";

/** The peer the throughput goals name: BullMQ on Redis with AOF everysec. */
export const GOAL_PEER = "bullmq";
/** The system with every PUT delayed 100 ms (the S3-like profile). */
export const SLOW_PUT_SYSTEM = "casq-put100ms";
/** Enqueue → handler start at the latency shape's offered rate, ms. */
export const LATENCY_P50_MS = 2;
export const LATENCY_P99_MS = 10;
/** Processing at 100 ms PUTs: at least this many jobs/s, at most this many PUTs per job. */
export const SLOW_PUT_JOBS_PER_SECOND = 5_000;
export const SLOW_PUT_WRITES_PER_JOB = 0.01;

/** One goal as this run measured it. */
export interface GoalCheck {
  /** What the goal asks, in words. */
  readonly goal: string;
  /** What the run measured for it, in words. */
  readonly measured: string;
  readonly met: boolean;
}

const THROUGHPUT: readonly ShapeName[] = ["enqueue", "enqueue_batch", "process"];

const number = (n: number, digits = 0) => n.toLocaleString("en-US", { maximumFractionDigits: digits });

/**
 * Checks the goals against `results` (medians of the run). A throughput
 * shape against BullMQ is met when casq's median is at least BullMQ's
 * (the paired ratio is shown beside it); the latency goal needs both
 * percentiles' medians within bounds at `latencyRate`.
 */
export function checkGoals(results: readonly ShapeResult[], latencyRate: number): GoalCheck[] {
  const find = (system: string, shape: ShapeName) =>
    results.find((r) => r.system === system && r.shape === shape && r.runs.length > 0);
  const checks: GoalCheck[] = [];
  for (const shape of THROUGHPUT) {
    const casq = find("casq", shape);
    const peer = find(GOAL_PEER, shape);
    if (casq === undefined || peer === undefined) continue;
    const ratio = advantage(casq, peer);
    const paired = pairedAdvantage(casq, peer);
    checks.push({
      goal: `${shape}: casq >= BullMQ`,
      measured: `${number(ratio, 2)}x${paired === undefined ? "" : ` (paired ${number(paired, 2)}x)`}`,
      met: ratio >= 1,
    });
  }
  const latency = find("casq", "latency");
  if (latency !== undefined && latency.p99 !== undefined) {
    const p50 = latency.value.median;
    const p99 = latency.p99.median;
    checks.push({
      goal: `latency at ${number(latencyRate)} jobs/s: p50 <= ${LATENCY_P50_MS} ms, p99 <= ${LATENCY_P99_MS} ms`,
      measured: `p50 ${number(p50, 2)} ms, p99 ${number(p99, 2)} ms`,
      met: p50 <= LATENCY_P50_MS && p99 <= LATENCY_P99_MS,
    });
  }
  const slow = find(SLOW_PUT_SYSTEM, "process");
  if (slow !== undefined && slow.writesPerJob !== undefined) {
    const jobsPerSecond = slow.value.median;
    checks.push({
      goal: `process at 100 ms PUTs: >= ${number(SLOW_PUT_JOBS_PER_SECOND)} jobs/s, <= ${SLOW_PUT_WRITES_PER_JOB} PUT per job`,
      measured: `${number(jobsPerSecond)} jobs/s, ${number(slow.writesPerJob, 4)} PUT per job`,
      met: jobsPerSecond >= SLOW_PUT_JOBS_PER_SECOND && slow.writesPerJob <= SLOW_PUT_WRITES_PER_JOB,
    });
  }
  return checks;
}

/** The checks as text lines ("met" / "NOT MET", the goal, what was measured). */
export function goalLines(checks: readonly GoalCheck[]): string {
  if (checks.length === 0) return "";
  return [
    "\ngoals (docs/benchmarks.md):",
    ...checks.map((c) => `  ${(c.met ? "met" : "NOT MET").padEnd(8)} ${c.goal}: ${c.measured}`),
  ].join("\n");
}
