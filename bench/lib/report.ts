/**
 * Summaries of benchmark runs: min / median / max over the repeated runs of a
 * shape, ratios of casq to each peer measured in the same run, a text table
 * and an SVG bar chart.
 */
import type { Measurement, ShapeName } from "./shapes.ts";

/** min / median / max of one metric over repeated runs. */
export interface Spread {
  readonly min: number;
  readonly median: number;
  readonly max: number;
}

/** One system's result for one shape. */
export interface ShapeResult {
  readonly system: string;
  readonly shape: ShapeName;
  readonly runs: readonly Measurement[];
  /** jobs/s for throughput shapes, p50 ms for `latency`. */
  readonly value: Spread;
  /** p99 ms (`latency` only). */
  readonly p99?: Spread;
  readonly clientCpuSeconds: number;
  readonly serverCpuSeconds: number;
  readonly writesPerJob?: number;
}

/** min / median / max of `values` (non-empty). */
export function spread(values: readonly number[]): Spread {
  const sorted = [...values].sort((a, b) => a - b);
  return {
    min: sorted[0] as number,
    median: sorted[Math.floor(sorted.length / 2)] as number,
    max: sorted[sorted.length - 1] as number,
  };
}

/** Folds the runs of one system and shape into a {@link ShapeResult}. */
export function summarize(system: string, shape: ShapeName, runs: readonly Measurement[]): ShapeResult {
  const median = (pick: (m: Measurement) => number) => spread(runs.map(pick)).median;
  const writes = runs.map((m) => m.writesPerJob).filter((w): w is number => w !== undefined);
  return {
    system,
    shape,
    runs,
    value: spread(runs.map((m) => (shape === "latency" ? (m.p50Ms as number) : m.jobsPerSecond))),
    ...(shape === "latency" ? { p99: spread(runs.map((m) => m.p99Ms as number)) } : {}),
    clientCpuSeconds: median((m) => m.clientCpuSeconds),
    serverCpuSeconds: median((m) => m.serverCpuSeconds),
    ...(writes.length > 0 ? { writesPerJob: spread(writes).median } : {}),
  };
}

/**
 * casq's median over the peer's, oriented so that > 1 means casq is better:
 * jobs/s ratio for throughput, peer latency over casq latency for `latency`.
 */
export function advantage(casq: ShapeResult, peer: ShapeResult): number {
  return casq.shape === "latency"
    ? peer.value.median / casq.value.median
    : casq.value.median / peer.value.median;
}

/** A run's value, oriented with {@link advantage}: jobs/s, or p50 ms for `latency`. */
function runValue(shape: ShapeName, m: Measurement): number {
  return shape === "latency" ? (m.p50Ms as number) : m.jobsPerSecond;
}

/**
 * The median of casq's run-by-run ratios to the peer (run k of each, oriented
 * as {@link advantage}), or undefined when their run counts differ. The bench
 * runs each shape's run k on every system in one round, so a machine
 * whose speed drifts within the hour moves both sides of each ratio alike,
 * where the ratio of the medians may set a run in a fast spell against one in
 * a slow spell.
 */
export function pairedAdvantage(casq: ShapeResult, peer: ShapeResult): number | undefined {
  if (casq.runs.length === 0 || casq.runs.length !== peer.runs.length) return undefined;
  const ratios = casq.runs.map((m, k) => {
    const ours = runValue(casq.shape, m);
    const theirs = runValue(peer.shape, peer.runs[k] as Measurement);
    return casq.shape === "latency" ? theirs / ours : ours / theirs;
  });
  return spread(ratios).median;
}

/** casq's ratio to one peer on one shape, both ways of taking it. */
export interface Ratio {
  readonly shape: ShapeName;
  readonly peer: string;
  /** {@link advantage}: casq's median over the peer's. */
  readonly median_ratio: number;
  /** {@link pairedAdvantage}: the median of the run-by-run ratios. */
  readonly paired_ratio?: number;
}

/** casq's ratios to every other system, per shape (none without a casq result). */
export function ratios(results: readonly ShapeResult[]): Ratio[] {
  const out: Ratio[] = [];
  for (const casq of results.filter((r) => r.system === "casq"))
    for (const peer of results.filter((r) => r.shape === casq.shape && r.system !== "casq")) {
      const paired = pairedAdvantage(casq, peer);
      out.push({
        shape: casq.shape,
        peer: peer.system,
        median_ratio: advantage(casq, peer),
        ...(paired !== undefined ? { paired_ratio: paired } : {}),
      });
    }
  return out;
}

/** `n` with thousands separators and at most `digits` decimals ("-" for none). */
export const fmt = (n: number | undefined, digits = 0): string =>
  n === undefined || Number.isNaN(n) ? "-" : n.toLocaleString("en-US", { maximumFractionDigits: digits });

/** The results as text tables, one per shape, with ratios against the first (casq) system. */
export function textTable(results: readonly ShapeResult[], shapes: readonly ShapeName[]): string {
  const lines: string[] = [];
  for (const shape of shapes) {
    const rows = results.filter((r) => r.shape === shape);
    if (rows.length === 0) continue;
    const casq = rows.find((r) => r.system === "casq");
    const unit = shape === "latency" ? "p50 ms (min/median/max), p99 ms median" : "jobs/s (min/median/max)";
    lines.push(`\n${shape}: ${unit}`);
    lines.push(
      `${"system".padEnd(16)}${"min".padStart(10)}${"median".padStart(10)}${"max".padStart(10)}${
        shape === "latency" ? "p99".padStart(10) : ""
      }${"casq adv.".padStart(11)}${"paired".padStart(9)}${"cpu cl/srv s".padStart(15)}${"PUT/job".padStart(9)}`,
    );
    for (const r of rows) {
      const digits = shape === "latency" ? 2 : 0;
      lines.push(
        `${r.system.padEnd(16)}${fmt(r.value.min, digits).padStart(10)}${fmt(r.value.median, digits).padStart(10)}${fmt(
          r.value.max,
          digits,
        ).padStart(10)}${shape === "latency" ? fmt(r.p99?.median, 2).padStart(10) : ""}${(
          casq && r !== casq ? `${fmt(advantage(casq, r), 3)}x` : ""
        ).padStart(
          11,
        )}${(casq && r !== casq ? `${fmt(pairedAdvantage(casq, r), 3)}x` : "").padStart(9)}${`${fmt(r.clientCpuSeconds, 1)}/${fmt(r.serverCpuSeconds, 1)}`.padStart(15)}${fmt(r.writesPerJob, 4).padStart(9)}`,
      );
    }
  }
  lines.push(
    "\ncasq adv. = casq's median over the peer's (latency: the peer's over casq's); > 1 means casq is ahead." +
      "\npaired = the median of the run-by-run ratios (run k against run k, which ran in the same round unless --sequential): less moved by a machine whose speed drifts.",
  );
  return lines.join("\n");
}

/** A grouped bar chart (one group per throughput shape, one bar per system, medians). */
export function svgChart(results: readonly ShapeResult[], shapes: readonly ShapeName[]): string {
  const throughput = shapes.filter((s) => s !== "latency");
  const systems = [...new Set(results.map((r) => r.system))];
  const colors = ["#2b6cb0", "#c05621", "#2f855a", "#6b46c1", "#b7791f", "#9b2c2c"];
  const max = Math.max(1, ...results.filter((r) => r.shape !== "latency").map((r) => r.value.median));
  const barW = 22;
  const groupW = systems.length * barW + 40;
  const height = 260;
  const top = 30;
  const plotH = 180;
  const width = 70 + throughput.length * groupW + 160;
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="11">`,
    "<title>casq benchmark: jobs/s by shape and system</title>",
    `<text x="10" y="18" font-size="13">jobs/s (median of runs), higher is better</text>`,
    `<line x1="60" y1="${top + plotH}" x2="${width - 150}" y2="${top + plotH}" stroke="#555"/>`,
  ];
  for (let t = 0; t <= 4; t += 1) {
    const v = (max * t) / 4;
    const y = top + plotH - (plotH * t) / 4;
    parts.push(`<text x="55" y="${y + 4}" text-anchor="end">${fmt(v)}</text>`);
    parts.push(`<line x1="60" y1="${y}" x2="${width - 150}" y2="${y}" stroke="#ddd"/>`);
  }
  throughput.forEach((shape, g) => {
    const x0 = 70 + g * groupW;
    systems.forEach((system, i) => {
      const r = results.find((x) => x.shape === shape && x.system === system);
      if (!r) return;
      const h = (plotH * r.value.median) / max;
      parts.push(
        `<rect x="${x0 + i * barW}" y="${top + plotH - h}" width="${barW - 4}" height="${h}" fill="${
          colors[i % colors.length]
        }"/>`,
      );
    });
    parts.push(
      `<text x="${x0 + (systems.length * barW) / 2}" y="${top + plotH + 16}" text-anchor="middle">${shape}</text>`,
    );
  });
  systems.forEach((system, i) => {
    const y = top + 10 + i * 16;
    parts.push(
      `<rect x="${width - 140}" y="${y - 9}" width="10" height="10" fill="${colors[i % colors.length]}"/>`,
    );
    parts.push(`<text x="${width - 125}" y="${y}">${system}</text>`);
  });
  parts.push("</svg>");
  return `${parts.join("\n")}\n`;
}
