/**
 * Backlog benchmark: how one shard behaves with a standing backlog of 1k,
 * 10k, 100k (and 1M) jobs of 1 KiB, on the file store and on the file store
 * with 100 ms of PUT latency (the fault-injecting wrapper).
 *
 * Per case, through the broker in this process (the same engine `casq serve`
 * runs; gRPC and the SDK are issue 12's benchmark): enqueue jobs/s from 64
 * concurrent callers, claim+ack jobs/s from 50 concurrent workers (claim 1,
 * ack it), the head's size, bytes written per commit, commit ms p50/p99,
 * PUTs and GETs per 1,000 jobs, and the process RSS.
 *
 *   npm run bench:backlog                        # a table
 *   npm run bench:backlog -- --json              # one JSON object
 *   npm run bench:backlog -- --sizes 1000,100000 # chosen backlogs
 *   npm run bench:backlog -- --seconds 5 --latency 0,100
 *   npm run bench:backlog -- --dead-letters 100000 # the head-size case only (0: skip it)
 *
 * The head-size case (`--dead-letters`, default 100,000; file store, no
 * latency) enqueues that many 1 KiB jobs with a dedup id on every one (all
 * within the dedup window), then dead-letters every one of them (claim 1000,
 * nack as dead letter), and reports the head's size after the enqueues and
 * after the dead-lettering, the largest head written on the way, and the
 * objects under `seg/`.
 *
 * Numbers are only comparable within one run on one machine.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Broker, NO_MANIFESTS } from "../server/src/broker/broker.ts";
import type { CommitInfo } from "../server/src/broker/shard-observer.ts";
import { FileStore } from "../server/src/store/file-store.ts";
import { systemClock } from "../server/src/util/clock.ts";
import { seededRandom } from "../server/src/util/random.ts";
import { FaultInjectingStore } from "../server/testing/fault-injecting-store.ts";

const { values } = parseArgs({
  options: {
    json: { type: "boolean", default: false },
    sizes: { type: "string", default: "1000,10000,100000,1000000" },
    latency: { type: "string", default: "0,100" },
    seconds: { type: "string", default: "5" },
    "dead-letters": { type: "string", default: "100000" },
  },
});
const deadLetters = Number(values["dead-letters"]);
const sizes = values.sizes.split(",").map(Number);
const latencies = values.latency.split(",").map(Number);
const seconds = Number(values.seconds);
const payload = new Uint8Array(1024).fill(97);

interface Phase {
  jobs_per_s: number;
  commit_ms_p50: number;
  commit_ms_p99: number;
  bytes_per_commit: number;
  puts_per_1000_jobs: number;
  gets_per_1000_jobs: number;
}

interface Case {
  backlog: number;
  put_latency_ms: number;
  enqueue: Phase;
  process: Phase;
  head_bytes: number;
  rss_mib: number;
}

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))] as number;
}

const round = (n: number) => Math.round(n * 10) / 10;

async function runCase(backlog: number, latencyMs: number): Promise<Case> {
  const dir = mkdtempSync(join(tmpdir(), "casq-bench-backlog-"));
  const store = new FaultInjectingStore(new FileStore({ root: dir }), { random: seededRandom(1) });
  const commits: CommitInfo[] = [];
  const broker = new Broker({
    store,
    identity: { id: "bench", address: "127.0.0.1:0" },
    clock: systemClock,
    random: seededRandom(2),
    initialConfig: { leaseTtlMs: 600_000, maxDocumentBytes: 4 * 1024 ** 3 },
    observer: { onCommit: (info) => commits.push(info) },
    documentExpected: NO_MANIFESTS,
  });
  const queue = "bench";
  // The standing backlog, loaded without latency in batches of 1000.
  for (let i = 0; i < backlog; i += 1000) {
    await broker.enqueue(
      queue,
      Array.from({ length: Math.min(1000, backlog - i) }, () => ({ payload })),
    );
  }
  store.setLatency({ put: latencyMs > 0 ? { kind: "fixed", ms: latencyMs } : { kind: "none" } });

  const measure = async (run: (until: number) => Promise<number>): Promise<Phase> => {
    commits.length = 0;
    const before = store.stats().calls;
    const started = performance.now();
    const jobs = await run(started + seconds * 1000);
    const elapsed = (performance.now() - started) / 1000;
    const after = store.stats().calls;
    const written = commits.filter((c) => c.outcome === "ok");
    const ms = written.map((c) => c.durationMs).sort((a, b) => a - b);
    const bytes = written.reduce((t, c) => t + c.documentBytes, 0);
    return {
      jobs_per_s: round(jobs / elapsed),
      commit_ms_p50: percentile(ms, 50),
      commit_ms_p99: percentile(ms, 99),
      bytes_per_commit: Math.round(written.length === 0 ? 0 : bytes / written.length),
      puts_per_1000_jobs: round(((after.put - before.put) * 1000) / Math.max(1, jobs)),
      gets_per_1000_jobs: round(((after.get - before.get) * 1000) / Math.max(1, jobs)),
    };
  };

  const enqueue = await measure(async (until) => {
    let done = 0;
    await Promise.all(
      Array.from({ length: 64 }, async () => {
        while (performance.now() < until) {
          await broker.enqueue(queue, [{ payload }]);
          done += 1;
        }
      }),
    );
    return done;
  });
  const processing = await measure(async (until) => {
    let done = 0;
    await Promise.all(
      Array.from({ length: 50 }, async (_, w) => {
        while (performance.now() < until) {
          const got = await broker.claim(queue, { subscription: "default", workerId: `w${w}`, max: 1 });
          const job = got[0];
          if (job === undefined) return;
          await broker.ack(queue, "default", [{ shard: job.shard, ...job.message.receipt }]);
          done += 1;
        }
      }),
    );
    return done;
  });
  const head = await store.get(`queues/${queue}/0.json`);
  const rss = process.memoryUsage().rss;
  await broker.stop({ release: false });
  await store.close();
  rmSync(dir, { recursive: true, force: true });
  return {
    backlog,
    put_latency_ms: latencyMs,
    enqueue,
    process: processing,
    head_bytes: head?.body.byteLength ?? 0,
    rss_mib: Math.round(rss / 1024 / 1024),
  };
}

/** The head-size case (module header). */
interface HeadCase {
  jobs: number;
  /** Head after enqueueing every job with a dedup id (all ids within the window, jobs queued). */
  head_bytes_dedup: number;
  /** Head after dead-lettering every job (their dead letters, and still every dedup id). */
  head_bytes_dead_letters: number;
  /** Largest head written during the case. */
  head_bytes_max: number;
  /** Objects under the shard's `seg/` at the end, by kind. */
  dead_letter_segments: number;
  dedup_segments: number;
  message_segments: number;
  rss_mib: number;
}

async function runHeadCase(jobs: number): Promise<HeadCase> {
  const dir = mkdtempSync(join(tmpdir(), "casq-bench-heads-"));
  const store = new FileStore({ root: dir });
  let largest = 0;
  const broker = new Broker({
    store,
    identity: { id: "bench", address: "127.0.0.1:0" },
    clock: systemClock,
    random: seededRandom(3),
    // The default dead_letter_limit (10,000 per subscription) would evict most of them.
    initialConfig: { leaseTtlMs: 600_000, maxDocumentBytes: 4 * 1024 ** 3, deadLetterLimit: 1_000_000 },
    observer: { onCommit: (info) => (largest = Math.max(largest, info.documentBytes)) },
    documentExpected: NO_MANIFESTS,
  });
  const queue = "heads";
  const headKey = `queues/${queue}/0.json`;
  const headBytes = async () => (await store.get(headKey))?.body.byteLength ?? 0;
  for (let i = 0; i < jobs; i += 1000) {
    const n = Math.min(1000, jobs - i);
    await broker.enqueue(
      queue,
      Array.from({ length: n }, (_, k) => ({ payload, dedupId: `job-${i + k}-9b1c2f7e-4d3a-4e8b-a1f0` })),
    );
  }
  const afterDedup = await headBytes();
  for (;;) {
    const got = await broker.claim(queue, { subscription: "default", workerId: "w", max: 1000 });
    if (got.length === 0) break;
    await broker.nack(
      queue,
      "default",
      got.map((job) => ({ shard: job.shard, ...job.message.receipt })),
      { deadLetter: true, reason: "benchmark: dead-lettered on purpose" },
    );
  }
  const afterDead = await headBytes();
  const names = (await store.list(`queues/${queue}/0/seg/`)).map((e) => e.key);
  const rss = process.memoryUsage().rss;
  await broker.stop({ release: false });
  await store.close();
  rmSync(dir, { recursive: true, force: true });
  return {
    jobs,
    head_bytes_dedup: afterDedup,
    head_bytes_dead_letters: afterDead,
    head_bytes_max: largest,
    dead_letter_segments: names.filter((n) => n.endsWith(".dead.json")).length,
    dedup_segments: names.filter((n) => n.endsWith(".dedup.json")).length,
    message_segments: names.filter((n) => !n.endsWith(".dead.json") && !n.endsWith(".dedup.json")).length,
    rss_mib: Math.round(rss / 1024 / 1024),
  };
}

const cases: Case[] = [];
for (const latency of latencies) {
  for (const size of sizes) {
    if (size <= 0) continue;
    cases.push(await runCase(size, latency));
    if (!values.json) process.stderr.write(`done: backlog ${size}, latency ${latency} ms\n`);
  }
}
const heads = deadLetters > 0 ? await runHeadCase(deadLetters) : undefined;
if (heads !== undefined && !values.json)
  process.stderr.write(`done: head case, ${deadLetters} dead letters\n`);
if (values.json) {
  console.log(
    JSON.stringify(
      { seconds_per_phase: seconds, payload_bytes: payload.byteLength, cases, ...(heads ? { heads } : {}) },
      null,
      2,
    ),
  );
} else if (cases.length > 0) {
  const header =
    "backlog  put_ms | enq/s  p50/p99 ms  B/commit  PUT/1k GET/1k | proc/s  p50/p99 ms  B/commit  PUT/1k GET/1k | head bytes  RSS MiB";
  console.log(header);
  for (const c of cases) {
    const p = (x: Phase) =>
      `${String(x.jobs_per_s).padStart(6)} ${`${x.commit_ms_p50}/${x.commit_ms_p99}`.padStart(11)} ${String(x.bytes_per_commit).padStart(9)} ${String(x.puts_per_1000_jobs).padStart(7)} ${String(x.gets_per_1000_jobs).padStart(6)}`;
    console.log(
      `${String(c.backlog).padStart(7)} ${String(c.put_latency_ms).padStart(7)} |${p(c.enqueue)} |${p(c.process)} | ${String(c.head_bytes).padStart(10)} ${String(c.rss_mib).padStart(8)}`,
    );
  }
}
if (!values.json && heads !== undefined) {
  console.log("");
  console.log(
    "head case: jobs (dedup id on each, then all dead-lettered) | head bytes: after enqueue  after dead-lettering  largest | seg objects: dead-letter dedup message | RSS MiB",
  );
  console.log(
    `${String(heads.jobs).padStart(9)} | ${String(heads.head_bytes_dedup).padStart(10)} ${String(heads.head_bytes_dead_letters).padStart(10)} ${String(heads.head_bytes_max).padStart(10)} | ${String(heads.dead_letter_segments).padStart(5)} ${String(heads.dedup_segments).padStart(5)} ${String(heads.message_segments).padStart(5)} | ${String(heads.rss_mib).padStart(6)}`,
  );
}
