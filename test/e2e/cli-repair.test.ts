/**
 * The operator's way out of refused state, as a user runs it: separate
 * `casq` processes against a real `casq serve` on a file store. `casq stats`
 * lists every queue even when one manifest cannot be read (and exits 1 naming
 * it).
 */
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type CasqServerProcess, casq, type RunResult, startServer, tempDir } from "./support/processes.ts";

let server: CasqServerProcess;
let store: { path: string; remove: () => void };

/** Runs `casq ARGS --server ADDRESS`. */
function cli(args: readonly string[], input?: string): Promise<RunResult> {
  return casq([...args, "--server", server.address], input === undefined ? {} : { input });
}

async function ok(args: readonly string[]): Promise<string> {
  const result = await cli(args);
  if (result.code !== 0)
    throw new Error(
      `casq ${args.join(" ")} exited ${result.code}\nstdout: ${result.stdout}\nstderr: ${result.stderr}`,
    );
  return result.stdout;
}

beforeAll(async () => {
  store = tempDir("cli-repair");
  server = await startServer({ store: `file:${store.path}` });
});

async function restartServer(): Promise<void> {
  await server.stop();
  server = await startServer({ store: `file:${store.path}` });
}

afterAll(async () => {
  await server?.stop();
  store?.remove();
});

describe("casq stats with an unreadable queue manifest", () => {
  it("shows the other queues, flags the bad one and exits 1", async () => {
    for (const name of ["apples", "bananas", "cherries"]) await ok(["queue", "create", name]);
    await ok(["enqueue", "cherries", "one"]);
    const manifest = join(store.path, "queues", "bananas", "queue.json");
    writeFileSync(manifest, "{truncated");
    await restartServer(); // a fresh broker, with nothing cached

    const table = await cli(["stats"]);
    expect(table.code, table.stderr).toBe(1);
    expect(table.stdout).toMatch(/^apples\s+1\s/m);
    expect(table.stdout).toMatch(/^cherries\s+1\s+1\s/m);
    expect(table.stdout).toMatch(/^bananas: CANNOT BE READ: .*queue\.json cannot be read/m);
    expect(table.stderr).toMatch(/cannot read the manifest of bananas/);

    const json = await cli(["stats", "--json"]);
    expect(json.code).toBe(1);
    const parsed = JSON.parse(json.stdout) as { queues: { queue: string }[]; problems: { queue: string }[] };
    expect(parsed.queues.map((q) => q.queue)).toEqual(["apples", "cherries"]);
    expect(parsed.problems.map((p) => p.queue)).toEqual(["bananas"]);
    expect(readFileSync(manifest, "utf8")).toBe("{truncated");
  });
});
