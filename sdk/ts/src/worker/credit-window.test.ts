/**
 * The credit window's rules, driven by hand: growth when starved with the
 * credit used up, the cap, shrinking on a standing queue, decay when the
 * broker sat on the credit, a fixed window, and grants that never make a
 * silly window nor pass the broker's max_credits.
 */
import { describe, expect, it } from "vitest";
import { CreditWindow } from "./credit-window.ts";

/** Opens a window, as a stream does: its first grant. */
function open(initial: number, min: number, max: number, maxOutstanding = 1000): CreditWindow {
  const w = new CreditWindow({ initial, min, max, maxOutstanding });
  expect(w.takeGrant()).toBe(w.size);
  return w;
}

/** One round of fast handlers: every outstanding credit comes back as a job that finishes at once. */
function fastRound(w: CreditWindow): void {
  const n = w.outstanding;
  w.noteStarved(); // idle, waiting for the broker
  for (let i = 0; i < n; i++) w.arrived();
  for (let i = 0; i < n; i++) {
    w.returned();
    w.noteStarved();
  }
  w.takeGrant();
}

describe("CreditWindow", () => {
  it("doubles while starved handlers used all the credit, up to max", () => {
    const w = open(4, 4, 50);
    const sizes: number[] = [];
    for (let i = 0; i < 8; i++) {
      fastRound(w);
      sizes.push(w.size);
    }
    expect(sizes).toEqual([8, 16, 32, 50, 50, 50, 50, 50]);
    expect(w.outstanding).toBeLessThanOrEqual(50);
  });

  it("does not grow while the handlers keep busy, and shrinks by half the standing queue", () => {
    const w = open(40, 10, 100);
    // Slow handlers: 10 run, 30 wait in the buffer through the whole epoch.
    for (let i = 0; i < 40; i++) {
      w.arrived();
      w.noteStarted(30);
    }
    expect(w.size).toBe(25);
  });

  it("decays towards min when starved handlers left the broker sitting on the credit", () => {
    const w = open(100, 10, 1000);
    // A trickle: one job at a time, handled at once, its credit granted back.
    for (let i = 0; i < 100; i++) {
      w.arrived();
      w.returned();
      w.noteStarved();
      w.outstanding += 1; // as takeGrant would, once enough came back
    }
    expect(w.size).toBeLessThan(100);
    expect(w.size).toBeGreaterThanOrEqual(10);
  });

  it("never changes a fixed window", () => {
    const w = open(6, 6, 6);
    for (let i = 0; i < 5; i++) fastRound(w);
    expect(w.size).toBe(6);
    expect(w.fixed).toBe(true);
  });

  it("holds back a grant smaller than the broker's remaining credit", () => {
    const w = open(10, 10, 10);
    for (let i = 0; i < 6; i++) w.arrived(); // 6 held, 4 outstanding
    w.returned(); // 1 could go back: less than the 4 the broker has
    expect(w.canGrant).toBe(false);
    expect(w.takeGrant()).toBe(0);
    for (let i = 0; i < 3; i++) w.returned(); // 4 could go back: as many as the broker has
    expect(w.takeGrant()).toBe(4);
    expect(w.outstanding).toBe(8);
  });

  it("keeps outstanding credit within max_credits", () => {
    const w = new CreditWindow({ initial: 2500, min: 2500, max: 2500, maxOutstanding: 1000 });
    expect(w.takeGrant()).toBe(1000);
    for (let i = 0; i < 1000; i++) w.arrived();
    expect(w.takeGrant()).toBe(1000);
    expect(w.held + w.outstanding).toBe(2000);
  });

  it("counts adopted jobs as held", () => {
    const w = new CreditWindow({ initial: 10, min: 10, max: 10, maxOutstanding: 1000 });
    w.adopt(3);
    expect(w.takeGrant()).toBe(7);
  });
});
