import { describe, expect, it } from "vitest";
import type { Clock } from "../util/clock.ts";
import { seededRandom } from "../util/random.ts";
import { newMessageId } from "./message-ids.ts";

/** A clock standing at `ms` (moved by assigning `ms`). */
function clockAt(ms: number): Clock & { ms: number } {
  return {
    ms,
    now() {
      return this.ms;
    },
    sleep: async () => {},
  };
}

describe("message ids", () => {
  it("are 26 Crockford base-32 digits: 10 of milliseconds, then 16 random", () => {
    const clock = clockAt(1_700_000_000_123);
    const id = newMessageId(clock, seededRandom(7));
    expect(id).toMatch(/^[0-9A-HJKMNP-TV-Z]{26}$/);
    let ms = 0;
    for (const c of id.slice(0, 10)) ms = ms * 32 + "0123456789ABCDEFGHJKMNPQRSTVWXYZ".indexOf(c);
    expect(ms).toBe(1_700_000_000_123);
  });

  it("sort by time, and repeat exactly for the same clock and seed", () => {
    const clock = clockAt(1_000);
    const a = newMessageId(clock, seededRandom(1));
    clock.ms += 1;
    const b = newMessageId(clock, seededRandom(1));
    expect(a < b).toBe(true);
    expect(a.slice(10)).toBe(b.slice(10));
    expect(newMessageId(clock, seededRandom(2))).not.toBe(b);
    expect(newMessageId(clock, seededRandom(1))).toBe(b);
  });
});
