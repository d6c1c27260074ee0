import { describe, expect, it } from "vitest";
import { applyHeapGrowth, DEFAULT_HEAP_GROWTH_PERCENT, nodeSetsHeapGrowth } from "./heap-growth.ts";

describe("casq serve's heap growth", () => {
  it("sets V8's --heap-growing-percent", () => {
    const set: string[] = [];
    expect(applyHeapGrowth(25, [], undefined, (f) => set.push(f))).toBe(25);
    expect(set).toEqual(["--heap-growing-percent=25"]);
    expect(DEFAULT_HEAP_GROWTH_PERCENT).toBe(0); // V8's own unless asked: a lower growth costs CPU
  });

  it("leaves V8 its own growth for 0, and node's own flag alone", () => {
    const set: string[] = [];
    expect(applyHeapGrowth(0, [], undefined, (f) => set.push(f))).toBeUndefined();
    expect(applyHeapGrowth(25, ["--heap-growing-percent=80"], undefined, (f) => set.push(f))).toBeUndefined();
    expect(
      applyHeapGrowth(25, [], "--max-old-space-size=512 --heap_growing_percent=80", (f) => set.push(f)),
    ).toBeUndefined();
    expect(set).toEqual([]);
    expect(nodeSetsHeapGrowth(["--heap-growing-percent", "80"], undefined)).toBe(true);
    expect(nodeSetsHeapGrowth(["--max-semi-space-size=4"], "--inspect")).toBe(false);
  });
});
