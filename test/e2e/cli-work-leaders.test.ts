/**
 * `casq work` on a queue whose shards are led by two different brokers: the
 * worker, pointed at one of them, still works every job, because it keeps a
 * Work stream to each shard leader (the SDK Worker), not only to the broker
 * named by --server.
 *
 * Setup: two `casq serve` processes on one file store. Broker A creates the
 * queue (2 shards) and is then restarted gracefully on the same address, so
 * that it releases its leaderships. A broker takes a shard that has no leader
 * when it first needs it: key "a" is enqueued through B only, the other keys
 * through A, which leaves the two shards with different leaders.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { type CasqServerProcess, casq, startServer, tempDir } from "./support/processes.ts";

const store = tempDir("work-leaders");
const scratch = tempDir("work-leaders-out");
const servers: CasqServerProcess[] = [];
const args = ["--leader-lease", "2s"];

afterAll(async () => {
  await Promise.all(servers.map((s) => s.stop("SIGKILL")));
  store.remove();
  scratch.remove();
});

interface QueueJson {
  totals?: { messages?: number; depth?: number };
  shards?: { shard?: number; leader?: { address?: string } }[];
}

async function stats(queue: string, server: string): Promise<QueueJson> {
  const result = await casq(["stats", queue, "--json", "--server", server]);
  expect(result.code, result.stderr).toBe(0);
  return JSON.parse(result.stdout) as QueueJson;
}

async function enqueue(queue: string, key: string, server: string): Promise<void> {
  const result = await casq(["enqueue", queue, `job ${key}`, "--key", key, "--server", server]);
  expect(result.code, result.stderr).toBe(0);
}

describe("casq work across shard leaders", () => {
  it("works the shards of every leader, not only those of the broker it reached", async () => {
    const first = await startServer({ store: `file:${store.path}`, args });
    const b = await startServer({ store: `file:${store.path}`, args });
    servers.push(first, b);
    const created = await casq(["queue", "create", "split", "--shards", "2", "--server", first.address]);
    expect(created.code, created.stderr).toBe(0);

    // A graceful stop releases A's leaderships; A comes back on the same address leading nothing.
    expect((await first.stop("SIGTERM")).code).toBe(0);
    const a = await startServer({ store: `file:${store.path}`, listen: first.address, args });
    servers.push(a);

    await enqueue("split", "a", b.address);
    for (const key of ["b", "c", "d", "e", "f", "g", "h"]) await enqueue("split", key, a.address);

    const before = await stats("split", a.address);
    expect(before.totals?.messages).toBe(8);
    const leaders = new Set(before.shards?.map((s) => s.leader?.address));
    expect(leaders).toEqual(new Set([a.address, b.address]));

    const seen = join(scratch.path, "ids");
    const work = await casq(
      [
        "work",
        "split",
        "--max-jobs",
        "8",
        "--server",
        a.address,
        "--",
        "sh",
        "-c",
        `cat > /dev/null; echo "$CASQ_MESSAGE_ID" >> '${seen}'`,
      ],
      { timeoutMs: 45_000 },
    );
    expect(work.code, work.stderr).toBe(0);
    expect(work.stderr).toContain("8 acked");
    const ids = readFileSync(seen, "utf8").split("\n").filter(Boolean);
    expect(new Set(ids).size).toBe(8);

    const after = await stats("split", a.address);
    expect(after.totals?.messages).toBe(0);
  });
});
