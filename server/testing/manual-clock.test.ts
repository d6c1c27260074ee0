import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { MANUAL_CLOCK_DEFAULT_START_MS, ManualClock } from "./manual-clock.ts";

describe("ManualClock", () => {
  it("starts at a fixed, realistic time unless told otherwise", () => {
    expect(new ManualClock().now()).toBe(MANUAL_CLOCK_DEFAULT_START_MS);
    expect(new ManualClock({ startMs: 1000 }).now()).toBe(1000);
  });

  it("resolves a sleep only once time reaches its deadline", async () => {
    const clock = new ManualClock({ startMs: 0 });
    let done = false;
    void clock.sleep(100).then(() => {
      done = true;
    });
    await clock.advanceBy(99);
    expect(done).toBe(false);
    expect(clock.pendingTimers()).toBe(1);
    expect(clock.nextDeadline()).toBe(100);
    await clock.advanceBy(1);
    expect(done).toBe(true);
    expect(clock.pendingTimers()).toBe(0);
    expect(clock.now()).toBe(100);
  });

  it("fires timers in deadline order, ties in the order sleep was called", async () => {
    const clock = new ManualClock({ startMs: 0 });
    const order: string[] = [];
    const track = (name: string, ms: number) => void clock.sleep(ms).then(() => order.push(name));
    track("c30", 30);
    track("a10", 10);
    track("b20-first", 20);
    track("b20-second", 20);
    track("a10-second", 10);
    expect(clock.advance(25)).toBe(4);
    await clock.settle();
    expect(order).toEqual(["a10", "a10-second", "b20-first", "b20-second"]);
    expect(clock.now()).toBe(25);
    await clock.runUntilIdle();
    expect(order.at(-1)).toBe("c30");
  });

  it("lets woken code observe its own deadline and schedule timers inside the same advance", async () => {
    const clock = new ManualClock({ startMs: 0 });
    const seen: number[] = [];
    const loop = async () => {
      for (let i = 0; i < 5; i++) {
        await clock.sleep(10);
        seen.push(clock.now());
      }
    };
    const done = loop();
    expect(await clock.advanceBy(35)).toBe(3);
    expect(seen).toEqual([10, 20, 30]);
    expect(clock.now()).toBe(35);
    await clock.advanceBy(100);
    await done;
    expect(seen).toEqual([10, 20, 30, 40, 50]);
  });

  it("shows the final time to continuations when advanced synchronously", async () => {
    const clock = new ManualClock({ startMs: 0 });
    const seen: number[] = [];
    void clock.sleep(10).then(() => seen.push(clock.now()));
    clock.advance(50);
    await clock.settle();
    expect(seen).toEqual([50]);
  });

  it("resolves a zero or negative sleep without a tick", async () => {
    const clock = new ManualClock({ startMs: 0 });
    await clock.sleep(0);
    await clock.sleep(-5);
    await clock.sleep(Number.NaN);
    expect(clock.pendingTimers()).toBe(0);
    expect(clock.now()).toBe(0);
  });

  it("rejects with the abort reason and forgets the timer", async () => {
    const clock = new ManualClock({ startMs: 0 });
    const controller = new AbortController();
    const sleeping = clock.sleep(100, controller.signal);
    expect(clock.pendingTimers()).toBe(1);
    const reason = new Error("stop");
    controller.abort(reason);
    await expect(sleeping).rejects.toBe(reason);
    expect(clock.pendingTimers()).toBe(0);
  });

  it("rejects at once when the signal is already aborted", async () => {
    const clock = new ManualClock();
    const reason = new Error("already");
    await expect(clock.sleep(10, AbortSignal.abort(reason))).rejects.toBe(reason);
    await expect(clock.sleep(0, AbortSignal.abort(reason))).rejects.toBe(reason);
    expect(clock.pendingTimers()).toBe(0);
  });

  it("ignores an abort after the timer fired", async () => {
    const clock = new ManualClock({ startMs: 0 });
    const controller = new AbortController();
    const sleeping = clock.sleep(10, controller.signal);
    await clock.advanceBy(10);
    controller.abort();
    await expect(sleeping).resolves.toBeUndefined();
  });

  it("never goes backwards", async () => {
    const clock = new ManualClock({ startMs: 100 });
    expect(() => clock.advanceTo(99)).toThrow(RangeError);
    expect(() => clock.advance(-1)).toThrow(RangeError);
    await expect(clock.advanceBy(-1)).rejects.toThrow(RangeError);
    await expect(clock.runUntil(50)).rejects.toThrow(RangeError);
    expect(clock.now()).toBe(100);
  });

  it("refuses to spin forever in runUntilIdle when a loop re-arms its timer", async () => {
    const clock = new ManualClock({ startMs: 0, maxTimersPerRun: 50 });
    const controller = new AbortController();
    const ticker = (async () => {
      for (;;) await clock.sleep(1, controller.signal);
    })().catch(() => undefined);
    await expect(clock.runUntilIdle()).rejects.toThrow(/re-arming/);
    // A bounded run is the right tool for periodic loops.
    expect(await clock.runUntil(clock.now() + 10)).toBe(10);
    controller.abort();
    await ticker;
  });

  it("fires any set of timers sorted by (deadline, registration order)", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.integer({ min: 1, max: 50 }), { maxLength: 40 }), async (delays) => {
        const clock = new ManualClock({ startMs: 0 });
        const fired: number[] = [];
        delays.forEach((ms, index) => void clock.sleep(ms).then(() => fired.push(index)));
        await clock.runUntilIdle();
        const expected = delays
          .map((ms, index) => ({ ms, index }))
          .sort((a, b) => a.ms - b.ms || a.index - b.index)
          .map((t) => t.index);
        expect(fired).toEqual(expected);
      }),
      { numRuns: 100 },
    );
  });

  it("replays an interleaving of concurrent sleepers identically", async () => {
    const run = async () => {
      const clock = new ManualClock({ startMs: 0 });
      const log: string[] = [];
      const worker = async (name: string, step: number) => {
        for (let i = 0; i < 4; i++) {
          await clock.sleep(step);
          log.push(`${name}@${clock.now()}`);
          await Promise.resolve();
          log.push(`${name}:after`);
        }
      };
      const all = Promise.all([worker("a", 7), worker("b", 5), worker("c", 7)]);
      await clock.runUntilIdle();
      await all;
      return log;
    };
    const first = await run();
    expect(await run()).toEqual(first);
    expect(first.slice(0, 4)).toEqual(["b@5", "b:after", "a@7", "a:after"]);
  });
});
