import { describe, expect, it } from "vitest";
import { formatReceipt, parseReceipt, parseReceipts } from "./receipts.ts";

describe("receipts", () => {
  it("round-trips shard, offset and attempt", () => {
    expect(formatReceipt(3, 1043, 2)).toBe("3.1043.2");
    expect(parseReceipt("3.1043.2", 0, 4)).toEqual({ shard: 3, offset: 1043, attempt: 2 });
    expect(parseReceipt("0.0.1", 0, 1)).toEqual({ shard: 0, offset: 0, attempt: 1 });
  });

  it("parses strictly", () => {
    for (const bad of [
      "",
      "1.2",
      "1.2.3.4",
      "a.b.c",
      "-1.2.3",
      "1.2.0",
      "01.2.3",
      "1.02.3",
      " 1.2.3",
      "1.2.3 ",
      "1.2.+3",
      "1.99999999999999999.1",
    ])
      expect(() => parseReceipt(bad, 4, 10), bad).toThrow(/receipts\[4\]/);
    expect(() => parseReceipt("5.1.1", 0, 5)).toThrow(/names shard 5, but the queue has 5 shard/);
  });

  it("bounds the number of receipts", () => {
    expect(() => parseReceipts([], 1)).toThrow(/receipts is empty/);
    expect(() =>
      parseReceipts(
        Array.from({ length: 1001 }, () => "0.0.1"),
        1,
      ),
    ).toThrow(/at most 1000/);
    expect(parseReceipts(["0.1.1", "0.1.1"], 1)).toHaveLength(2);
  });
});
