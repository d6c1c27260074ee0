import { spawnSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import {
  applyHeapGrowth,
  DEFAULT_HEAP_GROWTH_MIN_MIB,
  DEFAULT_HEAP_GROWTH_PERCENT,
  growthPercentFor,
  type HeapGrowthHooks,
  nodeSetsHeapGrowth,
} from "./heap-growth.ts";

const MIB = 1024 * 1024;

/** Hooks whose heap size and full collections the test drives. */
function fakeHooks(): HeapGrowthHooks & { set: string[]; used: number; collect(): void; observing: boolean } {
  let onMajor: (() => void) | undefined;
  const hooks = {
    set: [] as string[],
    used: 10 * MIB,
    observing: false,
    setFlags: (flags: string) => hooks.set.push(flags),
    observeMajorGc(callback: () => void) {
      onMajor = callback;
      hooks.observing = true;
      return () => {
        onMajor = undefined;
        hooks.observing = false;
      };
    },
    heapUsed: () => hooks.used,
    collect: () => onMajor?.(),
  };
  return hooks;
}

describe("casq serve's heap growth", () => {
  it("grows a heap by the larger of the percent and the floor", () => {
    expect(DEFAULT_HEAP_GROWTH_PERCENT).toBe(100);
    expect(DEFAULT_HEAP_GROWTH_MIN_MIB).toBe(32);
    expect(growthPercentFor(128 * MIB, 100, 64)).toBe(100); // large heap: the percent
    expect(growthPercentFor(16 * MIB, 100, 32)).toBe(200); // small heap: 32 MiB of growth
    expect(growthPercentFor(20 * MIB, 100, 64)).toBe(320);
    expect(growthPercentFor(1 * MIB, 100, 64)).toBe(1000); // capped
    expect(growthPercentFor(32 * MIB, 100, 0)).toBe(100);
  });

  it("sets V8's --heap-growing-percent from the live heap after each full collection", () => {
    const hooks = fakeHooks();
    hooks.used = 16 * MIB;
    const governor = applyHeapGrowth(100, 64, [], undefined, hooks);
    expect(governor?.current).toBe(400);
    hooks.used = 100 * MIB;
    hooks.collect();
    hooks.used = 101 * MIB;
    hooks.collect(); // the same percent: not set again
    hooks.used = 40 * MIB;
    hooks.collect();
    expect(hooks.set).toEqual([
      "--heap-growing-percent=400",
      "--heap-growing-percent=100",
      "--heap-growing-percent=160",
    ]);
    governor?.stop();
    expect(hooks.observing).toBe(false);
  });

  it("leaves V8 its own growth for 0, and node's own flag alone", () => {
    const hooks = fakeHooks();
    expect(applyHeapGrowth(0, 64, [], undefined, hooks)).toBeUndefined();
    expect(applyHeapGrowth(25, 64, ["--heap-growing-percent=80"], undefined, hooks)).toBeUndefined();
    expect(
      applyHeapGrowth(25, 64, [], "--max-old-space-size=512 --heap_growing_percent=80", hooks),
    ).toBeUndefined();
    expect(hooks.set).toEqual([]);
    expect(hooks.observing).toBe(false);
    expect(nodeSetsHeapGrowth(["--heap-growing-percent", "80"], undefined)).toBe(true);
    expect(nodeSetsHeapGrowth(["--max-semi-space-size=4"], "--inspect")).toBe(false);
  });

  it("follows real full collections in a node process", () => {
    // A child with a live heap of ~100 MB, then a few MB: the percent set after each forced collection follows it.
    const module = join(dirname(fileURLToPath(import.meta.url)), "heap-growth.ts");
    const script = `
      import { HeapGrowthGovernor } from ${JSON.stringify(module)};
      const set = [];
      const governor = new HeapGrowthGovernor(100, 64, {
        ...(await import(${JSON.stringify(module)})).processHeapHooks,
        setFlags: (flags) => set.push(flags),
      });
      governor.start();
      const tick = () => new Promise((r) => setTimeout(r, 50));
      let live = Array.from({ length: 1_000_000 }, (_, i) => ({ i, s: "x".repeat(60) + i }));
      globalThis.gc(); await tick();
      const big = governor.current;
      live = undefined;
      globalThis.gc(); await tick();
      governor.stop();
      console.log(JSON.stringify({ big, small: governor.current, set: set.length }));
    `;
    const child = spawnSync(
      process.execPath,
      ["--expose-gc", "--import", "tsx", "--input-type=module", "-e", script],
      {
        encoding: "utf8",
      },
    );
    expect(child.stderr).toBe("");
    const seen = JSON.parse(child.stdout) as { big: number; small: number; set: number };
    expect(seen.big).toBe(100); // 100% of ~100 MB is more than the 64 MiB floor
    expect(seen.small).toBeGreaterThan(300); // a few MB live: the 64 MiB floor
    expect(seen.set).toBeGreaterThanOrEqual(3);
  });

  it("makes V8 collect more often at a lower percent (V8 honours the flag it sets)", () => {
    // The same churn of promoted garbage over a ~15 MB live heap, governed at 20% and at 1000% (no floor).
    const module = join(dirname(fileURLToPath(import.meta.url)), "heap-growth.ts");
    const majorsAt = (percent: number): number => {
      const script = `
        import { constants, PerformanceObserver } from "node:perf_hooks";
        import { HeapGrowthGovernor } from ${JSON.stringify(module)};
        new HeapGrowthGovernor(${percent}, 0).start();
        let majors = 0;
        new PerformanceObserver((list) => {
          for (const e of list.getEntries()) if (e.detail?.kind === constants.NODE_PERFORMANCE_GC_MAJOR) majors++;
        }).observe({ entryTypes: ["gc"] });
        const live = Array.from({ length: 100_000 }, (_, i) => ({ i, s: "x".repeat(100) + i }));
        const ring = new Array(100_000);
        for (let i = 0; i < 1_500_000; i++) ring[i % 100_000] = { i, s: "y".repeat(100) + i };
        await new Promise((r) => setTimeout(r, 50));
        console.log(JSON.stringify({ majors, live: live.length }));
      `;
      const child = spawnSync(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], {
        encoding: "utf8",
      });
      expect(child.stderr).toBe("");
      return (JSON.parse(child.stdout) as { majors: number }).majors;
    };
    const tight = majorsAt(20);
    const loose = majorsAt(1000);
    expect(tight).toBeGreaterThan(3 * loose);
  });
});
