/**
 * The four workload shapes of the end-to-end benchmark, run the same way
 * against every {@link QueueSystem}:
 *
 * - `enqueue`: single-job enqueues from 64 concurrent callers;
 * - `enqueue_batch`: batches of 100 from 4 callers;
 * - `process`: a preloaded backlog processed by workers at concurrency 50;
 * - `latency`: enqueue → handler start at a fixed offered rate (200 jobs/s).
 *
 * Each measurement also records the CPU time of this (client) process and of
 * the system's server processes, and, for casq, the object-store writes.
 */
import { performance } from "node:perf_hooks";
import { cpuSecondsOf } from "./process-cpu.ts";
import type { BenchQueue, QueueSystem } from "./queue-system.ts";

/** The shapes, in the order they run and print. */
export const SHAPES = ["enqueue", "enqueue_batch", "process", "latency"] as const;
/** One shape's name. */
export type ShapeName = (typeof SHAPES)[number];

/** Sizes of one benchmark run. */
export interface ShapeSizes {
  /** Jobs per throughput measurement. */
  readonly jobs: number;
  /** Concurrent single-job callers. */
  readonly callers: number;
  /** Jobs per batch and batch callers. */
  readonly batch: number;
  readonly batchCallers: number;
  /** Worker concurrency of `process` and `latency`. */
  readonly concurrency: number;
  /** Offered rate and duration of `latency`. */
  readonly latencyRate: number;
  readonly latencySeconds: number;
  /** Payload size in bytes. */
  readonly payloadBytes: number;
}

/** One measured run of one shape. */
export interface Measurement {
  readonly jobs: number;
  readonly seconds: number;
  /** Jobs per second (throughput shapes). */
  readonly jobsPerSecond: number;
  /** Latency percentiles in ms (`latency` only). */
  readonly p50Ms?: number;
  readonly p99Ms?: number;
  readonly clientCpuSeconds: number;
  readonly serverCpuSeconds: number;
  /** Object-store writes per job (casq only). */
  readonly writesPerJob?: number;
}

function payloadOf(size: number, seq: number): Buffer {
  const payload = Buffer.alloc(size, 97);
  payload.writeUInt32BE(seq, 0);
  return payload;
}

async function fill(queue: BenchQueue, sizes: ShapeSizes, jobs: number): Promise<void> {
  let next = 0;
  const caller = async () => {
    while (next < jobs) {
      const n = Math.min(sizes.batch, jobs - next);
      const first = next;
      next += n;
      await queue.enqueueBatch(Array.from({ length: n }, (_, i) => payloadOf(sizes.payloadBytes, first + i)));
    }
  };
  await Promise.all(Array.from({ length: sizes.batchCallers }, caller));
}

/** Resolves when `count()` reaches `target`, polling; rejects after `timeoutMs`. */
async function until(count: () => number, target: number, timeoutMs: number, what: string): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (count() < target) {
    if (performance.now() > deadline)
      throw new Error(`${what}: only ${count()} of ${target} within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] as number;
}

/** Runs one shape once on a fresh queue of `system`. */
export async function measure(
  system: QueueSystem,
  shape: ShapeName,
  sizes: ShapeSizes,
): Promise<Measurement> {
  const queue = await system.newQueue();
  try {
    if (shape === "process") await fill(queue, sizes, sizes.jobs);
    const pids = system.serverPids();
    const serverBefore = cpuSecondsOf(pids);
    const clientBefore = process.cpuUsage();
    const writesBefore = system.storeWrites ? await system.storeWrites() : undefined;
    const started = performance.now();
    let jobs = sizes.jobs;
    let latencies: number[] | undefined;

    if (shape === "enqueue") {
      let next = 0;
      const caller = async () => {
        while (next < sizes.jobs) {
          next += 1;
          await queue.enqueue(payloadOf(sizes.payloadBytes, next));
        }
      };
      await Promise.all(Array.from({ length: sizes.callers }, caller));
    } else if (shape === "enqueue_batch") {
      await fill(queue, sizes, sizes.jobs);
    } else if (shape === "process") {
      let handled = 0;
      const workers = await queue.work(sizes.concurrency, () => {
        handled += 1;
      });
      await until(() => handled, sizes.jobs, 600_000, "process");
      await workers.stop();
    } else {
      const sentAt: number[] = [];
      const seen: number[] = [];
      const workers = await queue.work(sizes.concurrency, (payload) => {
        const seq = payload.readUInt32BE(0);
        const t0 = sentAt[seq];
        if (t0 !== undefined) seen.push(performance.now() - t0);
      });
      jobs = Math.round(sizes.latencyRate * sizes.latencySeconds);
      const interval = 1000 / sizes.latencyRate;
      const sends: Promise<void>[] = [];
      const origin = performance.now();
      for (let seq = 0; seq < jobs; seq += 1) {
        const due = origin + seq * interval;
        const wait = due - performance.now();
        if (wait > 1) await new Promise((r) => setTimeout(r, wait));
        sentAt[seq] = performance.now();
        sends.push(queue.enqueue(payloadOf(sizes.payloadBytes, seq)));
      }
      await Promise.all(sends);
      await until(() => seen.length, jobs, 120_000, "latency");
      await workers.stop();
      latencies = seen.sort((a, b) => a - b);
    }

    const seconds = (performance.now() - started) / 1000;
    const client = process.cpuUsage(clientBefore);
    const writesAfter = system.storeWrites ? await system.storeWrites() : undefined;
    return {
      jobs,
      seconds,
      jobsPerSecond: jobs / seconds,
      ...(latencies ? { p50Ms: percentile(latencies, 50), p99Ms: percentile(latencies, 99) } : {}),
      clientCpuSeconds: (client.user + client.system) / 1e6,
      serverCpuSeconds: cpuSecondsOf(pids) - serverBefore,
      ...(writesBefore !== undefined && writesAfter !== undefined
        ? { writesPerJob: (writesAfter - writesBefore) / jobs }
        : {}),
    };
  } finally {
    await queue.close();
  }
}
