import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { backoffDelayMs, hash32, jitterUnit } from "./backoff.ts";

const policy = { initialMs: 1000, multiplier: 2, maxMs: 300_000, jitter: 0.2 };

describe("backoff", () => {
  it("grows exponentially without jitter and caps at max", () => {
    const noJitter = { ...policy, jitter: 0 };
    expect([1, 2, 3, 4, 5].map((f) => backoffDelayMs(noJitter, f, "m", f))).toEqual([
      1000, 2000, 4000, 8000, 16000,
    ]);
    expect(backoffDelayMs(noJitter, 30, "m", 30)).toBe(300_000);
    expect(backoffDelayMs(noJitter, 5000, "m", 5000)).toBe(300_000); // no Infinity / NaN
  });

  it("is deterministic per (message id, attempt)", () => {
    expect(backoffDelayMs(policy, 2, "msg-a", 2)).toBe(backoffDelayMs(policy, 2, "msg-a", 2));
    expect(jitterUnit("msg-a", 1)).toBe(jitterUnit("msg-a", 1));
    expect(hash32("abc")).toBe(hash32("abc"));
  });

  it("spreads different messages", () => {
    const delays = new Set(Array.from({ length: 50 }, (_, i) => backoffDelayMs(policy, 1, `msg-${i}`, 1)));
    expect(delays.size).toBeGreaterThan(30);
  });

  it("stays within the jitter bounds and the cap (property)", () => {
    fc.assert(
      fc.property(
        fc.string(),
        fc.integer({ min: 1, max: 40 }),
        fc.integer({ min: 1, max: 100 }),
        fc.double({ min: 0, max: 1, noNaN: true }),
        (id, failures, attempt, jitter) => {
          const p = { ...policy, jitter };
          const base = Math.min(p.maxMs, p.initialMs * p.multiplier ** (failures - 1));
          const delay = backoffDelayMs(p, failures, id, attempt);
          expect(Number.isInteger(delay)).toBe(true);
          expect(delay).toBeGreaterThanOrEqual(Math.floor(base * (1 - jitter)));
          expect(delay).toBeLessThanOrEqual(Math.min(p.maxMs, Math.ceil(base * (1 + jitter))));
          const u = jitterUnit(id, attempt);
          expect(u >= 0 && u < 1).toBe(true);
        },
      ),
    );
  });
});
