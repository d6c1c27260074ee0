/**
 * Backlog benchmark: how one shard behaves with a standing backlog of 1k,
 * 10k, 100k (and 1M) jobs of 1 KiB, on the file store and on the file store
 * with 100 ms of PUT latency (the fault-injecting wrapper).
 *
 *   npm run bench:backlog                        # a table
 *   npm run -s bench:backlog -- --json           # one JSON object (progress on stderr; -s: no npm header)
 *   npm run bench:backlog -- --sizes 1000,100000 # chosen backlogs
 *   npm run bench:backlog -- --seconds 10 --latency 0,100
 *   npm run bench:backlog -- --dead-letters 100000 # the head-size case (0: skip it)
 *
 * Each case (one backlog size, one PUT latency) gets a `casq serve` process
 * of its own on a fresh file-store directory (every write fsync'd), started
 * as `npm run bench` starts it (`bench/systems/casq.ts`; with latency, the
 * file store behind the fault-injecting wrapper, `slow-store-server.ts`),
 * by default from this checkout's build installed as users install it
 * (`--server built`, `lib/built-server.ts`: plain node, no tsx; the
 * slow-store server compiled beside it), and
 * a queue of one shard with the default config. The benchmark talks to it only
 * through the TypeScript SDK over gRPC, with the SDK's default options (a
 * default dedup id on every job):
 *
 * 1. Load: the standing backlog, in batches of 1,000 from 4 concurrent
 *    `Producer.enqueueBatch` callers (with the case's PUT latency); with
 *    `--load-batch 1`, single-job `Producer.enqueue` from 64 callers, which
 *    seals the backlog into many small segments (a bigger segment index).
 *    Other sizes: batches of that size from 4 callers.
 * 2. Enqueue: single-job `Producer.enqueue` from 64 concurrent callers for
 *    `--seconds`.
 * 3. Process: one SDK `Worker` at concurrency 50 (handler start counted, the
 *    job acked when the empty handler returns) for `--seconds`, or until it
 *    has handled as many jobs as the enqueue phase added, whichever comes
 *    first: so the backlog never drops below its size in either phase.
 *
 * What is measured comes from the broker, not from this process: per phase
 * (the difference of two scrapes of its Prometheus endpoint) PUTs and GETs
 * per 1,000 jobs (`casq_store_operations_total`, every attempt), bytes
 * written per commit (`casq_store_bytes_total` of PUTs, head and segments,
 * over `casq_commits_total{outcome="ok"}`), commit ms p50/p99 (estimated from
 * the buckets of `casq_commit_duration_seconds`, as PromQL's
 * `histogram_quantile` does, so at bucket resolution; commits that wrote
 * nothing are in it too) and operations per commit
 * (`casq_commit_batch_operations`); the broker's CPU seconds from `/proc`;
 * its resident memory now and at its peak (`/proc/<pid>/status` VmRSS and
 * VmHWM) after the load, after enqueue and after processing, and once more
 * when settled: the worker stopped and the broker idle for
 * `--settle-seconds`, default 30 (V8's memory reducer runs full collections
 * in a process whose allocation rate fell, but when is its own affair:
 * measured, 20 s after a 1M load the heap still held ~140 MB of garbage,
 * after 45-60 s it mostly did not, once after 60 s it still held ~60 MB), with
 * its JS heap in use and external memory, and then right after two full
 * collections forced through the broker's inspector (`--inspect` on
 * loopback, `lib/collect-garbage.ts`): the GC-settled point
 * from its metrics; and the head's
 * size, read from the store directory (`queues/<queue>/0.json`) after the
 * load and at the end.
 *
 * The head-size case (`--dead-letters`, default 100,000) runs the broker in
 * this process instead (see {@link runHeadCase}).
 *
 * Numbers are only comparable within one run on one machine.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Admin, Producer, Worker } from "../sdk/ts/src/index.ts";
import { Broker, NO_MANIFESTS } from "../server/src/broker/broker.ts";
import { FileStore } from "../server/src/store/file-store.ts";
import { systemClock } from "../server/src/util/clock.ts";
import { seededRandom } from "../server/src/util/random.ts";
import { type BuiltServer, serverFromOption } from "./lib/built-server.ts";
import { collectGarbage, freePort } from "./lib/collect-garbage.ts";
import { cpuSecondsOf } from "./lib/process-cpu.ts";
import { processMemory } from "./lib/process-memory.ts";
import {
  bucketDelta,
  bucketsOf,
  histogramQuantile,
  type Sample,
  scrape,
  sumOf,
} from "./lib/prometheus-text.ts";
import { CasqSystem } from "./systems/casq.ts";

const { values } = parseArgs({
  options: {
    json: { type: "boolean", default: false },
    sizes: { type: "string", default: "1000,10000,100000,1000000" },
    latency: { type: "string", default: "0,100" },
    seconds: { type: "string", default: "10" },
    "dead-letters": { type: "string", default: "100000" },
    "dedup-ids": { type: "string", default: "on" },
    "load-batch": { type: "string", default: "1000" },
    server: { type: "string", default: "built" },
    "settle-seconds": { type: "string", default: "30" },
    help: { type: "boolean", short: "h", default: false },
  },
});
if (values.help) {
  console.log(`usage: npm run bench:backlog -- [--json] [--sizes 1000,10000,100000,1000000] [--latency 0,100]
                                 [--seconds 10] [--dead-letters 100000] [--dedup-ids on|off] [--load-batch 1000]
                                 [--server built|source] [--settle-seconds 30]
For each backlog size and PUT latency (ms): a fresh casq serve on the file store, the backlog loaded
through the TypeScript SDK, then enqueue jobs/s from 64 callers and claim+ack jobs/s from one SDK Worker
at concurrency 50, --seconds each; per phase the broker's commit ms p50/p99, bytes per commit, PUTs and
GETs per 1,000 jobs (from its metrics), its RSS now/peak and the head's bytes; at the end, with the
worker stopped and the broker idle for --settle-seconds (V8's memory reducer collects an idle
process's garbage, here 20-60 s after the work stopped, or not), its settled RSS, JS heap used and external
memory; then again right after two full collections forced through the broker's inspector (started on
loopback for that): the GC-settled point.
--server built (default): casq serve as users install it: this checkout built, packed and installed
from the npm tarballs into a temporary directory, run by plain node (~30 s first); source: the
checkout's server/bin/casq.js, which runs the TypeScript through tsx (~45 MiB more RSS). Cases with
a PUT latency run bench/systems/slow-store-server.ts (compiled beside the installation, or through tsx).
--dead-letters N: the head-size case, N jobs with dedup ids all dead-lettered (0: skip it).
--dedup-ids off: the producers give jobs no dedup id (the SDK's default is one per job; each live id
costs the broker memory for the queue's dedup window).
--load-batch N (1..1000): the backlog is loaded in batches of N from 4 callers; 1: single-job enqueues
from 64 callers, so it is sealed into many small segments (the head's segment index grows with them).
A table on stdout (--json: one JSON object); progress on stderr.`);
  process.exit(0);
}
const deadLetters = Number(values["dead-letters"]);
const loadBatch = Number(values["load-batch"]);
const sizes = values.sizes.split(",").map(Number);
const latencies = values.latency.split(",").map(Number);
const seconds = Number(values.seconds);
const settleSeconds = Number(values["settle-seconds"]);
for (const [flag, ok] of [
  ["--sizes", sizes.every((n) => Number.isInteger(n) && n >= 0)],
  ["--latency", latencies.every((n) => Number.isFinite(n) && n >= 0)],
  ["--seconds", Number.isFinite(seconds) && seconds > 0],
  ["--dead-letters", Number.isInteger(deadLetters) && deadLetters >= 0],
  ["--dedup-ids", values["dedup-ids"] === "on" || values["dedup-ids"] === "off"],
  ["--load-batch", Number.isInteger(loadBatch) && loadBatch >= 1 && loadBatch <= 1000],
  ["--settle-seconds", Number.isFinite(settleSeconds) && settleSeconds >= 0],
] as const) {
  if (!ok) {
    console.error(`bench:backlog: bad ${flag} (see --help)`);
    process.exit(2);
  }
}
const payload = new Uint8Array(1024).fill(97);
const log = (line: string) => process.stderr.write(`${line}\n`);

/** The queue of every case (each case has a broker of its own). */
const QUEUE = "backlog";
/** Concurrent load callers (with batches; single-job loads use the enqueue phase's callers). */
const LOAD_CALLERS = 4;
/** Concurrent single-job callers of the enqueue phase, and the Worker's concurrency. */
const CALLERS = 64;
const CONCURRENCY = 50;

/** One measured phase, from the broker's metrics. */
interface Phase {
  jobs: number;
  seconds: number;
  jobs_per_s: number;
  commits: number;
  ops_per_commit: number;
  commit_ms_p50: number;
  commit_ms_p99: number;
  bytes_per_commit: number;
  puts_per_1000_jobs: number;
  gets_per_1000_jobs: number;
  broker_cpu_s: number;
}

/** The broker's resident memory at one point, MiB. */
interface Memory {
  rss_mib: number;
  peak_mib: number;
}

/** The broker's memory when settled (idle for --settle-seconds after the last phase), MiB. */
interface Settled extends Memory {
  /** V8's JS heap in use, and the memory outside it that JS objects hold (buffers), from its metrics. */
  heap_used_mib: number;
  external_mib: number;
}

/** The broker's memory right after two forced full collections (after {@link Settled}), MiB. */
interface Collected {
  rss_mib: number;
  heap_used_mib: number;
  external_mib: number;
}

interface Case {
  backlog: number;
  put_latency_ms: number;
  /** Which server ran: the installed build (plain node) or the source through tsx. */
  server: "built" | "source";
  load_seconds: number;
  enqueue: Phase;
  process: Phase;
  head_bytes_after_load: number;
  head_bytes: number;
  broker_memory: {
    after_load: Memory;
    after_enqueue: Memory;
    after_process: Memory;
    settled: Settled;
    after_gc: Collected;
  };
}

/** What one scrape of the broker says, plus its CPU time then. */
interface Snapshot {
  samples: Sample[];
  cpuSeconds: number;
}

const round = (n: number) => Math.round(n * 10) / 10;

async function snapshot(casq: CasqSystem): Promise<Snapshot> {
  const samples = await scrape(casq.metricsEndpoint);
  return { samples, cpuSeconds: cpuSecondsOf(casq.serverPids()) };
}

/** A phase's numbers: `jobs` in `elapsed` seconds, between the scrapes `before` and `after`. */
function phaseOf(jobs: number, elapsed: number, before: Snapshot, after: Snapshot): Phase {
  const delta = (name: string, match: Record<string, string> = {}) =>
    sumOf(after.samples, name, match) - sumOf(before.samples, name, match);
  const shard = { queue: QUEUE, shard: "0" };
  const commits = delta("casq_commits_total", { ...shard, outcome: "ok" });
  const durations = bucketDelta(
    bucketsOf(after.samples, "casq_commit_duration_seconds", shard),
    bucketsOf(before.samples, "casq_commit_duration_seconds", shard),
  );
  const batches = delta("casq_commit_batch_operations_count", shard);
  const perJobs = (n: number) => round((n * 1000) / Math.max(1, jobs));
  return {
    jobs,
    seconds: round(elapsed),
    jobs_per_s: round(jobs / elapsed),
    commits,
    ops_per_commit: round(delta("casq_commit_batch_operations_sum", shard) / Math.max(1, batches)),
    commit_ms_p50: round(histogramQuantile(0.5, durations) * 1000),
    commit_ms_p99: round(histogramQuantile(0.99, durations) * 1000),
    bytes_per_commit: Math.round(
      delta("casq_store_bytes_total", { op: "put", direction: "out" }) / Math.max(1, commits),
    ),
    puts_per_1000_jobs: perJobs(delta("casq_store_operations_total", { op: "put" })),
    gets_per_1000_jobs: perJobs(delta("casq_store_operations_total", { op: "get" })),
    broker_cpu_s: round(after.cpuSeconds - before.cpuSeconds),
  };
}

function memoryOf(casq: CasqSystem): Memory {
  const m = processMemory(casq.serverPids()[0] as number);
  return { rss_mib: Math.round(m.rssMiB), peak_mib: Math.round(m.peakMiB) };
}

/**
 * The head document's bytes, read through the file store: its file holds two
 * slots (the current version and the one before, and room to grow), so the
 * file's size is not the document's.
 */
async function headDocumentBytes(casq: CasqSystem): Promise<number> {
  const store = new FileStore({ root: casq.storeDirectory });
  try {
    const head = await store.get(`queues/${QUEUE}/0.json`);
    if (head === undefined) throw new Error(`bench:backlog: queue ${QUEUE} has no head document`);
    return head.body.byteLength;
  } finally {
    await store.close();
  }
}

/**
 * Enqueues `jobs` in batches of `--load-batch` from {@link LOAD_CALLERS} callers (single jobs: from
 * as many callers as the enqueue phase), with progress on stderr.
 */
async function load(producer: Producer, jobs: number, what: string): Promise<void> {
  const started = performance.now();
  let next = 0;
  let done = 0;
  const progress = setInterval(() => {
    const rate = done / ((performance.now() - started) / 1000);
    log(
      `${what}: loaded ${done.toLocaleString("en")} of ${jobs.toLocaleString("en")} (${Math.round(rate)} jobs/s)`,
    );
  }, 5_000);
  try {
    const caller = async () => {
      while (next < jobs) {
        const n = Math.min(loadBatch, jobs - next);
        next += n;
        if (loadBatch === 1) await producer.enqueue(QUEUE, payload);
        else
          await producer.enqueueBatch(
            QUEUE,
            Array.from({ length: n }, () => ({ payload })),
          );
        done += n;
      }
    };
    await Promise.all(Array.from({ length: loadBatch === 1 ? CALLERS : LOAD_CALLERS }, caller));
  } finally {
    clearInterval(progress);
  }
}

/** The broker's JS heap in use and external memory, MiB, from its metrics. */
async function heapOf(casq: CasqSystem): Promise<{ heap_used_mib: number; external_mib: number }> {
  const samples = await scrape(casq.metricsEndpoint);
  const mib = (name: string) => Math.round(sumOf(samples, name) / 1024 / 1024);
  return {
    heap_used_mib: mib("casq_nodejs_heap_size_used_bytes"),
    external_mib: mib("casq_nodejs_external_memory_bytes"),
  };
}

/** The broker's memory after it has been idle for {@link settleSeconds}, then after forced collections. */
async function settledMemory(casq: CasqSystem, inspectPort: number): Promise<[Settled, Collected]> {
  await new Promise((r) => setTimeout(r, settleSeconds * 1000));
  const settled = { ...memoryOf(casq), ...(await heapOf(casq)) };
  await collectGarbage(inspectPort);
  await new Promise((r) => setTimeout(r, 1000));
  return [settled, { rss_mib: memoryOf(casq).rss_mib, ...(await heapOf(casq)) }];
}

async function runCase(backlog: number, latencyMs: number, built: BuiltServer | undefined): Promise<Case> {
  const server = built === undefined ? "source" : "built";
  const what = `backlog ${backlog.toLocaleString("en")}, PUT +${latencyMs} ms, ${server} server`;
  // The inspector (loopback) only so that the settled point can force full collections.
  const inspectPort = await freePort();
  const casq = new CasqSystem({
    ...(latencyMs > 0
      ? { putLatencyMs: latencyMs, ...(built ? { slowStoreServer: built.slowStoreServer } : {}) }
      : built
        ? { serverBin: built.bin }
        : {}),
    nodeArgs: [`--inspect=127.0.0.1:${inspectPort}`],
  });
  await casq.start();
  try {
    const brokers = [casq.brokerAddress];
    await new Admin({ brokers }).createQueue(QUEUE, { shardCount: 1 });
    const producer = new Producer({ brokers, defaultDedupIds: values["dedup-ids"] === "on" });

    const loadStarted = performance.now();
    await load(producer, backlog, what);
    const loadSeconds = (performance.now() - loadStarted) / 1000;
    const afterLoad = memoryOf(casq);
    const headAfterLoad = await headDocumentBytes(casq);
    log(`${what}: loaded in ${loadSeconds.toFixed(1)} s; broker RSS ${afterLoad.rss_mib} MiB`);

    // Enqueue: 64 callers of single-job enqueues for --seconds.
    let before = await snapshot(casq);
    let started = performance.now();
    const until = started + seconds * 1000;
    let enqueued = 0;
    await Promise.all(
      Array.from({ length: CALLERS }, async () => {
        while (performance.now() < until) {
          await producer.enqueue(QUEUE, payload);
          enqueued += 1;
        }
      }),
    );
    const enqueue = phaseOf(enqueued, (performance.now() - started) / 1000, before, await snapshot(casq));
    const afterEnqueue = memoryOf(casq);
    log(`${what}: enqueue ${enqueue.jobs_per_s} jobs/s`);

    // Process: one Worker at concurrency 50, for --seconds or `enqueued` jobs.
    const worker = new Worker({ brokers, logger: null });
    let handled = 0;
    before = await snapshot(casq);
    started = performance.now();
    let failed: unknown;
    const run = worker
      .run(
        QUEUE,
        () => {
          handled += 1;
        },
        { concurrency: CONCURRENCY },
      )
      .catch((error: unknown) => {
        failed = error;
      });
    const deadline = started + seconds * 1000;
    while (handled < Math.max(1, enqueued) && performance.now() < deadline && failed === undefined)
      await new Promise((r) => setTimeout(r, 5));
    const jobs = handled;
    const elapsed = (performance.now() - started) / 1000;
    const processing = phaseOf(jobs, elapsed, before, await snapshot(casq));
    const afterProcess = memoryOf(casq);
    await worker.stop({ timeoutMs: 5_000 });
    await run;
    if (failed !== undefined) throw failed;
    log(`${what}: process ${processing.jobs_per_s} jobs/s; settling ${settleSeconds} s`);
    const [settled, afterGc] = await settledMemory(casq, inspectPort);
    log(
      `${what}: settled RSS ${settled.rss_mib} MiB (peak ${settled.peak_mib}); after forced GC ${afterGc.rss_mib} MiB`,
    );
    return {
      backlog,
      put_latency_ms: latencyMs,
      server,
      load_seconds: round(loadSeconds),
      enqueue,
      process: processing,
      head_bytes_after_load: headAfterLoad,
      head_bytes: await headDocumentBytes(casq),
      broker_memory: {
        after_load: afterLoad,
        after_enqueue: afterEnqueue,
        after_process: afterProcess,
        settled,
        after_gc: afterGc,
      },
    };
  } finally {
    await casq.stop();
  }
}

/** The head-size case ({@link runHeadCase}). */
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

/**
 * The head-size case: enqueues `jobs` 1 KiB jobs with a dedup id on every
 * one (all within the dedup window), then dead-letters every one of them
 * (claim 1000, nack as dead letter), and reports the head's size after the
 * enqueues and after the dead-lettering, the largest head written on the way,
 * and the objects under `seg/`.
 *
 * It drives the broker engine in this process (the engine `casq serve`
 * runs, on the file store, no latency) rather than a `casq serve` through
 * the SDK: it measures sizes, which do not depend on the process or the
 * transport, and it needs `deadLetterLimit` raised and a fast dead-lettering
 * loop, which the in-process calls give directly. Its RSS is this whole
 * process's (benchmark included), not a broker's.
 */
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
    message_segments: names.filter(
      (n) => !n.endsWith(".dead.json") && !n.endsWith(".dedup.json") && !n.endsWith(".index.json"),
    ).length,
    rss_mib: Math.round(rss / 1024 / 1024),
  };
}

const cases: Case[] = [];
const built = serverFromOption(
  values.server,
  sizes.some((n) => n > 0),
  log,
);
try {
  for (const latency of latencies) {
    for (const size of sizes) {
      if (size <= 0) continue;
      cases.push(await runCase(size, latency, built));
    }
  }
} finally {
  built?.remove();
}
const heads = deadLetters > 0 ? await runHeadCase(deadLetters) : undefined;
if (heads !== undefined) log(`head case: ${deadLetters} dead letters done`);
if (values.json) {
  console.log(
    JSON.stringify(
      {
        seconds_per_phase: seconds,
        payload_bytes: payload.byteLength,
        enqueue_callers: CALLERS,
        worker_concurrency: CONCURRENCY,
        dedup_ids: values["dedup-ids"] === "on",
        load_batch: loadBatch,
        settle_seconds: settleSeconds,
        cases,
        ...(heads ? { heads } : {}),
      },
      null,
      2,
    ),
  );
} else if (cases.length > 0) {
  console.log(
    "backlog  put_ms server |  enq/s  p50/p99 ms  B/commit PUT/1k GET/1k | proc/s  p50/p99 ms  B/commit PUT/1k GET/1k | head bytes | broker RSS/peak MiB: load   enqueue   process   settled | settled heap/external MiB | after GC: RSS heap/external MiB",
  );
  for (const c of cases) {
    const p = (x: Phase) =>
      `${String(x.jobs_per_s).padStart(7)} ${`${x.commit_ms_p50}/${x.commit_ms_p99}`.padStart(11)} ${String(x.bytes_per_commit).padStart(9)} ${String(x.puts_per_1000_jobs).padStart(6)} ${String(x.gets_per_1000_jobs).padStart(6)}`;
    const m = (x: Memory) => `${x.rss_mib}/${x.peak_mib}`.padStart(9);
    const mem = c.broker_memory;
    console.log(
      `${String(c.backlog).padStart(7)} ${String(c.put_latency_ms).padStart(7)} ${c.server.padStart(6)} |${p(c.enqueue)} |${p(c.process)} | ${String(c.head_bytes).padStart(10)} |                 ${m(mem.after_load)} ${m(mem.after_enqueue)} ${m(mem.after_process)} ${m(mem.settled)} | ${`${mem.settled.heap_used_mib}/${mem.settled.external_mib}`.padStart(9)} | ${String(mem.after_gc.rss_mib).padStart(4)} ${`${mem.after_gc.heap_used_mib}/${mem.after_gc.external_mib}`.padStart(9)}`,
    );
  }
}
if (!values.json && heads !== undefined) {
  console.log("");
  console.log(
    "head case (in-process broker): jobs (dedup id on each, then all dead-lettered) | head bytes: after enqueue  after dead-lettering  largest | seg objects: dead-letter dedup message | bench process RSS MiB",
  );
  console.log(
    `${String(heads.jobs).padStart(9)} | ${String(heads.head_bytes_dedup).padStart(10)} ${String(heads.head_bytes_dead_letters).padStart(10)} ${String(heads.head_bytes_max).padStart(10)} | ${String(heads.dead_letter_segments).padStart(5)} ${String(heads.dedup_segments).padStart(5)} ${String(heads.message_segments).padStart(5)} | ${String(heads.rss_mib).padStart(6)}`,
  );
}
