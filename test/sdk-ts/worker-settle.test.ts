/**
 * The TypeScript worker reports every ack or nack that did not do what it
 * asked, and never waits forever for a broker's answer on a Work stream. Real
 * `casq serve` processes:
 *
 * - a handler that blocks its process past its lease (so no heartbeat goes
 *   out) finishes after the job was delivered again: its ack is LEASE_LOST,
 *   and onError gets a LeaseLostError naming the job;
 * - the leader frozen (SIGSTOP) while a handler runs: the ack sent on the
 *   stream goes unanswered, the stream is given up after `timeoutMs`, and the
 *   ack lands by unary call at the broker that took the shard over.
 */
import { Admin, type Job, LeaseLostError, Producer, Worker } from "@casq/sdk";
import { afterEach, describe, expect, it } from "vitest";
import { type CasqServerProcess, startServer, tempDir } from "../e2e/support/processes.ts";
import { eventually } from "./support.ts";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** `count` brokers on one fresh file store with a 2 s leader lease; SIGCONT + SIGKILL afterwards. */
async function brokers(count: number): Promise<CasqServerProcess[]> {
  const store = tempDir("worker-settle");
  const started = await Promise.all(
    Array.from({ length: count }, () =>
      startServer({ store: `file:${store.path}`, args: ["--leader-lease", "2s"] }),
    ),
  );
  cleanups.push(async () => {
    for (const broker of started) {
      broker.child.kill("SIGCONT");
      await broker.stop("SIGKILL");
    }
    store.remove();
  });
  return started;
}

function worker(options: ConstructorParameters<typeof Worker>[0]): Worker {
  const w = new Worker({ workerId: "settle-test", ...options });
  cleanups.push(() => w.stop({ timeoutMs: 100 }));
  return w;
}

/** Keeps the thread busy: no timer, no heartbeat, no socket read runs meanwhile. */
function blockFor(ms: number): void {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    // spin
  }
}

describe("worker settle outcomes", () => {
  it("an ack after the lease ran out and the job was delivered again calls onError with LeaseLostError", async () => {
    const [broker] = (await brokers(1)) as [CasqServerProcess];
    await new Admin({ brokers: [broker.address] }).createQueue("late");
    const { id } = await new Producer({ brokers: [broker.address] }).enqueue("late", "slow");
    const errors: { error: unknown; job: Job | undefined }[] = [];
    const attempts: number[] = [];
    void worker({ brokers: [broker.address] }).run(
      "late",
      (job) => {
        attempts.push(job.attempt);
        // Far past the 1 s lease (heartbeats cannot run while this blocks): the broker hands
        // the job out again (to our second credit) even when it is slow on a loaded machine.
        if (job.attempt === 1) blockFor(10_000);
      },
      { concurrency: 2, leaseTtlMs: 1_000, onError: (error, job) => errors.push({ error, job }) },
    );
    await eventually(() => errors.some((e) => e.error instanceof LeaseLostError), 30_000);
    const lost = errors.find((e) => e.error instanceof LeaseLostError);
    const error = lost?.error as LeaseLostError;
    expect(error.jobId).toBe(id);
    expect(error.attempt).toBe(1);
    expect(error.operation).toBe("ack");
    expect(error.message).toContain(id);
    expect(lost?.job?.id).toBe(id);
    // The later delivery did the work and was acked.
    await eventually(() => attempts.includes(2), 20_000);
  });

  it("an ack the frozen leader never answers is given up on the stream and lands at the broker that took over", async () => {
    const [b0, b1] = (await brokers(2)) as [CasqServerProcess, CasqServerProcess];
    await new Admin({ brokers: [b0.address] }).createQueue("frozen-ack");
    await new Producer({ brokers: [b0.address] }).enqueue("frozen-ack", "work");
    let release: () => void = () => {};
    const running = new Promise<void>((started) => {
      const done = new Promise<void>((resolve) => {
        release = resolve;
      });
      void worker({ brokers: [b0.address, b1.address], timeoutMs: 2_000, retryTimeoutMs: 20_000 }).run(
        "frozen-ack",
        async () => {
          started();
          await done;
        },
      );
    });
    await running;
    b0.child.kill("SIGSTOP");
    release();
    // Acked: the message is gone from the shard, as b1 (its leader now) sees it.
    const admin = new Admin({ brokers: [b1.address], timeoutMs: 2_000 });
    await eventually(async () => {
      const queue = await admin.getQueue("frozen-ack").catch(() => undefined);
      const shard = queue?.shards[0];
      return shard?.servedHere === true && shard.messages === 0n;
    }, 30_000);
  });
});
