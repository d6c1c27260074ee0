import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { type Backoff, backoffCap, backoffDelay, type RandomSource } from "./backoff.ts";
import { retryDelayMs } from "./failover.ts";

const fixed = (u: number): RandomSource => ({ next: () => u });
const backoff: Backoff = { immediateRetries: 2, baseDelayMs: 10, maxDelayMs: 100, jitter: "full" };

describe("backoffCap", () => {
  it("is 0 for the immediate retries, then doubles from the base up to the max", () => {
    expect([1, 2, 3, 4, 5, 6, 7].map((attempt) => backoffCap(attempt, backoff))).toEqual([
      0, 0, 10, 20, 40, 80, 100,
    ]);
  });

  it("stays finite for huge attempts, and is 0 for a zero base", () => {
    expect(backoffCap(10_000, backoff)).toBe(100);
    expect(backoffCap(5, { ...backoff, baseDelayMs: 0 })).toBe(0);
  });
});

describe("backoffDelay", () => {
  it("randomises the cap by the jitter mode", () => {
    expect(backoffDelay(4, { ...backoff, jitter: "none" }, fixed(0.5))).toBe(20);
    expect(backoffDelay(4, { ...backoff, jitter: "full" }, fixed(0.5))).toBe(10);
    expect(backoffDelay(4, { ...backoff, jitter: "equal" }, fixed(0.5))).toBe(15);
    expect(backoffDelay(4, { ...backoff, jitter: "equal" }, fixed(0))).toBe(10);
  });

  it("draws one random number per jittered positive cap, none otherwise", () => {
    let draws = 0;
    const counting: RandomSource = {
      next: () => {
        draws++;
        return 0.5;
      },
    };
    backoffDelay(1, backoff, counting);
    backoffDelay(4, { ...backoff, jitter: "none" }, counting);
    expect(draws).toBe(0);
    backoffDelay(4, backoff, counting);
    expect(draws).toBe(1);
  });

  it("uses Math.random when no source is given, within [0, cap]", () => {
    for (let i = 0; i < 100; i++) {
      const delay = backoffDelay(5, backoff);
      expect(delay).toBeGreaterThanOrEqual(0);
      expect(delay).toBeLessThanOrEqual(40);
    }
  });
});

describe("retryDelayMs (the SDK's schedule)", () => {
  const options = { backoffInitialMs: 100, backoffMaxMs: 5_000 };

  it("is a whole number of ms between half and all of min(max, initial * 2^(attempt-1))", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 2_000 }),
        fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }),
        (attempt, u) => {
          const cap = Math.min(5_000, 100 * 2 ** (attempt - 1));
          const delay = retryDelayMs(attempt, options, fixed(u));
          expect(Number.isInteger(delay)).toBe(true);
          expect(delay).toBeGreaterThanOrEqual(cap / 2);
          expect(delay).toBeLessThanOrEqual(cap);
        },
      ),
    );
  });

  it("starts at the first cap's lower half and is never 0 while the initial delay is positive", () => {
    expect(retryDelayMs(1, options, fixed(0))).toBe(50);
    expect(retryDelayMs(3, options, fixed(0.5))).toBe(300);
    expect(retryDelayMs(30, options, fixed(0))).toBe(2_500);
  });
});
