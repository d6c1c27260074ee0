/**
 * How far `casq serve` lets V8's JS heap grow past what its last full
 * collection found live before it collects again (`--heap-growth-percent`).
 *
 * Why: a busy broker's garbage is mostly promoted garbage — messages live in
 * the head's tail and in the page cache for longer than a young-generation
 * collection, then die in the old generation — and V8 on a machine with a
 * few GB of memory lets the old generation grow to up to 4 times its live
 * size before a full collection. For a broker with ~40 MB live that was a
 * heap of 150-160 MB and a resident size of ~350-370 MiB peak at a 100k
 * backlog. A fixed growth of 25-50% over the live heap kept the peak near
 * 250 MiB, but cost 25-40% more broker CPU per job (many more full
 * collections), so the default (0) leaves V8's own dynamic growth: a knob for
 * brokers short of memory (see docs/operations.md, "Memory").
 *
 * It is V8's `--heap-growing-percent`, set from inside the process (it is
 * read at every collection, so setting it before the broker starts is as
 * good as a node flag). A `--heap-growing-percent` given to node itself
 * (command line or NODE_OPTIONS) wins.
 */
import { setFlagsFromString } from "node:v8";

/** The default of `--heap-growth-percent`. */
export const DEFAULT_HEAP_GROWTH_PERCENT = 0;

/** The most `--heap-growth-percent` accepts (V8's own dynamic factor is at most 300%). */
export const MAX_HEAP_GROWTH_PERCENT = 1000;

/** True when node was started with its own `--heap-growing-percent`. */
export function nodeSetsHeapGrowth(execArgv: readonly string[], nodeOptions: string | undefined): boolean {
  const given = [...execArgv, ...(nodeOptions ?? "").split(/\s+/)];
  return given.some((arg) => /^--heap[-_]growing[-_]percent(=|$)/.test(arg));
}

/**
 * Applies `percent` (0: leave V8's own dynamic growth) unless node was given
 * its own `--heap-growing-percent`. Returns the percent in force, or
 * undefined for V8's own (or node's flag).
 */
export function applyHeapGrowth(
  percent: number,
  execArgv: readonly string[] = process.execArgv,
  nodeOptions: string | undefined = process.env.NODE_OPTIONS,
  setFlags: (flags: string) => void = setFlagsFromString,
): number | undefined {
  if (percent === 0 || nodeSetsHeapGrowth(execArgv, nodeOptions)) return undefined;
  setFlags(`--heap-growing-percent=${percent}`);
  return percent;
}
