/**
 * The TypeScript client under test of the scenario interpreter (protocol in
 * test/scenario-interpreter/README.md): reads one JSON request a line on
 * stdin, makes the `@casq/sdk` call it names, and writes one JSON response a
 * line on stdout. Run with tsx; argv[2] is `{"brokers": [...]}`.
 */
import { createInterface } from "node:readline";
import { toJson } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { GetQueueResponseSchema } from "@casq/api/casq/v1/admin_service_pb.ts";
import { Admin, type ClientOptions, DeadLetterError, type Job, Producer, Worker } from "@casq/sdk";

type Request = Record<string, unknown> & { id: number; op: string };

const { brokers } = JSON.parse(process.argv[2] ?? "{}") as { brokers: string[] };
// The SDK's defaults: their retry budget must ride out a killed leader on its own.
const options: ClientOptions = { brokers };
const admin = new Admin(options);
const producers = new Map<string, Producer>();

/** A producer whose client knows `only` brokers (all of them when absent). */
function producer(only: string[] | undefined): Producer {
  const list = only ?? brokers;
  const key = list.join(",");
  let p = producers.get(key);
  if (!p) {
    p = new Producer({ brokers: list });
    producers.set(key, p);
  }
  return p;
}

interface WorkerRun {
  readonly worker: Worker;
  readonly run: Promise<void>;
  readonly graceMs: number;
  readonly invocations: { payload: string; attempt: number }[];
  readonly errors: string[];
  started: number;
  completed: number;
  ended: boolean;
  error?: string;
}
const workers = new Map<string, WorkerRun>();

const HANDLER_ERROR = "scenario handler:";
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

function startWorker(r: Request): void {
  const name = r.name as string;
  if (workers.has(name)) throw new Error(`worker ${name} already exists`);
  const handler = r.handler as string;
  const handlerMs = r.handlerMs as number;
  const worker = new Worker({ ...options, workerId: `scenario-${name}` });
  const state = {
    worker,
    graceMs: r.graceMs as number,
    invocations: [],
    errors: [],
    started: 0,
    completed: 0,
    ended: false,
  } as Omit<WorkerRun, "run"> as WorkerRun;
  const handle = async (job: Job): Promise<void> => {
    state.invocations.push({ payload: job.text(), attempt: job.attempt });
    state.started++;
    if (handler === "hang") await new Promise<never>(() => {});
    try {
      if (handlerMs > 0) await sleep(handlerMs);
      if (handler === "nack") throw new Error(`${HANDLER_ERROR} nack`);
      if (handler === "deadLetter") throw new DeadLetterError(`${HANDLER_ERROR} dead letter`);
    } finally {
      state.completed++;
    }
  };
  const run = worker.run(r.queue as string, handle, {
    subscription: r.subscription as string,
    concurrency: r.concurrency as number,
    prefetch: r.prefetch as number,
    ...(r.leaseTtlMs === undefined ? {} : { leaseTtlMs: r.leaseTtlMs as number }),
    onError: (error) => {
      if (error instanceof Error && error.message.startsWith(HANDLER_ERROR)) return;
      state.errors.push(String(error));
      if (state.errors.length > 5) state.errors.shift();
    },
  });
  (state as { run: Promise<void> }).run = run.then(
    () => {
      state.ended = true;
    },
    (error: unknown) => {
      state.ended = true;
      state.error = String(error ?? "run rejected");
    },
  );
  workers.set(name, state);
}

function workerState(w: WorkerRun): object {
  const { started, completed, invocations, ended, error, errors } = w;
  return { started, completed, invocations, ended, errors, ...(error === undefined ? {} : { error }) };
}

function worker(name: unknown): WorkerRun {
  const w = workers.get(name as string);
  if (!w) throw new Error(`no worker ${String(name)}`);
  return w;
}

async function handle(r: Request): Promise<unknown> {
  switch (r.op) {
    case "createQueue": {
      const backoff = durationFromMs(r.backoffMs as number);
      await admin.createQueue(r.queue as string, {
        shardCount: r.shards as number,
        config: {
          leaseTtl: durationFromMs(r.leaseTtlMs as number),
          ...(r.maxAttempts === undefined ? {} : { maxAttempts: r.maxAttempts as number }),
          backoff: { initialDelay: backoff, maxDelay: backoff, multiplier: 1, jitter: 0 },
        },
      });
      return {};
    }
    case "createSubscription":
      await admin.createSubscription(r.queue as string, r.subscription as string, { start: "earliest" });
      return {};
    case "enqueue": {
      const p = producer(r.brokers as string[] | undefined);
      const messages = r.messages as { payload: string }[];
      const results = r.batch
        ? await p.enqueueBatch(r.queue as string, messages)
        : await (async () => {
            const out = [];
            for (const { payload, ...rest } of messages)
              out.push(await p.enqueue(r.queue as string, payload, rest));
            return out;
          })();
      return { results: results.map((x) => ({ id: x.id, duplicate: x.duplicate })) };
    }
    case "getQueue":
      return toJson(GetQueueResponseSchema, await admin.getQueue(r.queue as string));
    case "listDeadLetters": {
      const decoder = new TextDecoder();
      const dead = await admin.listDeadLetters(r.queue as string, { subscription: r.subscription as string });
      return { payloads: dead.map((d) => decoder.decode(d.message?.payload ?? new Uint8Array())) };
    }
    case "redrive": {
      const { redriven } = await admin.redrive(r.queue as string, { subscription: r.subscription as string });
      return { redriven: Number(redriven) };
    }
    case "startWorker":
      startWorker(r);
      return {};
    case "workerState":
      return workerState(worker(r.name));
    case "stopWorker": {
      const w = worker(r.name);
      await w.worker.stop({ timeoutMs: w.graceMs });
      await w.run;
      return workerState(w);
    }
    default:
      throw new Error(`unknown op ${JSON.stringify(r.op)}`);
  }
}

// One request at a time: the interpreter waits for each answer.
for await (const line of createInterface({ input: process.stdin })) {
  const request = JSON.parse(line) as Request;
  let response: object;
  try {
    response = { id: request.id, result: await handle(request) };
  } catch (error) {
    response = { id: request.id, error: error instanceof Error ? error.message : String(error) };
  }
  process.stdout.write(`${JSON.stringify(response)}\n`);
}
process.exit(0);
