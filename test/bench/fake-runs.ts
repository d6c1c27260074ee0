/**
 * Measurements made up for the bench report's tests: one run per value,
 * as jobs/s, or for `latency` as the p50 in ms (p99 four times it).
 */
import type { Measurement, ShapeName } from "../../bench/lib/shapes.ts";

/** One made-up {@link Measurement} per value of `values`; `extra` overrides fields of each. */
export function fakeRuns(
  values: readonly number[],
  shape: ShapeName = "process",
  extra: Partial<Measurement> = {},
): Measurement[] {
  return values.map((v) => ({
    jobs: 1000,
    seconds: 1,
    jobsPerSecond: shape === "latency" ? 200 : v,
    ...(shape === "latency" ? { p50Ms: v, p99Ms: v * 4 } : {}),
    clientCpuSeconds: 1,
    serverCpuSeconds: 1,
    ...extra,
  }));
}
