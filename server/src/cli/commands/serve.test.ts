/**
 * `casq serve`'s memory flag: its default is the engine's page-cache budget
 * (one number, so the CLI and an embedded broker cannot drift apart).
 */
import { Command } from "commander";
import { describe, expect, test } from "vitest";
import { DEFAULT_SEGMENT_CACHE_BYTES } from "../../broker/segment-body-cache.ts";
import { registerServe } from "./serve.ts";

describe("casq serve --segment-cache-mib", () => {
  test("defaults to 32 MiB, the engine's page-cache budget", () => {
    const program = new Command();
    registerServe(program);
    const serve = program.commands.find((c) => c.name() === "serve");
    const option = serve?.options.find((o) => o.long === "--segment-cache-mib");
    expect(option?.defaultValue).toBe(32);
    expect(DEFAULT_SEGMENT_CACHE_BYTES).toBe(32 * 1024 * 1024);
  });
});
