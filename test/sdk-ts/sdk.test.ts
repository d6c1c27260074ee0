/**
 * The TypeScript SDK (@casq/sdk) against real in-process casq servers over
 * gRPC on loopback: produce and consume, batches, priority, delay, dedup,
 * retries, dead letters and redrive, graceful stop, redirects and failover.
 */
import {
  Admin,
  AlreadyExistsError,
  Code,
  DeadLetterError,
  type Job,
  NotFoundError,
  Producer,
  RedirectError,
  toCasqError,
  Worker,
  type WorkerOptions,
} from "@casq/sdk";
import { context, TraceFlags, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { afterEach, describe, expect, it } from "vitest";
import { tempDirForTest } from "../../server/testing/test-temp-dir.ts";
import { closeServers, deadAddress, eventually, startServer } from "./support.ts";

const workers: Worker[] = [];
afterEach(async () => {
  await Promise.all(workers.splice(0).map((w) => w.stop({ timeoutMs: 100 })));
  await closeServers();
});

function worker(brokers: string[], options: Partial<WorkerOptions> = {}): Worker {
  const w = new Worker({ brokers, workerId: "test-worker", ...options });
  workers.push(w);
  return w;
}

/** Runs a worker that records every job it sees; `handle` decides the outcome. */
function collect(
  w: Worker,
  queue: string,
  handle: (job: Job) => Promise<void> | void = () => {},
  options = {},
) {
  const jobs: Job[] = [];
  const done = w.run(
    queue,
    async (job) => {
      jobs.push(job);
      await handle(job);
    },
    options,
  );
  return { jobs, done };
}

/**
 * A 2-shard queue on a file store whose shards are led by two brokers, a and
 * b, with jobs on both shards (`payloads`).
 */
async function splitQueue(queue: string) {
  const store = `file:${tempDirForTest("casq-sdk-")}`;
  // Created, then released by a graceful stop: nobody leads either shard.
  const setup = await startServer({ store, brokerId: "setup" });
  await new Admin({ brokers: [setup.address] }).createQueue(queue, { shardCount: 2 });
  await setup.close({ graceful: true });
  const a = await startServer({ store, brokerId: "a" });
  const b = await startServer({ store, brokerId: "b" });
  // A producer that knows one broker makes it take over the shard of what it enqueues.
  const first = await new Producer({ brokers: [a.address] }).enqueue(queue, "p0", { key: "k0" });
  const viaB = new Producer({ brokers: [b.address] });
  const payloads = ["p0"];
  let otherShard = false;
  for (let i = 1; !otherShard || payloads.length < 6; i++) {
    if (i >= 50) throw new Error("no key of the other shard"); // some key lands there long before
    const result = await viaB.enqueue(queue, `p${i}`, { key: `k${i}` });
    payloads.push(`p${i}`);
    if (result.shard !== first.shard) otherShard = true;
  }
  const leaders = (await new Admin({ brokers: [a.address] }).getQueue(queue)).shards.map(
    (s) => s.leader?.brokerId,
  );
  expect(new Set(leaders)).toEqual(new Set(["a", "b"]));
  return { a, b, payloads };
}

describe("@casq/sdk", () => {
  it("produces and consumes: payload encodings, headers, key, ack", async () => {
    const s = await startServer();
    const producer = new Producer({ brokers: [s.address] });
    const a = await producer.enqueue(
      "emails",
      { to: "ann@example.com" },
      { headers: { x: "1" }, key: "ann" },
    );
    const b = await producer.enqueue("emails", "plain text");
    const c = await producer.enqueue("emails", new Uint8Array([1, 2, 3]));
    expect(a).toMatchObject({ shard: 0, offset: 0n, duplicate: false });
    expect(a.id).toHaveLength(26);
    expect(b.offset).toBe(1n);

    const w = worker([s.address]);
    const { jobs } = collect(w, "emails");
    await eventually(() => jobs.length === 3);
    expect(jobs.map((j) => j.id)).toEqual([a.id, b.id, c.id]);
    expect(jobs[0]?.json()).toEqual({ to: "ann@example.com" });
    expect(jobs[0]?.headers).toEqual({ x: "1", "content-type": "application/json" });
    expect(jobs[0]?.key).toBe("ann");
    expect(jobs[0]?.attempt).toBe(1);
    expect(jobs[1]?.text()).toBe("plain text");
    expect([...(jobs[2]?.payload ?? [])]).toEqual([1, 2, 3]);
    // All acked: nothing left in flight.
    const admin = new Admin({ brokers: [s.address] });
    await eventually(async () => {
      const q = await admin.getQueue("emails");
      return q.totals?.messages === 0n;
    });
  });

  it("enqueues a batch, claims by priority, honours delays and dedup ids", async () => {
    const s = await startServer();
    const producer = new Producer({ brokers: [s.address] });
    const results = await producer.enqueueBatch("prio", [
      { payload: "low", priority: -5 },
      { payload: "high", priority: 10 },
      { payload: "mid" },
      { payload: "later", delayMs: 600 },
    ]);
    expect(results.map((r) => r.offset)).toEqual([0n, 1n, 2n, 3n]);
    const first = await producer.enqueue("prio", "once", { dedupId: "d-1" });
    const again = await producer.enqueue("prio", "once", { dedupId: "d-1" });
    expect(again).toEqual({ ...first, duplicate: true });

    const w = worker([s.address]);
    const started = Date.now();
    const seen: { text: string; at: number }[] = [];
    const { jobs } = collect(w, "prio", (job) => {
      seen.push({ text: job.text(), at: Date.now() - started });
    });
    await eventually(() => jobs.length === 5);
    expect(seen.map((x) => x.text)).toEqual(["high", "mid", "once", "low", "later"]);
    expect(seen[4]?.at).toBeGreaterThanOrEqual(400);
  });

  it("merges concurrent enqueues without dedup ids into one request, stored on one shard of a multi-shard queue", async () => {
    const s = await startServer();
    await new Admin({ brokers: [s.address] }).createQueue("merged", { shardCount: 4 });
    const producer = new Producer({ brokers: [s.address], defaultDedupIds: false });
    for (let round = 0; round < 2; round++) {
      const results = await Promise.all(
        Array.from({ length: 8 }, (_, i) => producer.enqueue("merged", `m${i}`)),
      );
      // One request (the broker puts such a request's messages on one shard), so one shard, consecutive offsets.
      expect(new Set(results.map((r) => r.shard)).size).toBe(1);
      expect(results.map((r) => r.offset - (results[0]?.offset ?? 0n))).toEqual([
        0n,
        1n,
        2n,
        3n,
        4n,
        5n,
        6n,
        7n,
      ]);
    }
  });

  it("a throwing handler is nacked and the job comes back with attempt 2", async () => {
    const s = await startServer();
    const admin = new Admin({ brokers: [s.address] });
    await admin.createQueue("retry", {
      config: { backoff: { initialDelay: { seconds: 0n, nanos: 50_000_000 } } },
    });
    await new Producer({ brokers: [s.address] }).enqueue("retry", "flaky");
    const errors: unknown[] = [];
    const { jobs } = collect(
      worker([s.address]),
      "retry",
      (job) => {
        if (job.attempt === 1) throw new Error("boom");
      },
      { onError: (e: unknown) => errors.push(e) },
    );
    await eventually(() => jobs.length === 2);
    expect(jobs.map((j) => j.attempt)).toEqual([1, 2]);
    expect(jobs[1]?.id).toBe(jobs[0]?.id);
    expect((errors[0] as Error).message).toBe("boom");
  });

  it("DeadLetterError dead-letters at once; Admin lists and redrives it", async () => {
    const s = await startServer();
    const admin = new Admin({ brokers: [s.address] });
    const { id } = await new Producer({ brokers: [s.address] }).enqueue("poison", "bad");
    let fail = true;
    const { jobs } = collect(worker([s.address]), "poison", () => {
      if (fail) throw new DeadLetterError("cannot parse");
    });
    await eventually(async () => (await admin.listDeadLetters("poison")).length === 1);
    const [dead] = await admin.listDeadLetters("poison");
    expect(dead?.message?.id).toBe(id);
    expect(dead?.reason).toMatch(/cannot parse/);
    expect(jobs).toHaveLength(1);

    fail = false;
    const redriven = await admin.redrive("poison");
    expect(redriven.redriven).toBe(1n);
    await eventually(() => jobs.length === 2);
    expect(jobs[1]?.id).toBe(id);
    await eventually(async () => (await admin.listDeadLetters("poison")).length === 0);
    expect((await admin.listQueues()).map((q) => q.name)).toContain("poison");
  });

  it("Admin covers the queue lifecycle: create, update, subscriptions, document, purge, delete", async () => {
    const s = await startServer();
    const admin = new Admin({ brokers: [s.address] });
    const created = await admin.createQueue("lifecycle", { shardCount: 2, config: { maxAttempts: 4 } });
    expect(created.shardCount).toBe(2);
    const updated = await admin.updateQueue("lifecycle", { maxAttempts: 7 });
    expect(updated.config?.maxAttempts).toBe(7);
    expect((await admin.getQueue("lifecycle")).config?.maxAttempts).toBe(7);

    await new Producer({ brokers: [s.address] }).enqueue("lifecycle", "kept", { key: "k" });
    const audit = await admin.createSubscription("lifecycle", "audit", { start: "earliest" });
    expect(audit.backlog).toBe(1n);
    const subscriptions = (await admin.getQueue("lifecycle")).subscriptions.map((x) => x.subscription);
    expect(subscriptions.sort()).toEqual(["audit", "default"]);

    const shards = await Promise.all([0, 1].map((shard) => admin.getDocument("lifecycle", { shard })));
    const documents = shards.map(({ document }) => JSON.parse(new TextDecoder().decode(document)));
    expect(documents.map((d) => d.shard).sort()).toEqual([0, 1]);
    expect(shards.every(({ etag }) => etag !== "")).toBe(true);
    const stored = documents.flatMap((d) => d.messages as { key?: string }[]);
    expect(stored.map((m) => m.key)).toEqual(["k"]);

    await expect(admin.deleteQueue("lifecycle")).rejects.toMatchObject({ code: Code.FailedPrecondition });
    const purged = await admin.purge("lifecycle", { allSubscriptions: true });
    expect(purged.messagesPurged).toBe(1n);
    expect((await admin.deleteSubscription("lifecycle", "audit")).messagesDropped).toBe(0n);
    await admin.deleteQueue("lifecycle");
    await expect(admin.getQueue("lifecycle")).rejects.toBeInstanceOf(NotFoundError);
  });

  it("createQueue of an existing queue is AlreadyExistsError; ifNotExists returns the queue as it is", async () => {
    const s = await startServer();
    const admin = new Admin({ brokers: [s.address] });
    const created = await admin.createQueue("once", { shardCount: 2, config: { maxAttempts: 4 } });
    expect(created.created).toBe(true);
    const again = admin.createQueue("once", { shardCount: 3 });
    await expect(again).rejects.toBeInstanceOf(AlreadyExistsError);
    await expect(again).rejects.toMatchObject({ code: Code.AlreadyExists });
    const existing = await admin.createQueue("once", {
      shardCount: 3,
      config: { maxAttempts: 9 },
      ifNotExists: true,
    });
    expect(existing.created).toBe(false);
    expect(existing.shardCount).toBe(2);
    expect(existing.config?.maxAttempts).toBe(4);
    const fresh = await admin.createQueue("fresh", { shardCount: 3, ifNotExists: true });
    expect(fresh).toMatchObject({ created: true, shardCount: 3 });
  });

  it("graceful stop waits for a running handler, acks it, and takes no more jobs", async () => {
    const s = await startServer();
    const producer = new Producer({ brokers: [s.address] });
    await producer.enqueueBatch("slow", [{ payload: "1" }, { payload: "2" }]);
    const w = new Worker({ brokers: [s.address] });
    let finished = 0;
    const { jobs, done } = collect(w, "slow", async () => {
      await new Promise((resolve) => setTimeout(resolve, 400));
      finished++;
    });
    await eventually(() => jobs.length === 1);
    await w.stop({ timeoutMs: 5_000 });
    // stop() returned only after the running handler finished.
    expect(finished).toBe(1);
    await done;
    expect(jobs).toHaveLength(1);
    // The finished job was acked; the other one is still there for the next worker.
    const next = collect(worker([s.address]), "slow");
    await eventually(() => next.jobs.length === 1);
    expect(next.jobs[0]?.text()).toBe("2");
  });

  it("stop past its deadline aborts the handler (job.signal) and never acks it: the job is redelivered", async () => {
    const s = await startServer();
    await new Producer({ brokers: [s.address] }).enqueue("stuck", "x");
    const w = new Worker({ brokers: [s.address] });
    let aborted = false;
    const { jobs } = collect(
      w,
      "stuck",
      (job) =>
        new Promise<void>((resolve) => {
          job.signal.addEventListener("abort", () => {
            aborted = true;
            resolve(); // resolving after the abort must not ack
          });
        }),
      { leaseTtlMs: 500 },
    );
    await eventually(() => jobs.length === 1);
    await w.stop({ timeoutMs: 50 });
    expect(aborted).toBe(true);
    const again = collect(worker([s.address]), "stuck");
    await eventually(() => again.jobs.length === 1);
    expect(again.jobs[0]?.attempt).toBe(2);
  });

  it("follows a redirect: given only a follower's address, the worker and producer reach the leader", async () => {
    const dir = tempDirForTest("casq-sdk-");
    const leader = await startServer({ store: `file:${dir}`, brokerId: "leader" });
    await new Producer({ brokers: [leader.address] }).enqueue("led", "via leader");
    const follower = await startServer({ store: `file:${dir}`, brokerId: "follower" });

    // The raw error is a redirect to the leader...
    const admin = new Admin({ brokers: [follower.address] });
    expect((await admin.getQueue("led")).shards[0]?.leader?.address).toBe(leader.advertisedAddress);
    const producer = new Producer({ brokers: [follower.address] });
    const viaFollower = await producer.enqueue("led", "via follower");
    expect(viaFollower.offset).toBe(1n);

    const { jobs } = collect(worker([follower.address]), "led");
    await eventually(() => jobs.length === 2);
    expect(jobs.map((j) => j.text())).toEqual(["via leader", "via follower"]);
    await eventually(async () => (await admin.getQueue("led")).totals?.messages === 0n);
    // Nothing was taken over: the leader still leads, so the SDK really followed the redirect.
    expect((await admin.getQueue("led")).shards[0]?.leader?.brokerId).toBe("leader");
  });

  it("works every shard when a queue's shards are led by different brokers: one stream per leader", async () => {
    const { a, payloads } = await splitQueue("split");
    const admin = new Admin({ brokers: [a.address] });
    // The worker knows only broker a: it learns of b from the stream's routing.
    const w = worker([a.address]);
    let running = 0;
    let mostAtOnce = 0;
    const { jobs, done } = collect(
      w,
      "split",
      async () => {
        running++;
        mostAtOnce = Math.max(mostAtOnce, running);
        await new Promise((resolve) => setTimeout(resolve, 5));
        running--;
      },
      { concurrency: 1, prefetch: 2 },
    );
    await eventually(() => jobs.length >= payloads.length);
    expect(jobs.map((j) => j.text()).sort()).toEqual([...payloads].sort());
    expect(new Set(jobs.map((j) => j.shard)).size).toBe(2);
    // Concurrency bounds the handlers of all streams together.
    expect(mostAtOnce).toBe(1);
    // Every job acked once, on whichever stream delivered it.
    await eventually(async () => {
      const stats = (await admin.getQueue("split")).subscriptions[0];
      return stats?.depth === 0n && stats.counters?.acked === BigInt(payloads.length);
    });
    await w.stop({ timeoutMs: 1_000 });
    await done;
    const counters = (await admin.getQueue("split")).subscriptions[0]?.counters;
    expect(counters?.delivered).toBe(BigInt(payloads.length));
    expect(counters?.acked).toBe(BigInt(payloads.length));
  });

  it("when the leader of a secondary stream stops, its shard's jobs come through the broker that takes it over", async () => {
    const { a, b, payloads } = await splitQueue("moved");
    const admin = new Admin({ brokers: [a.address] });
    const errors: unknown[] = [];
    const { jobs, done } = collect(
      worker([a.address], { backoffInitialMs: 20, backoffMaxMs: 200 }),
      "moved",
      () => {},
      {
        onError: (error: unknown) => errors.push(error),
      },
    );
    await eventually(() => jobs.length >= payloads.length);
    // b shuts down (draining its stream, releasing its shard); a takes the shard over.
    await b.close({ graceful: true });
    const producer = new Producer({ brokers: [a.address] });
    const more: string[] = [];
    for (let i = 0; i < 6; i++) {
      await producer.enqueue("moved", `later${i}`, { key: `k${i}` });
      more.push(`later${i}`);
    }
    await eventually(() => jobs.length >= payloads.length + more.length);
    expect(jobs.map((j) => j.text()).sort()).toEqual([...payloads, ...more].sort());
    await eventually(async () => {
      const stats = (await admin.getQueue("moved")).subscriptions[0];
      return stats?.depth === 0n && stats.counters?.acked === BigInt(payloads.length + more.length);
    });
    await workers[workers.length - 1]?.stop({ timeoutMs: 1_000 });
    await done;
  });

  it("fails over past a dead broker in the list", async () => {
    const dead = await deadAddress();
    const s = await startServer();
    const brokers = [dead, s.address];
    const producer = new Producer({ brokers, backoffInitialMs: 10 });
    const { id } = await producer.enqueue("failover", "hi");
    const { jobs } = collect(worker(brokers, { backoffInitialMs: 10 }), "failover");
    await eventually(() => jobs.length === 1);
    expect(jobs[0]?.id).toBe(id);
  });

  it("gives up with typed errors", async () => {
    const s = await startServer();
    const admin = new Admin({ brokers: [s.address] });
    await expect(admin.getQueue("missing")).rejects.toBeInstanceOf(NotFoundError);
    const w = new Worker({ brokers: [s.address] });
    await expect(w.run("missing", () => {})).rejects.toBeInstanceOf(NotFoundError);
    const dead = new Producer({ brokers: [await deadAddress()], maxAttempts: 2, backoffInitialMs: 5 });
    const error = await dead.enqueue("q", "x").catch((e: unknown) => toCasqError(e));
    expect(error).toMatchObject({ name: "UnavailableError" });
    expect(new RedirectError("m", { leaderAddress: "a:1" } as never).leaderAddress).toBe("a:1");
  });

  it("heartbeats keep a job longer than its lease; a purge aborts job.signal (leases lost)", async () => {
    const s = await startServer();
    const admin = new Admin({ brokers: [s.address] });
    await new Producer({ brokers: [s.address] }).enqueueBatch("long", [{ payload: "a" }, { payload: "b" }]);
    let lostReason: unknown;
    const { jobs } = collect(
      worker([s.address]),
      "long",
      async (job) => {
        if (job.text() === "a") {
          await new Promise((resolve) => setTimeout(resolve, 1_000)); // > 3 lease TTLs
          return;
        }
        await new Promise<void>((resolve) => {
          job.signal.addEventListener("abort", () => {
            lostReason = job.signal.reason;
            resolve();
          });
        });
      },
      { leaseTtlMs: 300 },
    );
    await eventually(() => jobs.length === 2);
    expect(jobs.map((j) => [j.text(), j.attempt])).toEqual([
      ["a", 1],
      ["b", 1],
    ]);
    await admin.purge("long");
    await eventually(() => lostReason !== undefined);
    expect(String(lostReason)).toMatch(/lease lost/);
  });

  it("propagates the active span's trace context from producer to job", async () => {
    const manager = new AsyncLocalStorageContextManager().enable();
    context.setGlobalContextManager(manager);
    try {
      const s = await startServer();
      const producer = new Producer({ brokers: [s.address] });
      const spanContext = {
        traceId: "4bf92f3577b34da6a3ce929d0e0e4736",
        spanId: "00f067aa0ba902b7",
        traceFlags: TraceFlags.SAMPLED,
      };
      await context.with(trace.setSpanContext(context.active(), spanContext), () =>
        producer.enqueue("traced", "t"),
      );
      const { jobs } = collect(worker([s.address]), "traced");
      await eventually(() => jobs.length === 1);
      expect(jobs[0]?.traceContext?.traceparent).toBe(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      );
    } finally {
      context.disable();
    }
  });
});
