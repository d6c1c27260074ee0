/**
 * The `casq` CLI as a user runs it: separate processes against a real
 * `casq serve` process. Enqueue from an argument and 2,500 NDJSON lines on
 * stdin, stats and inspect (text and --json), a `casq work` process that
 * consumes everything and stops cleanly on SIGTERM, the CASQ_* variables a
 * job's command gets, dead letters and redrive after a job that always fails,
 * queue management, purge, the exit codes (not found, connection refused,
 * usage), and --help on every command.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  type CasqServerProcess,
  casq,
  closedPort,
  type RunResult,
  spawnCasq,
  startServer,
  tempDir,
  waitFor,
} from "./support/processes.ts";

let server: CasqServerProcess;
let store: { path: string; remove: () => void };

/** Runs `casq ARGS --server ADDRESS`. */
function cli(args: readonly string[], input?: string): Promise<RunResult> {
  const end = args.indexOf("--");
  const withServer =
    end < 0
      ? [...args, "--server", server.address]
      : [...args.slice(0, end), "--server", server.address, ...args.slice(end)];
  return casq(withServer, input === undefined ? {} : { input });
}

/** Runs a CLI command that must succeed and returns its stdout. */
async function ok(args: readonly string[], input?: string): Promise<string> {
  const result = await cli(args, input);
  if (result.code !== 0) {
    throw new Error(
      `casq ${args.join(" ")} exited ${result.code}\nstdout: ${result.stdout}\nstderr: ${result.stderr}`,
    );
  }
  return result.stdout;
}

interface QueueJson {
  shardCount: number;
  totals: Record<string, number>;
  subscriptions: { subscription: string; ready: number; dead: number; depth: number }[];
  shards: { shard: number }[];
}

async function stats(queue: string): Promise<QueueJson> {
  return JSON.parse(await ok(["stats", queue, "--json"])) as QueueJson;
}

beforeAll(async () => {
  store = tempDir("cli");
  server = await startServer({ store: `file:${store.path}` });
});

afterAll(async () => {
  await server?.stop();
  store?.remove();
});

describe("casq CLI against casq serve", () => {
  it("creates a queue with 2 shards and shows it", async () => {
    const created = await ok(["queue", "create", "jobs", "--shards", "2", "--max-attempts", "4"]);
    expect(created).toContain("created queue jobs with 2 shards");
    const twice = await cli(["queue", "create", "jobs"]);
    expect(twice.code).toBe(1);
    expect(twice.stderr).toContain("ALREADY_EXISTS");
    const idempotent = await ok(["queue", "create", "jobs", "--shards", "3", "--if-not-exists"]);
    expect(idempotent).toContain("queue jobs already exists with 2 shards (unchanged)");
    const idempotentJson = JSON.parse(await ok(["queue", "create", "jobs", "--if-not-exists", "--json"]));
    expect(idempotentJson).toMatchObject({ queue: "jobs", shardCount: 2, created: false });
    const listed = JSON.parse(await ok(["queue", "list", "--json"])) as { queues: { name: string }[] };
    expect(listed.queues.map((q) => q.name)).toContain("jobs");
    const info = await stats("jobs");
    expect(info.shardCount).toBe(2);
    expect(info.shards.map((s) => s.shard)).toEqual([0, 1]);
    expect(info.subscriptions.map((s) => s.subscription)).toEqual(["default"]);
  });

  it("enqueues from an argument and from 2,500 NDJSON lines on stdin", async () => {
    const id = (
      await ok(["enqueue", "jobs", "hello world", "--key", "user-1", "--header", "type=greeting"])
    ).trim();
    expect(id).toMatch(/^[0-9A-HJKMNP-TV-Z]{26}$/);

    const lines: string[] = [];
    for (let i = 0; i < 2500; i++) {
      if (i % 3 === 0) lines.push(JSON.stringify({ payload: `job ${i}`, key: `k${i % 7}`, priority: i % 5 }));
      else if (i % 3 === 1) lines.push(JSON.stringify(`job ${i}`));
      else lines.push(`plain job ${i}`);
    }
    const result = await cli(["enqueue", "jobs", "--json"], `${lines.join("\n")}\n`);
    expect(result.code, result.stderr).toBe(0);
    const out = result.stdout
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as { line: number; id: string });
    expect(out).toHaveLength(2500);
    expect(out[0]?.line).toBe(1);
    expect(out[2499]?.line).toBe(2500);
    expect(new Set(out.map((o) => o.id)).size).toBe(2500);
    expect(result.stderr).toContain("enqueued 2500 messages to jobs");

    const info = await stats("jobs");
    expect(info.totals.messages).toBe(2501);
    expect(info.totals.ready).toBe(2501);
  });

  it("reports a bad NDJSON line with its number and exit code 2", async () => {
    const result = await cli(["enqueue", "jobs"], '{"payload":"fine"}\n{"payload": "x", "to": "y"}\n');
    expect(result.code).toBe(2);
    expect(result.stderr).toContain("stdin line 2");
    expect(result.stderr).toContain('"to" is not an envelope field');
  });

  it("shows stats for humans", async () => {
    const all = await ok(["stats"]);
    expect(all).toMatch(/QUEUE\s+SHARDS\s+MESSAGES\s+READY/);
    expect(all).toMatch(/jobs\s+2\s+2502\s+2502/);
    const one = await ok(["stats", "jobs"]);
    expect(one).toContain("queue jobs: 2 shards");
    expect(one).toMatch(/default\s+2502/);
  });

  it("prints a shard document as stored", async () => {
    const raw = await ok(["inspect", "jobs", "--shard", "1"]);
    expect(() => JSON.parse(raw)).not.toThrow();
    const wrapped = JSON.parse(await ok(["inspect", "jobs", "--json"])) as {
      shard: number;
      etag: string;
      document: unknown;
    };
    expect(wrapped.shard).toBe(0);
    expect(wrapped.etag).not.toBe("");
    expect(typeof wrapped.document).toBe("object");
    const missing = await cli(["inspect", "jobs", "--shard", "7"]);
    expect(missing.code).toBe(3);
  });

  it("works every job with `casq work` and stops cleanly on SIGTERM", async () => {
    const worker = spawnCasq([
      "work",
      "jobs",
      "--concurrency",
      "16",
      "--server",
      server.address,
      "--",
      "sh",
      "-c",
      "cat > /dev/null",
    ]);
    try {
      await waitFor(
        "the worker to drain the queue",
        async () => {
          const info = await stats("jobs");
          return info.totals.depth === 0;
        },
        90_000,
        500,
      );
    } finally {
      worker.child.kill("SIGTERM");
    }
    const exit = await worker.exited;
    expect(exit.code, worker.stderr()).toBe(0);
    expect(worker.stderr()).toMatch(/stopped after 2502 job\(s\): 2502 acked, 0 retried, 0 dead-lettered/);
    const info = await stats("jobs");
    expect(info.totals.messages).toBe(0);
  });

  it("dead-letters a job that always fails, then redrives it", async () => {
    await ok([
      "queue",
      "create",
      "failing",
      "--max-attempts",
      "2",
      "--backoff-initial",
      "50ms",
      "--backoff-max",
      "50ms",
    ]);
    await ok(["enqueue", "failing", "poison"]);
    const worker = await cli([
      "work",
      "failing",
      "--max-jobs",
      "2",
      "--",
      "sh",
      "-c",
      'cat > /dev/null; echo "cannot parse input" >&2; exit 1',
    ]);
    expect(worker.code, worker.stderr).toBe(0);
    expect(worker.stderr).toContain("exit code 1");

    const dead = JSON.parse(await ok(["dead", "failing", "--json"])) as {
      deadLetters: { reason: string; attempts: number; message: { payload: string } }[];
    };
    expect(dead.deadLetters).toHaveLength(1);
    expect(dead.deadLetters[0]?.attempts).toBe(2);
    expect(dead.deadLetters[0]?.reason).toContain("cannot parse input");
    expect(Buffer.from(dead.deadLetters[0]?.message.payload ?? "", "base64").toString()).toBe("poison");
    expect(await ok(["dead", "failing"])).toMatch(/1 dead letters/);

    expect(await ok(["dead", "failing", "--redrive"])).toContain("redrove 1 dead letters");
    let info = await stats("failing");
    expect(info.totals.dead).toBe(0);
    expect(info.totals.ready).toBe(1);

    // Exit code 65 asks for dead-lettering at once, whatever attempts are left.
    const once = await cli(["work", "failing", "--max-jobs", "1", "--", "sh", "-c", "exit 65"]);
    expect(once.code, once.stderr).toBe(0);
    info = await stats("failing");
    expect(info.totals.dead).toBe(1);
    const again = JSON.parse(await ok(["dead", "failing", "--json"])) as {
      deadLetters: { reason: string }[];
    };
    expect(again.deadLetters[0]?.reason).toContain("dead-letter requested");
  });

  it("gives the job's command its metadata in CASQ_* variables", async () => {
    const id = (
      await ok([
        "enqueue",
        "meta",
        "payload",
        "--key",
        "k1",
        "--priority",
        "7",
        "--dedup-id",
        "d-1",
        "--header",
        "h=v",
      ])
    ).trim();
    const out = join(store.path, "meta-env.json");
    const worker = await cli([
      "work",
      "meta",
      "--max-jobs",
      "1",
      "--worker-id",
      "w-1",
      "--",
      "node",
      "-e",
      `const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => k.startsWith("CASQ_")));
       require("node:fs").writeFileSync(${JSON.stringify(out)}, JSON.stringify(env));`,
    ]);
    expect(worker.code, worker.stderr).toBe(0);
    expect(worker.stderr).toContain("1 acked");
    const env = JSON.parse(readFileSync(out, "utf8")) as Record<string, string>;
    expect(env).toMatchObject({
      CASQ_QUEUE: "meta",
      CASQ_SUBSCRIPTION: "default",
      CASQ_MESSAGE_ID: id,
      CASQ_ATTEMPT: "1",
      CASQ_SHARD: "0",
      CASQ_OFFSET: "0",
      CASQ_KEY: "k1",
      CASQ_PRIORITY: "7",
      CASQ_DEDUP_ID: "d-1",
      CASQ_HEADERS: JSON.stringify({ h: "v" }),
      CASQ_WORKER_ID: "w-1",
    });
    expect(env.CASQ_RECEIPT).not.toBe("");
    expect(Date.parse(env.CASQ_ENQUEUED_AT ?? "")).not.toBeNaN();
    expect(Date.parse(env.CASQ_LEASE_DEADLINE ?? "")).not.toBeNaN();
  });

  it("purges only with --yes", async () => {
    await ok(["queue", "create", "scratch"]);
    await ok(["enqueue", "scratch"], "a\nb\nc\n");
    const refused = await cli(["purge", "scratch"]);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain("re-run with --yes");
    expect(await ok(["purge", "scratch", "--yes"])).toContain("purged 3 messages");
    expect((await stats("scratch")).totals.messages).toBe(0);
    expect(await ok(["queue", "delete", "scratch", "--yes"])).toContain("deleted queue scratch");
  });

  it("updates a queue's config", async () => {
    const updated = JSON.parse(await ok(["queue", "update", "jobs", "--lease-ttl", "2m", "--json"])) as {
      config: { leaseTtl: string };
    };
    expect(updated.config.leaseTtl).toBe("120s");
  });

  it("exits 3 for an unknown queue, 2 for bad input, 4 when nothing listens", async () => {
    const unknown = await cli(["stats", "no-such-queue"]);
    expect(unknown.code).toBe(3);
    expect(unknown.stderr).toContain("not found");
    expect((await cli(["dead", "no-such-queue"])).code).toBe(3);
    expect((await cli(["inspect", "no-such-queue"])).code).toBe(3);
    expect((await cli(["queue", "update", "no-such-queue", "--max-attempts", "3"])).code).toBe(3);
    const work = await cli(["work", "no-such-queue", "--", "true"]);
    expect(work.code, work.stderr).toBe(3);

    // Enqueue creates missing queues unless the broker runs with --auto-create-queues off.
    const strict = await startServer({ store: "memory:", args: ["--auto-create-queues", "off"] });
    try {
      const refusedEnqueue = await casq(["enqueue", "no-such-queue", "x", "--server", strict.address]);
      expect(refusedEnqueue.code, refusedEnqueue.stderr).toBe(3);
      expect(refusedEnqueue.stderr).toContain("no-such-queue");
    } finally {
      await strict.stop();
    }

    const badName = await cli(["queue", "create", "Bad Name"]);
    expect(badName.code).toBe(2);
    expect((await casq(["stats", "--server", "not-an-address"])).code).toBe(2);
    expect((await casq(["frobnicate"])).code).toBe(2);

    const port = await closedPort();
    const refused = await casq(["stats", "--server", `127.0.0.1:${port}`]);
    expect(refused.code).toBe(4);
    expect(refused.stderr).toContain(`connection refused: is casq serve running at 127.0.0.1:${port}?`);
    const viaEnv = await casq(["enqueue", "jobs", "x"], { env: { CASQ_SERVER: `127.0.0.1:${port}` } });
    expect(viaEnv.code).toBe(4);
  });

  it("has --help with examples on every command", async () => {
    const commands = [
      [],
      ["serve"],
      ["enqueue"],
      ["work"],
      ["stats"],
      ["inspect"],
      ["dead"],
      ["purge"],
      ["queue"],
      ["queue", "create"],
      ["queue", "update"],
      ["queue", "delete"],
      ["queue", "list"],
      ["subscription"],
      ["subscription", "create"],
      ["subscription", "delete"],
    ];
    const results = await Promise.all(commands.map((path) => casq([...path, "--help"])));
    results.forEach((result, index) => {
      const path = commands[index] ?? [];
      expect(result.code, `casq ${path.join(" ")} --help`).toBe(0);
      expect(result.stdout).toContain(`Usage: casq${path.length > 0 ? ` ${path.join(" ")}` : ""}`);
      expect(result.stdout, `casq ${path.join(" ")} --help`).toContain("Examples:");
    });
  });
});
