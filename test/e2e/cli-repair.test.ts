/**
 * The operator's way out of refused state, as a user runs it: separate
 * `casq` processes against a real `casq serve` on a file store. `casq stats`
 * lists every queue even when one manifest cannot be read (and exits 1 naming
 * it).
 */
import { readFileSync, rmSync, writeFileSync } from "node:fs";
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

describe("casq repair", () => {
  it("refuses without a terminal or --yes, then repairs a corrupt shard with --yes, keeping the bytes", async () => {
    await ok(["queue", "create", "mended", "--shards", "2"]);
    await ok(["enqueue", "mended", "before", "--key", "k"]);
    const file = join(store.path, "queues", "mended", "0.json");
    writeFileSync(file, '{"format":"casq.shard.v1","oops"');
    const refused = await cli(["enqueue", "mended", "x", "--key", "k"]);
    const shard0 = refused.code !== 0; // the key may live on shard 1
    expect((await cli(["purge", "mended", "--yes"])).code).toBe(1);

    const unconfirmed = await cli(["repair", "mended", "--shard", "0"], "yes\n");
    expect(unconfirmed.code).toBe(2);
    expect(unconfirmed.stderr).toMatch(/without a terminal to confirm, re-run with --yes/);
    expect(readFileSync(file, "utf8")).toBe('{"format":"casq.shard.v1","oops"');

    const repaired = await cli(["repair", "mended", "--shard", "0", "--yes", "--json"]);
    expect(repaired.code, repaired.stderr).toBe(0);
    const result = JSON.parse(repaired.stdout) as { backupKey: string; subscriptions: string[] };
    expect(result.subscriptions).toEqual(["default"]);
    // (The file store frames each object with a header line; the body follows it unchanged.)
    expect(readFileSync(join(store.path, ...result.backupKey.split("/")), "utf8")).toContain(
      '{"format":"casq.shard.v1","oops"',
    );
    expect(readFileSync(file, "utf8")).toContain('"queue":"mended","shard":0');
    await ok(["purge", "mended", "--yes"]);
    if (shard0) await ok(["enqueue", "mended", "after", "--key", "k"]);
    expect((await cli(["repair", "mended", "--shard", "0", "--yes"])).code).toBe(1); // readable now

    const help = await cli(["repair", "--help"]);
    expect(help.stdout).toMatch(/--next-offset/);
    expect(help.stdout).toMatch(/repairs\/<queue>\/<shard>/);
    expect(help.stdout).toMatch(/--yes/);
  });

  it("warns that offsets restart at 0 when the document is missing and --next-offset is not given", async () => {
    await ok(["queue", "create", "lost", "--shards", "2"]);
    const file = join(store.path, "queues", "lost", "1.json");
    rmSync(file);
    await restartServer();
    const repaired = await cli(["repair", "lost", "--shard", "1", "--yes"]);
    expect(repaired.code, repaired.stderr).toBe(0);
    expect(repaired.stderr).toMatch(/document of shard lost\/1 is missing.*offsets restart at 0/s);
    expect(repaired.stderr).toMatch(/--next-offset/);

    rmSync(file);
    await restartServer();
    const raised = await cli(["repair", "lost", "--shard", "1", "--yes", "--next-offset", "500"]);
    expect(raised.code, raised.stderr).toBe(0);
    expect(raised.stderr).not.toMatch(/offsets restart at 0/);
    expect(raised.stdout).toMatch(/next offset 500/);
  });
});
