import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { fnv1a, shardForKey } from "./shard-routing.ts";

/** FNV-1a over the UTF-8 bytes, as the Go and Python SDKs compute it. */
function reference(text: string): number {
  let hash = 0x811c9dc5;
  for (const byte of Buffer.from(text, "utf8")) {
    hash ^= byte;
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return hash >>> 0;
}

describe("key routing hash", () => {
  it("is 32-bit FNV-1a of the UTF-8 bytes (published test vectors)", () => {
    expect(fnv1a("")).toBe(0x811c9dc5);
    expect(fnv1a("a")).toBe(0xe40c292c);
    expect(fnv1a("foobar")).toBe(0xbf9cf968);
  });

  it("gives the same hash on its ASCII path as over the UTF-8 bytes, for any string", () => {
    fc.assert(
      fc.property(fc.string({ unit: "binary", maxLength: 40 }), (text) => {
        expect(fnv1a(text)).toBe(reference(text));
      }),
      { numRuns: 500 },
    );
    for (const text of ["customer-7", "ключ", "k\u00e9y", "emoji-\u{1f600}", "x".repeat(300)])
      expect(fnv1a(text)).toBe(reference(text));
    expect(shardForKey("ключ", 7)).toBe(reference("ключ") % 7);
  });
});
