/**
 * `casq serve`'s memory flag: its default is the engine's page-cache budget
 * (one number, so the CLI and an embedded broker cannot drift apart).
 */
import { Command } from "commander";
import { describe, expect, test } from "vitest";
import { DEFAULT_SEGMENT_CACHE_BYTES } from "../../broker/segment-body-cache.ts";
import { DEFAULT_HEAP_GROWTH_MIN_MIB, DEFAULT_HEAP_GROWTH_PERCENT } from "../heap-growth.ts";
import { registerServe } from "./serve.ts";

/** `casq serve`'s option `long`. */
function optionOf(long: string) {
  const program = new Command();
  registerServe(program);
  return program.commands.find((c) => c.name() === "serve")?.options.find((o) => o.long === long);
}

describe("casq serve --segment-cache-mib", () => {
  test("defaults to 32 MiB, the engine's page-cache budget", () => {
    const option = optionOf("--segment-cache-mib");
    expect(option?.defaultValue).toBe(32);
    expect(DEFAULT_SEGMENT_CACHE_BYTES).toBe(32 * 1024 * 1024);
  });
});

describe("casq serve --heap-growth-percent", () => {
  test("defaults to the heap growth the broker sets, and refuses what is not a whole percent", async () => {
    const option = optionOf("--heap-growth-percent");
    expect(option?.defaultValue).toBe(DEFAULT_HEAP_GROWTH_PERCENT);
    expect(option?.envVar).toBe("CASQ_HEAP_GROWTH_PERCENT");
    const parse = option?.parseArg as (value: string, previous: unknown) => number;
    expect(parse("0", undefined)).toBe(0);
    expect(parse("40", undefined)).toBe(40);
    expect(() => parse("1.5", undefined)).toThrow(/whole number/);
    expect(() => parse("1001", undefined)).toThrow(/whole number/);
  });
});

describe("casq serve --heap-growth-min-mib", () => {
  test("defaults to the governor's floor, and refuses what is not a whole number of MiB", () => {
    const option = optionOf("--heap-growth-min-mib");
    expect(option?.defaultValue).toBe(DEFAULT_HEAP_GROWTH_MIN_MIB);
    expect(option?.envVar).toBe("CASQ_HEAP_GROWTH_MIN_MIB");
    const parse = option?.parseArg as (value: string, previous: unknown) => number;
    expect(parse("0", undefined)).toBe(0);
    expect(parse("128", undefined)).toBe(128);
    expect(() => parse("-1", undefined)).toThrow(/whole number/);
    expect(() => parse("65537", undefined)).toThrow(/whole number/);
  });
});
