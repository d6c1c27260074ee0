import { describe, expect, it } from "vitest";
import { randomHex } from "./random-hex.ts";

describe("randomHex", () => {
  it("gives two lowercase hex characters a byte", () => {
    for (const bytes of [1, 8, 16, 4096])
      expect(randomHex(bytes)).toMatch(new RegExp(`^[0-9a-f]{${bytes * 2}}$`));
  });

  it("never hands out the same bytes twice, across refills of the pool", () => {
    // 24-byte draws do not divide the 4 KiB pool: some draws meet its end and start a refill.
    const seen = new Set<string>();
    for (let i = 0; i < 20_000; i++) seen.add(randomHex(i % 2 === 0 ? 16 : 24));
    expect(seen.size).toBe(20_000);
  });

  it("spreads its bytes over every value", () => {
    const counts = new Array<number>(256).fill(0);
    const hex = Array.from({ length: 64 }, () => randomHex(4096)).join("");
    for (let i = 0; i < hex.length; i += 2) {
      const value = Number.parseInt(hex.slice(i, i + 2), 16);
      counts[value] = (counts[value] ?? 0) + 1;
    }
    // 262,144 bytes: 1,024 expected per value; a value off by a third would be a broken source.
    for (const n of counts) expect(n).toBeGreaterThan(680);
  });

  it("refuses sizes it cannot draw", () => {
    for (const bytes of [0, -1, 1.5, 4097]) expect(() => randomHex(bytes)).toThrow(RangeError);
  });
});
