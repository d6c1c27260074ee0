import { existsSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { LONG_FILES, longFileRank } from "./long-files-first.ts";

const ROOT = join(import.meta.dirname, "..", "..");

describe("the test files started first", () => {
  test.each(LONG_FILES)("%s exists (a renamed file would silently start late again)", (file) => {
    expect(existsSync(join(ROOT, file))).toBe(true);
  });

  test("rank: in the list's order, every other file after them", () => {
    expect(LONG_FILES.map((file) => longFileRank(join(ROOT, file)))).toEqual(LONG_FILES.map((_, i) => i));
    expect(longFileRank(join(ROOT, "test/e2e/other.test.ts"))).toBe(LONG_FILES.length);
    expect(longFileRank(join(ROOT, "x/test/e2e/cli.test.tsx"))).toBe(LONG_FILES.length);
  });
});

test("vitest.config.ts sorts with it", async () => {
  const { default: config } = await import("../../vitest.config.ts");
  const { LongFilesFirst } = await import("./long-files-first.ts");
  expect(config.test?.sequence?.sequencer).toBe(LongFilesFirst);
});
