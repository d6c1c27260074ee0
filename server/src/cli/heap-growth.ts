/**
 * How far `casq serve` lets V8's JS heap grow past what its last full
 * collection found live before it collects again (`--heap-growth-percent`
 * and `--heap-growth-min-mib`).
 *
 * Why: a busy broker's garbage is mostly promoted garbage — messages live in
 * the head's tail and in the page cache for longer than a young-generation
 * collection, then die in the old generation — and V8 on a machine with a
 * few GB of memory lets the old generation grow to up to 4 times its live
 * size before a full collection. For a broker with ~40-60 MB live (a deep
 * backlog) that was a heap of 150 MB and more, and a resident size of
 * ~390-440 MiB peak at a 1M backlog. A growth of 100% over the live heap
 * kept that peak near 320 MiB for about the same CPU; but a fixed percent
 * alone makes a small heap (~25 MB live: a broker with little queued)
 * collect every ~25 MB, which looked costly for the small shapes of
 * `npm run bench`. So the growth is the larger of a percent of the live
 * heap and a floor in MiB: a small heap still grows by at least 32 MiB
 * before a collection, a large one by at most 100%. (A 64 MiB floor held
 * ~30 MiB more at the peak of a 1M-job load, whose live heap is ~40 MB.)
 *
 * V8 has no runtime knob for the floor (`--initial-old-space-size` is read
 * only when the heap is made), so {@link HeapGrowthGovernor} sets V8's
 * `--heap-growing-percent` (read at every collection) after each full
 * collection, from the live size that collection left: the percent that
 * gives the floor, or the percent, whichever is larger. A
 * `--heap-growing-percent` given to node itself (command line or
 * NODE_OPTIONS) wins, and `--heap-growth-percent 0` leaves V8 its own
 * dynamic growth.
 */
import { constants, type PerformanceEntry, PerformanceObserver } from "node:perf_hooks";
import { getHeapStatistics, setFlagsFromString } from "node:v8";

/** The default of `--heap-growth-percent`. */
export const DEFAULT_HEAP_GROWTH_PERCENT = 100;

/** The default of `--heap-growth-min-mib`. */
export const DEFAULT_HEAP_GROWTH_MIN_MIB = 32;

/** The most `--heap-growth-percent` accepts (V8's own dynamic factor is at most 300%). */
export const MAX_HEAP_GROWTH_PERCENT = 1000;

/** The most `--heap-growth-min-mib` accepts. */
export const MAX_HEAP_GROWTH_MIN_MIB = 65_536;

const MIB = 1024 * 1024;

/** True when node was started with its own `--heap-growing-percent`. */
export function nodeSetsHeapGrowth(execArgv: readonly string[], nodeOptions: string | undefined): boolean {
  const given = [...execArgv, ...(nodeOptions ?? "").split(/\s+/)];
  return given.some((arg) => /^--heap[-_]growing[-_]percent(=|$)/.test(arg));
}

/**
 * The growth percent for a heap of `liveBytes` after a full collection: at
 * least `percent`, and enough for `minMib` of growth. Whole percent, at most
 * {@link MAX_HEAP_GROWTH_PERCENT}.
 */
export function growthPercentFor(liveBytes: number, percent: number, minMib: number): number {
  if (liveBytes <= 0) return MAX_HEAP_GROWTH_PERCENT;
  const forFloor = Math.ceil(((minMib * MIB) / liveBytes) * 100);
  return Math.min(MAX_HEAP_GROWTH_PERCENT, Math.max(percent, forFloor));
}

/** What the governor needs of the process (injected by tests). */
export interface HeapGrowthHooks {
  /** Sets V8 flags (`v8.setFlagsFromString`). */
  readonly setFlags: (flags: string) => void;
  /** Calls `onMajor` after every full collection; returns a function that stops that. */
  readonly observeMajorGc: (onMajor: () => void) => () => void;
  /** The JS heap's bytes in use now. */
  readonly heapUsed: () => number;
}

/** A `gc` performance entry (its `detail` is not in the Node 20 typings). */
type GcEntry = PerformanceEntry & { readonly detail?: { readonly kind?: number } };

/** The process's own hooks: perf_hooks' `gc` entries and V8's heap statistics. */
export const processHeapHooks: HeapGrowthHooks = {
  setFlags: setFlagsFromString,
  observeMajorGc(onMajor) {
    const observer = new PerformanceObserver((list) => {
      const major = list
        .getEntries()
        .some((e) => (e as GcEntry).detail?.kind === constants.NODE_PERFORMANCE_GC_MAJOR);
      if (major) onMajor();
    });
    observer.observe({ entryTypes: ["gc"] });
    return () => observer.disconnect();
  },
  heapUsed: () => getHeapStatistics().used_heap_size,
};

/**
 * Keeps V8's `--heap-growing-percent` at {@link growthPercentFor} the live
 * heap of the last full collection (see the module header).
 */
export class HeapGrowthGovernor {
  readonly #percent: number;
  readonly #minMib: number;
  readonly #hooks: HeapGrowthHooks;
  #stop: (() => void) | undefined;
  #current: number | undefined;

  constructor(percent: number, minMib: number, hooks: HeapGrowthHooks = processHeapHooks) {
    this.#percent = percent;
    this.#minMib = minMib;
    this.#hooks = hooks;
  }

  /** The percent last set (undefined before {@link start}). */
  get current(): number | undefined {
    return this.#current;
  }

  /** Sets the growth for the heap in use now, then again after every full collection. */
  start(): void {
    this.#set();
    this.#stop ??= this.#hooks.observeMajorGc(() => this.#set());
  }

  /** Stops adjusting; the last percent set stays in force. */
  stop(): void {
    this.#stop?.();
    this.#stop = undefined;
  }

  #set(): void {
    const percent = growthPercentFor(this.#hooks.heapUsed(), this.#percent, this.#minMib);
    if (percent === this.#current) return;
    this.#hooks.setFlags(`--heap-growing-percent=${percent}`);
    this.#current = percent;
  }
}

/**
 * Starts governing the heap's growth with `percent` (0: leave V8's own
 * dynamic growth) and a floor of `minMib`, unless node was given its own
 * `--heap-growing-percent`. Returns the governor, or undefined when V8's
 * own growth (or node's flag) is in force.
 */
export function applyHeapGrowth(
  percent: number,
  minMib: number = DEFAULT_HEAP_GROWTH_MIN_MIB,
  execArgv: readonly string[] = process.execArgv,
  nodeOptions: string | undefined = process.env.NODE_OPTIONS,
  hooks: HeapGrowthHooks = processHeapHooks,
): HeapGrowthGovernor | undefined {
  if (percent === 0 || nodeSetsHeapGrowth(execArgv, nodeOptions)) return undefined;
  const governor = new HeapGrowthGovernor(percent, minMib, hooks);
  governor.start();
  return governor;
}
