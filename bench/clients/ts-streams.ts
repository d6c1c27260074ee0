/**
 * One client process of the benchmark's many-clients case: opens `--streams`
 * Work streams on one queue (one SDK Worker run each, concurrency 1), counts
 * the jobs each stream's handler got, prints `handled <total>` whenever the
 * total changed (at most every 100 ms), and on the line `stop` on stdin stops
 * every run and prints one JSON line `{"counts":[...]}`.
 *
 *   tsx bench/clients/ts-streams.ts --brokers 127.0.0.1:50051 --queue bench-1 --streams 250
 */
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";
import { Worker } from "../../sdk/ts/src/index.ts";

const { values } = parseArgs({
  options: {
    brokers: { type: "string", default: "127.0.0.1:50051" },
    queue: { type: "string" },
    streams: { type: "string", default: "100" },
    "streams-per-connection": { type: "string", default: "50" },
  },
});
if (!values.queue) throw new Error("--queue is required");
const queue = values.queue;
const streams = Number(values.streams);
const perConnection = Number(values["streams-per-connection"]);
const brokers = values.brokers.split(",");

const counts = new Array<number>(streams).fill(0);
let total = 0;
let reported = -1;
const workers: Worker[] = [];
const runs: Promise<void>[] = [];
for (let i = 0; i < streams; i += 1) {
  if (i % perConnection === 0) workers.push(new Worker({ brokers, logger: null }));
  const worker = workers[workers.length - 1] as Worker;
  runs.push(
    worker.run(
      queue,
      () => {
        counts[i] = (counts[i] as number) + 1;
        total += 1;
      },
      { concurrency: 1 },
    ),
  );
}

const progress = setInterval(() => {
  if (total !== reported) {
    reported = total;
    process.stdout.write(`handled ${total}\n`);
  }
}, 100);

createInterface({ input: process.stdin }).on("line", async (line) => {
  if (line.trim() !== "stop") return;
  clearInterval(progress);
  await Promise.all(workers.map((w) => w.stop({ timeoutMs: 5_000 })));
  await Promise.allSettled(runs);
  process.stdout.write(`${JSON.stringify({ counts })}\n`);
  process.exit(0);
});
