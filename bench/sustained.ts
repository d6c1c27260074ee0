/**
 * Sustained-enqueue benchmark: one shard enqueued without pause for longer
 * than its dedup window, as a time series. The other benchmarks run 20,000
 * jobs (a few seconds), so they never see a shard whose dedup window is
 * full, nor a backlog of millions built by the enqueue itself.
 *
 *   npm run bench:sustained                          # 7 min, dedup window 5 min (the default), a table
 *   npm run -s bench:sustained -- --json             # one JSON object (progress on stderr; -s: no npm header)
 *   npm run bench:sustained -- --seconds 120 --window 60
 *   npm run bench:sustained -- --dedup-ids off       # the same without the SDK's default dedup ids
 *   npm run bench:sustained -- --batch 1             # single-job enqueues from 64 callers
 *
 * `casq serve` runs as `npm run bench` runs it (`bench/systems/casq.ts`: the
 * file store, every write fsync'd; by default this checkout's build
 * installed as users install it). One queue of one shard with the given
 * dedup window; nothing consumes it, so the backlog grows by every job.
 * Producers: 4 callers of `Producer.enqueueBatch` with `--batch` jobs of
 * 1 KiB each (64 callers of `Producer.enqueue` with `--batch 1`), the SDK's
 * default options.
 *
 * Every `--interval` seconds one row: jobs/s in the interval, the backlog,
 * the size of the last head the broker wrote (`casq_document_bytes`), the
 * broker's CPU (all its threads, from /proc) and RSS. The summary compares
 * the median rate of the intervals after the dedup window filled with that
 * of the intervals before it (but the first, the server's warm-up, when
 * there are more).
 */
import { parseArgs } from "node:util";
import { Admin, Producer } from "../sdk/ts/src/index.ts";
import { serverFromOption } from "./lib/built-server.ts";
import { cpuSecondsOf } from "./lib/process-cpu.ts";
import { processMemory } from "./lib/process-memory.ts";
import { scrape, sumOf } from "./lib/prometheus-text.ts";
import { spread } from "./lib/report.ts";
import { CasqSystem } from "./systems/casq.ts";

const { values } = parseArgs({
  options: {
    seconds: { type: "string", default: "420" },
    window: { type: "string", default: "300" },
    interval: { type: "string", default: "10" },
    batch: { type: "string", default: "100" },
    "dedup-ids": { type: "string", default: "on" },
    server: { type: "string", default: "built" },
    json: { type: "boolean", default: false },
    help: { type: "boolean", short: "h", default: false },
  },
});

if (values.help) {
  console.log(`usage: npm run bench:sustained -- [--seconds 420] [--window 300] [--interval 10] [--batch 100]
                                 [--dedup-ids on|off] [--server built|source] [--json]
Enqueues 1 KiB jobs into one shard of a fresh casq serve (file store, fsync on) for --seconds,
nothing consuming them, and prints one row per --interval seconds: jobs/s, backlog, head bytes,
broker CPU and RSS. --window is the queue's dedup window in seconds (default 300, the queue
default); run longer than it to see a shard whose window is full. --batch: jobs per
Producer.enqueueBatch call from 4 callers; 1 means Producer.enqueue from 64 callers.
--dedup-ids off: the Producer's defaultDedupIds off (as in bench:backlog). --server built (default): this checkout
built and installed as users install it (~30 s first); source: the checkout's tsx launcher.`);
  process.exit(0);
}

function positive(name: string, text: string | undefined): number {
  const n = Number(text);
  if (!Number.isFinite(n) || n <= 0) {
    console.error(`--${name} takes a positive number; got ${text}`);
    process.exit(2);
  }
  return n;
}

const seconds = positive("seconds", values.seconds);
const windowSeconds = positive("window", values.window);
const interval = positive("interval", values.interval);
const batch = positive("batch", values.batch);
if (!Number.isInteger(batch) || batch > 1000) {
  console.error(`--batch takes a whole number of jobs from 1 to 1000; got ${values.batch}`);
  process.exit(2);
}
if (values["dedup-ids"] !== "on" && values["dedup-ids"] !== "off") {
  console.error(`--dedup-ids takes on or off; got ${values["dedup-ids"]}`);
  process.exit(2);
}
const dedupIds = values["dedup-ids"] === "on";
const log = (line: string) => console.error(`bench:sustained: ${line}`);
const built = serverFromOption(values.server as string, true, log);

/** One interval of the run. */
interface Row {
  readonly t_s: number;
  readonly jobs_per_s: number;
  readonly backlog: number;
  readonly head_bytes: number;
  readonly broker_cpu_percent: number;
  readonly rss_mib: number;
}

const median = (xs: readonly number[]) => (xs.length === 0 ? 0 : spread(xs).median);

const casq = new CasqSystem(built ? { serverBin: built.bin } : {});
await casq.start();
const rows: Row[] = [];
try {
  const brokers = [casq.brokerAddress];
  const queue = "sustained";
  await new Admin({ brokers }).createQueue(queue, {
    shardCount: 1,
    config: { dedupWindow: { seconds: BigInt(Math.round(windowSeconds)) } },
  });
  const producer = new Producer({ brokers, defaultDedupIds: dedupIds });
  const payload = Buffer.alloc(1024, 97);
  const pids = casq.serverPids();
  const started = performance.now();
  const end = started + seconds * 1000;
  let enqueued = 0;
  const batchCaller = async () => {
    while (performance.now() < end) {
      await producer.enqueueBatch(
        queue,
        Array.from({ length: batch }, () => ({ payload })),
      );
      enqueued += batch;
    }
  };
  const singleCaller = async () => {
    while (performance.now() < end) {
      await producer.enqueue(queue, payload);
      enqueued += 1;
    }
  };
  const callers =
    batch === 1 ? Array.from({ length: 64 }, singleCaller) : Array.from({ length: 4 }, batchCaller);
  const done = Promise.all(callers);
  let last = { at: started, jobs: 0, cpu: cpuSecondsOf(pids) };
  while (performance.now() < end) {
    await Promise.race([
      done,
      new Promise((r) => setTimeout(r, Math.min(interval * 1000, end - performance.now()))),
    ]);
    const now = performance.now();
    const cpu = cpuSecondsOf(pids);
    const elapsed = (now - last.at) / 1000;
    if (elapsed < interval / 2) break; // the last sliver of the run says nothing
    const row: Row = {
      t_s: Math.round((now - started) / 100) / 10,
      jobs_per_s: Math.round((enqueued - last.jobs) / elapsed),
      backlog: enqueued,
      head_bytes: sumOf(await scrape(casq.metricsEndpoint), "casq_document_bytes"),
      broker_cpu_percent: Math.round(((cpu - last.cpu) / elapsed) * 100),
      rss_mib: Math.round(processMemory(pids[0] as number).rssMiB),
    };
    rows.push(row);
    log(
      `t=${row.t_s}s ${row.jobs_per_s} jobs/s, backlog ${row.backlog}, head ${row.head_bytes} B, cpu ${row.broker_cpu_percent} %, rss ${row.rss_mib} MiB`,
    );
    last = { at: now, jobs: enqueued, cpu };
  }
  await done;
} finally {
  await casq.stop();
}

// The first interval is left out when there are others: it holds the server's warm-up (JIT, the first segments).
const filling = rows.filter((r) => r.t_s <= windowSeconds);
const before = (filling.length > 1 ? filling.slice(1) : filling).map((r) => r.jobs_per_s);
const after = rows.filter((r) => r.t_s > windowSeconds + interval).map((r) => r.jobs_per_s);
const beforeMedian = median(before);
const afterMedian = after.length > 0 ? median(after) : null;
const summary = {
  jobs_per_s_before_window: beforeMedian,
  jobs_per_s_after_window: afterMedian,
  after_over_before:
    afterMedian !== null && beforeMedian > 0 ? Math.round((afterMedian / beforeMedian) * 100) / 100 : null,
  head_bytes_max: Math.max(0, ...rows.map((r) => r.head_bytes)),
  rss_mib_max: Math.max(0, ...rows.map((r) => r.rss_mib)),
  backlog: rows.at(-1)?.backlog ?? 0,
};
const result = {
  seconds,
  dedup_window_s: windowSeconds,
  interval_s: interval,
  batch,
  dedup_ids: dedupIds,
  server: values.server,
  payload_bytes: 1024,
  rows,
  summary,
};

if (values.json) console.log(JSON.stringify(result, null, 2));
else {
  console.log(
    `sustained enqueue: ${seconds} s, dedup window ${windowSeconds} s, ${batch === 1 ? "64 callers of enqueue" : `4 callers of enqueueBatch(${batch})`}, dedup ids ${dedupIds ? "on" : "off"}`,
  );
  console.log("    t s    jobs/s     backlog  head bytes  broker cpu %  rss MiB");
  for (const r of rows)
    console.log(
      `${String(r.t_s).padStart(7)} ${String(r.jobs_per_s).padStart(9)} ${String(r.backlog).padStart(11)} ${String(r.head_bytes).padStart(11)} ${String(r.broker_cpu_percent).padStart(13)} ${String(r.rss_mib).padStart(8)}`,
    );
  console.log(
    `median jobs/s before the window filled: ${summary.jobs_per_s_before_window}; after: ${summary.jobs_per_s_after_window ?? "(run longer than --window)"}${summary.after_over_before === null ? "" : ` (${summary.after_over_before}x)`}; head at most ${summary.head_bytes_max} B; RSS at most ${summary.rss_mib_max} MiB`,
  );
}
process.exit(0);
