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

/** An open window of min 50 and max 5000 that grows freely up to `growFreelyTo`, on the clock `now`. */
function timed(initial: number, growFreelyTo: number, now: (() => number) | undefined): CreditWindow {
  const w = new CreditWindow({ initial, min: 50, max: 5000, maxOutstanding: 10_000, growFreelyTo, now });
  w.takeGrant();
  return w;
}

describe("CreditWindow", () => {
  it("grows while starved handlers waited for credit the broker used: x4 when it used all, x2 most; up to max", () => {
    const w = open(4, 4, 50);
    const sizes: number[] = [];
    for (let i = 0; i < 4; i++) {
      fastRound(w);
      sizes.push(w.size);
    }
    expect(sizes).toEqual([16, 50, 50, 50]);
    expect(w.outstanding).toBeLessThanOrEqual(50);
    // The broker keeps one credit back each round: it used most, not all.
    const most = open(4, 4, 50);
    const seen: number[] = [];
    for (let i = 0; i < 12; i++) {
      most.noteStarved();
      const n = most.outstanding - 1;
      for (let j = 0; j < n; j++) most.arrived();
      for (let j = 0; j < n; j++) most.returned();
      most.outstanding = most.size; // the held-back credit is used by the next round
      if (seen.at(-1) !== most.size) seen.push(most.size);
    }
    expect(seen).toEqual([4, 8, 16, 32, 50]);
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

  it("past growFreelyTo, grows while each commit's burst of jobs is a large part of the window", () => {
    // A slow store: every 100 ms a commit brings all the credit the broker had, at once.
    let t = 0;
    const w = timed(50, 1000, () => t);
    const sizes: number[] = [];
    for (let i = 0; i < 12; i++) {
      t += 100;
      fastRound(w);
      sizes.push(w.size);
    }
    expect(sizes.slice(0, 5)).toEqual([200, 800, 1000, 2000, 4000]);
    expect(sizes.at(-1)).toBe(5000);
  });

  it("past growFreelyTo, does not grow for a busy broker that sends the same few jobs per commit", () => {
    // A fast store, a busy broker: 100 jobs every 5 ms whatever the credit (it used all it had left).
    let t = 0;
    const w = timed(800, 800, () => t);
    for (let round = 0; round < 40; round++) {
      t += round === 20 ? 100 : 5; // one long pause (a GC, say) is not a commit interval
      w.outstanding = 100;
      w.noteStarved();
      for (let i = 0; i < 100; i++) {
        w.arrived();
        w.returned();
      }
    }
    expect(w.size).toBe(800);
    // The same window without a clock never grows past growFreelyTo either.
    const untimed = timed(800, 800, undefined);
    for (let i = 0; i < 10; i++) fastRound(untimed);
    expect(untimed.size).toBe(800);
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
