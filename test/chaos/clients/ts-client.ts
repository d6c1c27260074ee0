/**
 * The TypeScript chaos client (run with tsx): a producer or a worker on the
 * `@casq/sdk`, configured with every broker address, writing what it was told
 * to its history (format in `../history.ts`).
 *
 * - Producer: enqueues one message after another at `--rate` per second, each
 *   with a unique dedup id `<id>.<seq>` and a JSON payload naming it; a failed
 *   enqueue is retried with the same dedup id until it succeeds (or the
 *   producer is told to stop and has tried for 60 s).
 * - Worker: holds each job for a random short time (sometimes longer than
 *   its lease TTL, so the SDK's heartbeats matter), stops early and throws
 *   when the SDK says the lease is lost.
 *
 * SIGTERM stops either gracefully and writes a `stop` record.
 */
import { openSync, writeSync } from "node:fs";
import { parseArgs } from "node:util";
import { Producer, Worker } from "@casq/sdk";
import { seededRandom } from "../../../server/src/util/random.ts";

const { values } = parseArgs({
  options: {
    role: { type: "string" },
    id: { type: "string" },
    brokers: { type: "string" },
    queue: { type: "string" },
    history: { type: "string" },
    seed: { type: "string", default: "1" },
    rate: { type: "string", default: "10" },
    concurrency: { type: "string", default: "2" },
    "lease-ttl-ms": { type: "string", default: "3000" },
    "hold-max-ms": { type: "string", default: "4000" },
  },
});

const LOST = "chaos: lease lost";
const NACK = "chaos: nack";
/** Handlers that fail on purpose, so nacks and their backoff are exercised too. */
const NACK_SHARE = 0.03;

const proc = values.id ?? "ts-client";
const brokers = (values.brokers ?? "").split(",").filter((b) => b !== "");
const queue = values.queue ?? "chaos";
const random = seededRandom(Number(values.seed));
const historyFd = openSync(values.history ?? `${proc}.jsonl`, "a");

/** Appends one record (one write call, so a kill cannot interleave two). */
function record(fields: Record<string, unknown>): void {
  writeSync(historyFd, `${JSON.stringify({ t: Date.now(), proc, ...fields })}\n`);
}

function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

const sdkOptions = { brokers, timeoutMs: 2_000, retryTimeoutMs: 15_000, backoffMaxMs: 1_000 };
let stopping = false;
const stopped = new Promise<void>((resolve) => {
  process.once("SIGTERM", () => {
    stopping = true;
    resolve();
  });
});

async function produce(): Promise<void> {
  const producer = new Producer(sdkOptions);
  const intervalMs = 1000 / Number(values.rate);
  for (let seq = 1; !stopping; seq++) {
    const dedup = `${proc}.${seq}`;
    const startedAt = Date.now();
    for (;;) {
      try {
        const result = await producer.enqueue(queue, { dedup, producer: proc }, { dedupId: dedup });
        record({ kind: "enqueue-ok", dedup, id: result.id, duplicate: result.duplicate });
        break;
      } catch (error) {
        record({ kind: "enqueue-fail", dedup, error: message(error) });
        if (stopping && Date.now() - startedAt > 60_000) break;
        await sleep(200);
      }
    }
    await sleep(Math.max(0, intervalMs - (Date.now() - startedAt)));
  }
}

/** How long a handler holds a job: mostly short, sometimes past the lease TTL. */
function holdMs(): number {
  const x = random.next();
  const max = Number(values["hold-max-ms"]);
  if (x < 0.7) return 5 + random.next() * 300;
  if (x < 0.95) return 300 + random.next() * 1200;
  return 1500 + random.next() * Math.max(0, max - 1500);
}

async function work(): Promise<void> {
  const worker = new Worker({ ...sdkOptions, workerId: proc });
  const concurrency = Number(values.concurrency);
  const done = worker.run(
    queue,
    async (job) => {
      const payload = job.json<{ dedup?: string }>();
      record({
        kind: "deliver",
        id: job.id,
        dedup: payload.dedup ?? "",
        jobDedup: job.dedupId,
        receipt: job.receipt,
        attempt: job.attempt,
        leaseDeadline: job.leaseDeadline?.getTime() ?? null,
        leaseTtlMs: Number(values["lease-ttl-ms"]),
      });
      const nack = random.next() < NACK_SHARE;
      const lost = await new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => resolve(false), holdMs());
        job.signal.addEventListener("abort", () => {
          clearTimeout(timer);
          resolve(true);
        });
        if (job.signal.aborted) resolve(true);
      });
      if (lost) {
        // Not recorded as a nack: once the broker says the lease is lost, its nack changes nothing.
        record({ kind: "lease-lost", id: job.id, receipt: job.receipt });
        throw new Error(LOST);
      }
      if (nack) {
        record({ kind: "nack-sent", id: job.id, receipt: job.receipt });
        throw new Error(NACK);
      }
      record({ kind: "ack-sent", id: job.id, receipt: job.receipt });
    },
    {
      concurrency,
      prefetch: concurrency,
      leaseTtlMs: Number(values["lease-ttl-ms"]),
      onError: (error, job) => {
        if (job && (message(error) === LOST || message(error) === NACK)) return; // our own throws, recorded above
        record({
          kind: "error",
          error: message(error),
          ...(job ? { id: job.id, receipt: job.receipt } : {}),
        });
      },
    },
  );
  await Promise.race([done, stopped]);
  await worker.stop({ timeoutMs: 10_000 });
  await done;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

record({ kind: "start", role: values.role, lang: "ts" });
try {
  if (values.role === "producer") await produce();
  else if (values.role === "worker") await work();
  else throw new Error(`--role must be producer or worker, not ${values.role}`);
  record({ kind: "stop" });
  process.exit(0);
} catch (error) {
  record({ kind: "error", error: `fatal: ${message(error)}` });
  console.error(error);
  process.exit(1);
}
