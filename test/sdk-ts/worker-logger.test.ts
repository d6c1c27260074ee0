/**
 * The TypeScript worker logs every handler failure by default, through a
 * logger the user can replace (`logger`) or silence (`logger: null`), so that
 * jobs do not retry and dead-letter unseen.
 */
import { Admin, DeadLetterError, type Job, Producer, Worker, type WorkerLogger } from "@casq/sdk";
import { afterEach, describe, expect, it, vi } from "vitest";
import { closeServers, eventually, startServer } from "./support.ts";

const workers: Worker[] = [];
afterEach(async () => {
  vi.restoreAllMocks();
  await Promise.all(workers.splice(0).map((w) => w.stop({ timeoutMs: 100 })));
  await closeServers();
});

interface Line {
  readonly level: "warn" | "error";
  readonly message: string;
  readonly details: Record<string, unknown> | undefined;
}

/** Enqueues a job that fails and will be retried, one that dead-letters itself, and one on its last attempt. */
async function failingJobs(queue: string) {
  const server = await startServer();
  await new Admin({ brokers: [server.address] }).createQueue(queue);
  const producer = new Producer({ brokers: [server.address] });
  const retried = await producer.enqueue(queue, "retry");
  const poison = await producer.enqueue(queue, "poison");
  const last = await producer.enqueue(queue, "last", { maxAttempts: 1 });
  const handler = (job: Job) => {
    if (job.text() === "poison") throw new DeadLetterError("bad input");
    throw new Error(`boom ${job.text()}`);
  };
  return { brokers: [server.address], retried, poison, last, handler };
}

function run(queue: string, w: Worker, handler: (job: Job) => void, onError?: () => void) {
  workers.push(w);
  void w.run(queue, handler, onError ? { onError } : {});
}

describe("worker logging", () => {
  it("logs each handler failure with the job, its attempt and what happens next", async () => {
    const { brokers, retried, poison, last, handler } = await failingJobs("logged");
    const lines: Line[] = [];
    const logger: WorkerLogger = {
      warn: (message, details) => lines.push({ level: "warn", message, details }),
      error: (message, details) => lines.push({ level: "error", message, details }),
    };
    run("logged", new Worker({ brokers, logger }), handler);
    await eventually(() => lines.length >= 3);
    const about = (id: string) => lines.find((l) => l.message.includes(id));
    expect(about(retried.id)).toMatchObject({ level: "warn", details: { jobId: retried.id, attempt: 1 } });
    expect(about(retried.id)?.message).toMatch(/attempt 1 of 5.*will be retried: boom retry/);
    expect(about(poison.id)).toMatchObject({ level: "error" });
    expect(about(poison.id)?.message).toContain("dead-lettered: bad input");
    expect(about(last.id)).toMatchObject({ level: "error" });
    expect(about(last.id)?.message).toMatch(/attempt 1 of 1.*dead-lettered: boom last/);
  });

  it("logs to the console by default, and not at all with logger: null", async () => {
    const { brokers, retried, handler } = await failingJobs("console");
    const warn = vi.spyOn(console, "warn").mockImplementation(() => {});
    const error = vi.spyOn(console, "error").mockImplementation(() => {});
    let failures = 0;
    run("console", new Worker({ brokers, logger: null }), handler, () => failures++);
    await eventually(() => failures >= 3);
    expect(warn).not.toHaveBeenCalled();
    expect(error).not.toHaveBeenCalled();
    await Promise.all(workers.splice(0).map((w) => w.stop({ timeoutMs: 100 })));

    // The retried job comes back after its backoff; the default logger reports it on the console.
    run("console", new Worker({ brokers }), handler);
    await eventually(() => warn.mock.calls.some(([m]) => String(m).includes(retried.id)), 20_000);
  });
});
