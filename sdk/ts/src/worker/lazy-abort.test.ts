import { describe, expect, it } from "vitest";
import { LazyAbort } from "./lazy-abort.ts";

describe("LazyAbort", () => {
  it("aborts a signal already read, with the reason, once", () => {
    const abort = new LazyAbort();
    const signal = abort.signal;
    let events = 0;
    signal.addEventListener("abort", () => (events += 1));
    expect(signal.aborted).toBe(false);
    abort.abort("lost");
    abort.abort("stopped");
    expect(signal.aborted).toBe(true);
    expect(signal.reason).toBe("lost");
    expect(events).toBe(1);
    expect(abort.signal).toBe(signal);
  });

  it("gives a signal read after the abort already aborted, with the first reason", () => {
    const abort = new LazyAbort();
    expect(abort.aborted).toBe(false);
    abort.abort("lost");
    abort.abort("stopped");
    expect(abort.aborted).toBe(true);
    expect(abort.signal.aborted).toBe(true);
    expect(abort.signal.reason).toBe("lost");
  });

  it("answers the same signal on every read", () => {
    const abort = new LazyAbort();
    expect(abort.signal).toBe(abort.signal);
  });
});
