/**
 * The TypeScript interpreter of the language-neutral SDK scenarios in
 * test/scenarios (spec: test/scenarios/README.md): parses one scenario file
 * strictly, starts its `casq serve` brokers on a fresh file store, creates
 * its queue through {@link Admin}, runs its steps with the TypeScript SDK,
 * and always kills the brokers and removes the store afterwards.
 */
import type { ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { durationFromMs, timestampMs } from "@bufbuild/protobuf/wkt";
import {
  Admin,
  type ClientOptions,
  DeadLetterError,
  type EnqueueResult,
  type Job,
  type OutgoingMessage,
  Producer,
  Worker,
} from "@casq/sdk";
import type { SubscriptionStats } from "@casq/sdk/gen/casq/v1/admin_service_pb.ts";
import {
  type CasqServerProcess,
  ROOT,
  spawnProgram,
  startServer,
  tempDir,
} from "../e2e/support/processes.ts";

// ---------------------------------------------------------------------------
// Scenario model and strict parsing

/** One message of an `enqueue` step. */
export interface ScenarioMessage {
  readonly payload: string;
  readonly key?: string;
  readonly priority?: number;
  readonly delayMs?: number;
  readonly maxAttempts?: number;
  readonly dedupId?: string;
  readonly headers?: Record<string, string>;
}

/** The `queue` section of a scenario. */
export interface ScenarioQueue {
  readonly shards?: number;
  readonly leaseTtlMs?: number;
  readonly maxAttempts?: number;
  readonly backoffMs?: number;
}

/** A step; `do` selects the kind, the other fields are as in the spec. */
export type ScenarioStep =
  | {
      readonly do: "enqueue";
      readonly batch?: boolean;
      /** Send through a producer that knows only this broker (index into the scenario's brokers). */
      readonly via?: number;
      readonly messages: ScenarioMessage[];
      readonly expectDuplicate?: boolean[];
    }
  | {
      readonly do: "produce";
      readonly count: number;
      readonly prefix: string;
      readonly killLeaderAfter?: number;
    }
  | { readonly do: "restartBroker"; readonly broker: number }
  | { readonly do: "freezeBroker"; readonly broker: number }
  | { readonly do: "thawBroker"; readonly broker: number }
  | { readonly do: "awaitLeaseLapse"; readonly broker: number; readonly timeoutMs?: number }
  | { readonly do: "expectLeaders"; readonly distinct: number }
  | {
      readonly do: "startWorker";
      readonly name: string;
      readonly subscription?: string;
      readonly concurrency?: number;
      readonly prefetch?: number;
      readonly handler: "ack" | "nack" | "deadLetter";
      readonly handlerMs?: number;
      readonly leaseTtlMs?: number;
    }
  | {
      readonly do: "awaitWorker";
      readonly name: string;
      readonly started?: number;
      readonly completed?: number;
      readonly distinctPayloads?: number;
      readonly timeoutMs?: number;
      readonly expect?: string[];
      readonly ordered?: boolean;
      readonly expectAttempts?: number[];
      readonly expectAllOf?: { readonly prefix: string; readonly count: number };
    }
  | {
      readonly do: "stopWorker";
      readonly name: string;
      readonly timeoutMs?: number;
      readonly expectStarted?: number;
      readonly expectCompleted?: number;
    }
  | {
      readonly do: "crashWorker";
      readonly subscription?: string;
      readonly jobs: number;
      readonly expect?: string[];
      readonly timeoutMs?: number;
    }
  | {
      readonly do: "stats";
      readonly subscription?: string;
      readonly expect?: Record<string, number>;
      readonly counters?: Record<string, number>;
      readonly timeoutMs?: number;
    }
  | { readonly do: "deadLetters"; readonly subscription?: string; readonly expect: string[] }
  | { readonly do: "redrive"; readonly subscription?: string; readonly expect: number };

/** A parsed scenario file. */
export interface Scenario {
  readonly name: string;
  readonly description?: string;
  readonly brokers: number;
  readonly queue: ScenarioQueue;
  readonly subscriptions: string[];
  readonly steps: ScenarioStep[];
}

type FieldType =
  | "string"
  | "number"
  | "integer"
  | "boolean"
  | "string[]"
  | "boolean[]"
  | "integer[]"
  | "object"
  | "array";

function typeOk(value: unknown, type: FieldType): boolean {
  switch (type) {
    case "string":
      return typeof value === "string";
    case "number":
      return typeof value === "number" && Number.isFinite(value);
    case "integer":
      return Number.isInteger(value);
    case "boolean":
      return typeof value === "boolean";
    case "string[]":
      return Array.isArray(value) && value.every((v) => typeof v === "string");
    case "boolean[]":
      return Array.isArray(value) && value.every((v) => typeof v === "boolean");
    case "integer[]":
      return Array.isArray(value) && value.every((v) => Number.isInteger(v));
    case "object":
      return typeof value === "object" && value !== null && !Array.isArray(value);
    case "array":
      return Array.isArray(value);
  }
}

/**
 * Checks that `value` is an object whose fields all appear in `fields` with
 * the right types and that every required field (`!` suffix) is present.
 * Unknown fields are errors: a runner must never skip what it does not know.
 */
function checkFields(
  where: string,
  value: unknown,
  fields: Record<string, FieldType>,
): Record<string, unknown> {
  if (!typeOk(value, "object")) throw new Error(`${where}: expected an object, got ${JSON.stringify(value)}`);
  const object = value as Record<string, unknown>;
  const known = new Map(
    Object.entries(fields).map(([k, t]) => [k.replace(/!$/, ""), { t, required: k.endsWith("!") }]),
  );
  for (const [key, field] of Object.entries(object)) {
    const spec = known.get(key);
    if (!spec) throw new Error(`${where}: unknown field ${JSON.stringify(key)}`);
    if (!typeOk(field, spec.t))
      throw new Error(`${where}: field ${key} must be ${spec.t}, got ${JSON.stringify(field)}`);
  }
  for (const [key, spec] of known)
    if (spec.required && !(key in object)) throw new Error(`${where}: missing field ${JSON.stringify(key)}`);
  return object;
}

/** Fields of SubscriptionStats / SubscriptionCounters a `stats` step may name (camelCase of the proto names). */
const STATS_FIELDS = new Set(["ready", "inFlight", "delayed", "depth", "dead", "lag"]);
const COUNTER_FIELDS = new Set([
  "enqueued",
  "delivered",
  "acked",
  "redelivered",
  "deadLettered",
  "deadEvicted",
  "purged",
  "redriven",
]);

function checkNumbers(where: string, value: unknown, allowed: Set<string>): void {
  checkFields(where, value, Object.fromEntries([...allowed].map((k) => [k, "integer" as const])));
}

function parseStep(where: string, raw: unknown): ScenarioStep {
  if (!typeOk(raw, "object")) throw new Error(`${where}: a step must be an object`);
  const step = raw as Record<string, unknown>;
  if (typeof step.do !== "string") throw new Error(`${where}: missing field "do"`);
  switch (step.do) {
    case "enqueue": {
      checkFields(where, step, {
        "do!": "string",
        batch: "boolean",
        via: "integer",
        "messages!": "array",
        expectDuplicate: "boolean[]",
      });
      (step.messages as unknown[]).forEach((m, i) => {
        const message = checkFields(`${where} messages[${i}]`, m, {
          "payload!": "string",
          key: "string",
          priority: "integer",
          delayMs: "integer",
          maxAttempts: "integer",
          dedupId: "string",
          headers: "object",
        });
        if (message.headers !== undefined)
          for (const [h, v] of Object.entries(message.headers as object))
            if (typeof v !== "string")
              throw new Error(`${where} messages[${i}]: header ${h} must be a string`);
      });
      const expectDuplicate = step.expectDuplicate as boolean[] | undefined;
      if (expectDuplicate && expectDuplicate.length !== (step.messages as unknown[]).length)
        throw new Error(`${where}: expectDuplicate needs one entry per message`);
      break;
    }
    case "produce":
      checkFields(where, step, {
        "do!": "string",
        "count!": "integer",
        "prefix!": "string",
        killLeaderAfter: "integer",
      });
      break;
    case "restartBroker":
    case "freezeBroker":
    case "thawBroker":
      checkFields(where, step, { "do!": "string", "broker!": "integer" });
      break;
    case "awaitLeaseLapse":
      checkFields(where, step, { "do!": "string", "broker!": "integer", timeoutMs: "integer" });
      break;
    case "expectLeaders":
      checkFields(where, step, { "do!": "string", "distinct!": "integer" });
      if ((step.distinct as number) < 0) throw new Error(`${where}: distinct must not be negative`);
      break;
    case "startWorker":
      checkFields(where, step, {
        "do!": "string",
        "name!": "string",
        subscription: "string",
        concurrency: "integer",
        prefetch: "integer",
        "handler!": "string",
        handlerMs: "integer",
        leaseTtlMs: "integer",
      });
      if (!["ack", "nack", "deadLetter"].includes(step.handler as string))
        throw new Error(`${where}: unknown handler ${JSON.stringify(step.handler)}`);
      break;
    case "awaitWorker": {
      checkFields(where, step, {
        "do!": "string",
        "name!": "string",
        started: "integer",
        completed: "integer",
        distinctPayloads: "integer",
        timeoutMs: "integer",
        expect: "string[]",
        ordered: "boolean",
        expectAttempts: "integer[]",
        expectAllOf: "object",
      });
      const conditions = ["started", "completed", "distinctPayloads"].filter((k) => step[k] !== undefined);
      if (conditions.length !== 1)
        throw new Error(
          `${where}: needs exactly one of started, completed, distinctPayloads (got ${conditions.length})`,
        );
      if (step.expectAllOf !== undefined)
        checkFields(`${where} expectAllOf`, step.expectAllOf, { "prefix!": "string", "count!": "integer" });
      break;
    }
    case "stopWorker":
      checkFields(where, step, {
        "do!": "string",
        "name!": "string",
        timeoutMs: "integer",
        expectStarted: "integer",
        expectCompleted: "integer",
      });
      break;
    case "crashWorker":
      checkFields(where, step, {
        "do!": "string",
        subscription: "string",
        "jobs!": "integer",
        expect: "string[]",
        timeoutMs: "integer",
      });
      break;
    case "stats":
      checkFields(where, step, {
        "do!": "string",
        subscription: "string",
        expect: "object",
        counters: "object",
        timeoutMs: "integer",
      });
      if (step.expect !== undefined) checkNumbers(`${where} expect`, step.expect, STATS_FIELDS);
      if (step.counters !== undefined) checkNumbers(`${where} counters`, step.counters, COUNTER_FIELDS);
      break;
    case "deadLetters":
      checkFields(where, step, { "do!": "string", subscription: "string", "expect!": "string[]" });
      break;
    case "redrive":
      checkFields(where, step, { "do!": "string", subscription: "string", "expect!": "integer" });
      break;
    default:
      throw new Error(`${where}: unknown do ${JSON.stringify(step.do)}`);
  }
  return step as unknown as ScenarioStep;
}

/** Parses a scenario document strictly (unknown fields and `do` values are errors). */
export function parseScenario(source: string, label = "scenario"): Scenario {
  const raw = checkFields(label, JSON.parse(source) as unknown, {
    "name!": "string",
    description: "string",
    brokers: "integer",
    queue: "object",
    subscriptions: "string[]",
    "steps!": "array",
  });
  const name = raw.name as string;
  const queue = checkFields(`scenario ${name}: queue`, raw.queue ?? {}, {
    shards: "integer",
    leaseTtlMs: "integer",
    maxAttempts: "integer",
    backoffMs: "integer",
  }) as ScenarioQueue;
  const brokers = (raw.brokers as number | undefined) ?? 1;
  if (brokers < 1) throw new Error(`scenario ${name}: brokers must be at least 1`);
  const steps = (raw.steps as unknown[]).map((s, i) => {
    const kind = typeOk(s, "object") ? String((s as Record<string, unknown>).do) : "?";
    const where = `scenario ${name}: step ${i} (${kind})`;
    const step = parseStep(where, s);
    // Broker indexes are checked here, where the broker count is known.
    const index =
      step.do === "restartBroker" ||
      step.do === "freezeBroker" ||
      step.do === "thawBroker" ||
      step.do === "awaitLeaseLapse"
        ? step.broker
        : step.do === "enqueue"
          ? step.via
          : undefined;
    if (index !== undefined && (index < 0 || index >= brokers))
      throw new Error(`${where}: broker index ${index} is not one of the ${brokers} brokers`);
    return step;
  });
  return {
    name,
    ...(raw.description === undefined ? {} : { description: raw.description as string }),
    brokers,
    queue,
    subscriptions: (raw.subscriptions as string[] | undefined) ?? [],
    steps,
  };
}

/** Reads and parses a scenario file. */
export function loadScenario(path: string): Scenario {
  return parseScenario(readFileSync(path, "utf8"), path);
}

// ---------------------------------------------------------------------------
// Running

/** One handler invocation, in the order handlers started. */
interface Invocation {
  readonly payload: string;
  readonly attempt: number;
}

/** A named worker of the scenario: its SDK worker, its run and what its handler saw. */
interface ScenarioWorker {
  readonly worker: Worker;
  readonly run: Promise<void>;
  readonly invocations: Invocation[];
  /** Failures the run reported without ending (the last few), for failure messages. */
  readonly errors: string[];
  started: number;
  completed: number;
  runError: unknown;
  runEnded: boolean;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Polls `check` every `intervalMs` until it is true; false when `timeoutMs` passed first. */
async function poll(
  check: () => boolean | Promise<boolean>,
  timeoutMs: number,
  intervalMs = 50,
): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() >= deadline) return false;
    await sleep(intervalMs);
  }
}

function multiset(values: readonly string[]): string {
  return JSON.stringify([...values].sort());
}

function fail(message: string): never {
  throw new Error(message);
}

function queueName(scenario: string): string {
  const suffix = randomBytes(4).toString("hex");
  const base = `ts-${scenario}`.toLowerCase().replace(/[^a-z0-9-]/g, "-");
  return `${base.slice(0, 100 - suffix.length - 1)}-${suffix}`;
}

/** Everything one scenario run owns; {@link ScenarioContext.close} releases it all. */
class ScenarioContext {
  readonly brokers: CasqServerProcess[] = [];
  readonly workers = new Map<string, ScenarioWorker>();
  readonly children = new Set<ChildProcess>();
  readonly dedupIds = new Map<string, string>();
  /** Indexes of the brokers frozen (SIGSTOP) and not thawed yet. */
  readonly frozen = new Set<number>();
  /** Producers of `enqueue.via`, by broker index: each knows only that broker. */
  private readonly viaProducers = new Map<number, Producer>();
  clientOptions!: ClientOptions;
  producer!: Producer;
  admin!: Admin;
  queue = "";

  private readonly store: { path: string; remove: () => void };

  constructor(readonly scenario: Scenario) {
    this.store = tempDir(`scenario-${scenario.name}`);
  }

  async start(): Promise<void> {
    for (let i = 0; i < this.scenario.brokers; i++) this.brokers.push(await this.startBroker());
    // The SDK's defaults: their retry budget must ride out a killed leader on its own.
    this.clientOptions = { brokers: this.brokers.map((b) => b.address) };
    this.producer = new Producer(this.clientOptions);
    this.admin = new Admin(this.clientOptions);
    this.queue = queueName(this.scenario.name);
    const q = this.scenario.queue;
    const backoff = durationFromMs(q.backoffMs ?? 100);
    await this.admin.createQueue(this.queue, {
      shardCount: q.shards ?? 1,
      config: {
        leaseTtl: durationFromMs(q.leaseTtlMs ?? 2000),
        ...(q.maxAttempts === undefined ? {} : { maxAttempts: q.maxAttempts }),
        backoff: { initialDelay: backoff, maxDelay: backoff, multiplier: 1, jitter: 0 },
      },
    });
    for (const subscription of this.scenario.subscriptions)
      if (subscription !== "default")
        await this.admin.createSubscription(this.queue, subscription, { start: "earliest" });
  }

  /** Starts one `casq serve` on the scenario's store (on `listen` when given: a restart keeps its address). */
  private startBroker(listen?: string): Promise<CasqServerProcess> {
    return startServer({
      store: `file:${this.store.path}`,
      ...(listen === undefined ? {} : { listen }),
      args: ["--leader-lease", "2s"],
    });
  }

  /** Stops what is still running, SIGKILLs every broker and child, removes the store. */
  async close(): Promise<void> {
    const stops = [...this.workers.values()].map((w) => w.worker.stop({ timeoutMs: 0 }).catch(() => {}));
    for (const child of this.children) child.kill("SIGKILL");
    for (const index of this.frozen) this.brokers[index]?.child.kill("SIGCONT");
    await Promise.all(this.brokers.map((b) => b.stop("SIGKILL")));
    // Runs end once their stop found no broker; do not wait forever on a stuck one.
    await Promise.race([Promise.all(stops), sleep(10_000)]);
    this.store.remove();
  }

  worker(name: string): ScenarioWorker {
    return this.workers.get(name) ?? fail(`no worker named ${JSON.stringify(name)}`);
  }

  async runStep(step: ScenarioStep): Promise<void> {
    switch (step.do) {
      case "enqueue":
        return this.enqueue(step);
      case "produce":
        return this.produce(step);
      case "restartBroker":
        return this.restartBroker(step);
      case "freezeBroker":
        return this.freezeBroker(step.broker, true);
      case "thawBroker":
        return this.freezeBroker(step.broker, false);
      case "awaitLeaseLapse":
        return this.awaitLeaseLapse(step);
      case "expectLeaders":
        return this.expectLeaders(step);
      case "startWorker":
        return this.startWorker(step);
      case "awaitWorker":
        return this.awaitWorker(step);
      case "stopWorker":
        return this.stopWorker(step);
      case "crashWorker":
        return this.crashWorker(step);
      case "stats":
        return this.stats(step);
      case "deadLetters":
        return this.deadLetters(step);
      case "redrive":
        return this.redrive(step);
    }
  }

  private checkDedup(message: ScenarioMessage, result: EnqueueResult, index: number): void {
    if (!result.id) fail(`result ${index} has no id`);
    if (message.dedupId === undefined) return;
    const known = this.dedupIds.get(message.dedupId);
    if (result.duplicate) {
      if (known !== result.id)
        fail(
          `result ${index} is a duplicate of ${message.dedupId} with id ${result.id}, stored was ${known}`,
        );
    } else if (known === undefined) this.dedupIds.set(message.dedupId, result.id);
  }

  private async enqueue(step: Extract<ScenarioStep, { do: "enqueue" }>): Promise<void> {
    const outgoing: OutgoingMessage[] = step.messages.map((m) => ({
      payload: m.payload,
      ...(m.key === undefined ? {} : { key: m.key }),
      ...(m.priority === undefined ? {} : { priority: m.priority }),
      ...(m.delayMs === undefined ? {} : { delayMs: m.delayMs }),
      ...(m.maxAttempts === undefined ? {} : { maxAttempts: m.maxAttempts }),
      ...(m.dedupId === undefined ? {} : { dedupId: m.dedupId }),
      ...(m.headers === undefined ? {} : { headers: m.headers }),
    }));
    const producer = step.via === undefined ? this.producer : this.viaProducer(step.via);
    const results: EnqueueResult[] = [];
    if (step.batch) results.push(...(await producer.enqueueBatch(this.queue, outgoing)));
    else
      for (const { payload, ...options } of outgoing)
        results.push(await producer.enqueue(this.queue, payload, options));
    if (results.length !== step.messages.length)
      fail(`got ${results.length} results for ${step.messages.length} messages`);
    for (const [i, r] of results.entries()) this.checkDedup(step.messages[i] as ScenarioMessage, r, i);
    if (step.expectDuplicate) {
      const got = results.map((r) => r.duplicate);
      if (JSON.stringify(got) !== JSON.stringify(step.expectDuplicate))
        fail(`duplicate flags ${JSON.stringify(got)}, expected ${JSON.stringify(step.expectDuplicate)}`);
    }
  }

  /** A producer whose client knows only broker `index` (it still follows redirects). */
  private viaProducer(index: number): Producer {
    let producer = this.viaProducers.get(index);
    if (!producer) {
      const broker = this.brokers[index] ?? fail(`no broker ${index}`);
      producer = new Producer({ brokers: [broker.address] });
      this.viaProducers.set(index, producer);
    }
    return producer;
  }

  private async restartBroker(step: Extract<ScenarioStep, { do: "restartBroker" }>): Promise<void> {
    const old = this.brokers[step.broker] ?? fail(`no broker ${step.broker}`);
    const exit = await old.stop("SIGTERM");
    if (exit.code !== 0)
      fail(
        `broker ${step.broker} (${old.address}) exited with code ${exit.code}, signal ${exit.signal} after SIGTERM; output:\n${old.output()}`,
      );
    const restarted = await this.startBroker(old.address);
    this.brokers[step.broker] = restarted;
    if (restarted.address !== old.address)
      fail(`broker ${step.broker} came back on ${restarted.address}, not on ${old.address}`);
  }

  /** SIGSTOP (`freeze`) or SIGCONT broker `index`: a frozen process keeps its connections open and answers nothing. */
  private freezeBroker(index: number, freeze: boolean): void {
    const broker = this.brokers[index] ?? fail(`no broker ${index}`);
    if (freeze === this.frozen.has(index)) fail(`broker ${index} is ${freeze ? "already" : "not"} frozen`);
    if (!broker.child.kill(freeze ? "SIGSTOP" : "SIGCONT")) fail(`could not signal broker ${index}`);
    if (freeze) this.frozen.add(index);
    else this.frozen.delete(index);
  }

  /** Waits until no shard names broker `step.broker` as its live leader, asking only brokers that are not frozen. */
  private async awaitLeaseLapse(step: Extract<ScenarioStep, { do: "awaitLeaseLapse" }>): Promise<void> {
    const address = (this.brokers[step.broker] ?? fail(`no broker ${step.broker}`)).address;
    const others = this.brokers.filter((_, i) => !this.frozen.has(i)).map((b) => b.address);
    if (others.length === 0) fail("every broker is frozen: none to ask");
    const admin = new Admin({ brokers: others, timeoutMs: 2_000 });
    const timeoutMs = step.timeoutMs ?? 20_000;
    let last = "no answer yet";
    const lapsed = await poll(
      async () => {
        try {
          const info = await admin.getQueue(this.queue);
          const now = Date.now();
          const held = info.shards.filter(
            (s) =>
              s.leader?.address === address &&
              s.leader.leaseUntil !== undefined &&
              timestampMs(s.leader.leaseUntil) > now,
          );
          last = `shards still led by ${address}: ${JSON.stringify(held.map((s) => s.shard))}`;
          return held.length === 0;
        } catch (error) {
          last = String(error);
          return false;
        }
      },
      timeoutMs,
      100,
    );
    if (!lapsed) fail(`the leases of broker ${step.broker} did not lapse within ${timeoutMs} ms: ${last}`);
  }

  private async expectLeaders(step: Extract<ScenarioStep, { do: "expectLeaders" }>): Promise<void> {
    const info = await this.admin.getQueue(this.queue);
    const now = Date.now();
    const leaders = info.shards.flatMap((s) => {
      const leader = s.leader;
      if (!leader?.address) return [];
      // A lease in the past (e.g. released by a graceful stop) is no live leader.
      if (leader.leaseUntil && timestampMs(leader.leaseUntil) <= now) return [];
      return [leader.address];
    });
    const distinct = new Set(leaders);
    if (distinct.size !== step.distinct)
      fail(
        `shards are led by ${distinct.size} distinct brokers (${JSON.stringify(info.shards.map((s) => ({ shard: s.shard, leader: s.leader?.address ?? null })))}), expected ${step.distinct}`,
      );
  }

  private async produce(step: Extract<ScenarioStep, { do: "produce" }>): Promise<void> {
    for (let i = 0; i < step.count; i++) {
      const payload = `${step.prefix}${i}`;
      let result: EnqueueResult;
      try {
        result = await this.producer.enqueue(this.queue, payload, { dedupId: payload });
      } catch (error) {
        throw new Error(`enqueue of ${payload} failed: ${String(error)}`, { cause: error });
      }
      if (!result.id) fail(`enqueue of ${payload} returned no id`);
      if (i + 1 === step.killLeaderAfter) await this.killLeader();
    }
  }

  private async killLeader(): Promise<void> {
    const info = await this.admin.getQueue(this.queue);
    const address = info.shards[0]?.leader?.address ?? fail("GetQueue names no leader of shard 0");
    const broker =
      this.brokers.find((b) => b.address === address) ??
      fail(`leader ${address} is none of the brokers ${this.brokers.map((b) => b.address).join(", ")}`);
    await broker.stop("SIGKILL");
  }

  private startWorker(step: Extract<ScenarioStep, { do: "startWorker" }>): void {
    if (this.workers.has(step.name)) fail(`worker ${step.name} already exists`);
    const worker = new Worker({ ...this.clientOptions, workerId: `scenario-${step.name}` });
    const invocations: Invocation[] = [];
    const concurrency = step.concurrency ?? 1;
    const state: Omit<ScenarioWorker, "run"> & { run?: Promise<void> } = {
      worker,
      invocations,
      errors: [],
      started: 0,
      completed: 0,
      runError: undefined,
      runEnded: false,
    };
    const handler = async (job: Job): Promise<void> => {
      invocations.push({ payload: job.text(), attempt: job.attempt });
      state.started++;
      try {
        if ((step.handlerMs ?? 0) > 0) await sleep(step.handlerMs ?? 0);
        if (step.handler === "nack") throw new Error("scenario handler: nack");
        if (step.handler === "deadLetter") throw new DeadLetterError("scenario handler: dead letter");
      } finally {
        state.completed++;
      }
    };
    const run = worker.run(this.queue, handler, {
      subscription: step.subscription ?? "default",
      concurrency,
      prefetch: step.prefetch ?? concurrency,
      ...(step.leaseTtlMs === undefined ? {} : { leaseTtlMs: step.leaseTtlMs }),
      onError: (error) => {
        // Handler failures are what the nack / deadLetter handlers are for; keep the rest.
        if (error instanceof Error && error.message.startsWith("scenario handler:")) return;
        state.errors.push(String(error));
        if (state.errors.length > 5) state.errors.shift();
      },
    });
    const entry = state as ScenarioWorker;
    (entry as { run: Promise<void> }).run = run.then(
      () => {
        entry.runEnded = true;
      },
      (error: unknown) => {
        entry.runEnded = true;
        entry.runError = error ?? new Error("run rejected");
      },
    );
    this.workers.set(step.name, entry);
  }

  private async awaitWorker(step: Extract<ScenarioStep, { do: "awaitWorker" }>): Promise<void> {
    const w = this.worker(step.name);
    const [what, target] =
      step.started !== undefined
        ? (["started", step.started] as const)
        : step.completed !== undefined
          ? (["completed", step.completed] as const)
          : (["distinctPayloads", step.distinctPayloads as number] as const);
    const value = () =>
      what === "started"
        ? w.started
        : what === "completed"
          ? w.completed
          : new Set(w.invocations.map((i) => i.payload)).size;
    const timeoutMs = step.timeoutMs ?? 30_000;
    const reached = await poll(() => value() >= target || w.runEnded, timeoutMs);
    if (w.runEnded && value() < target)
      fail(`worker run ended early: ${String(w.runError ?? "without an error")}`);
    if (!reached)
      fail(
        `${what} reached ${value()} of ${target} within ${timeoutMs} ms; invocations: ${JSON.stringify(w.invocations)}; worker errors: ${JSON.stringify(w.errors)}`,
      );
    if (step.expect) {
      const got = w.invocations.slice(0, step.expect.length).map((i) => i.payload);
      const same =
        step.ordered === true
          ? JSON.stringify(got) === JSON.stringify(step.expect)
          : multiset(got) === multiset(step.expect);
      if (!same)
        fail(
          `payloads ${JSON.stringify(got)}, expected ${JSON.stringify(step.expect)}${step.ordered ? " in order" : " (any order)"}`,
        );
    }
    if (step.expectAttempts) {
      const got = w.invocations.slice(0, step.expectAttempts.length).map((i) => i.attempt);
      if (JSON.stringify(got) !== JSON.stringify(step.expectAttempts))
        fail(`attempts ${JSON.stringify(got)}, expected ${JSON.stringify(step.expectAttempts)}`);
    }
    if (step.expectAllOf) {
      const seen = new Set(w.invocations.map((i) => i.payload));
      const missing: string[] = [];
      for (let i = 0; i < step.expectAllOf.count; i++)
        if (!seen.has(`${step.expectAllOf.prefix}${i}`)) missing.push(`${step.expectAllOf.prefix}${i}`);
      if (missing.length > 0) fail(`payloads never seen: ${missing.join(", ")}`);
    }
  }

  private async stopWorker(step: Extract<ScenarioStep, { do: "stopWorker" }>): Promise<void> {
    const w = this.worker(step.name);
    await w.worker.stop({ timeoutMs: step.timeoutMs ?? 10_000 });
    await w.run;
    if (w.runError !== undefined) fail(`worker run ended with an error: ${String(w.runError)}`);
    if (step.expectStarted !== undefined && w.started !== step.expectStarted)
      fail(`started ${w.started}, expected ${step.expectStarted}`);
    if (step.expectCompleted !== undefined && w.completed !== step.expectCompleted)
      fail(`completed ${w.completed}, expected ${step.expectCompleted}`);
  }

  private async crashWorker(step: Extract<ScenarioStep, { do: "crashWorker" }>): Promise<void> {
    const config = {
      brokers: this.clientOptions.brokers,
      queue: this.queue,
      subscription: step.subscription ?? "default",
      jobs: step.jobs,
    };
    const worker = spawnProgram(process.execPath, [
      "--import",
      "tsx",
      join(ROOT, "test/sdk-ts/scenario-crash-worker.ts"),
      JSON.stringify(config),
    ]);
    const { child } = worker;
    this.children.add(child);
    let exited = false;
    const exit = worker.exited.then(() => {
      exited = true;
    });
    const startedPayloads = () =>
      worker
        .stdout()
        .split("\n")
        .filter((line) => line.startsWith("STARTED "))
        .map((line) => line.slice("STARTED ".length));
    const timeoutMs = step.timeoutMs ?? 30_000;
    const reached = await poll(() => startedPayloads().length >= step.jobs || exited, timeoutMs);
    child.kill("SIGKILL");
    await exit;
    this.children.delete(child);
    const seen = startedPayloads();
    if (seen.length < step.jobs)
      fail(
        `${reached ? "child exited" : `timed out after ${timeoutMs} ms`} with ${seen.length} of ${step.jobs} jobs started; stdout:\n${worker.stdout()}\nstderr:\n${worker.stderr()}`,
      );
    if (step.expect && multiset(seen) !== multiset(step.expect))
      fail(`child started ${JSON.stringify(seen)}, expected ${JSON.stringify(step.expect)} (any order)`);
  }

  private async stats(step: Extract<ScenarioStep, { do: "stats" }>): Promise<void> {
    const subscription = step.subscription ?? "default";
    const timeoutMs = step.timeoutMs ?? 10_000;
    let last: Record<string, unknown> = {};
    const matches = async (): Promise<boolean> => {
      const info = await this.admin.getQueue(this.queue);
      const entry: SubscriptionStats | undefined = info.subscriptions.find(
        (s) => s.subscription === subscription,
      );
      if (!entry) {
        last = { error: `no subscription ${subscription}` };
        return false;
      }
      const stats: Record<string, number> = {};
      const counters: Record<string, number> = {};
      let ok = true;
      for (const [field, want] of Object.entries(step.expect ?? {})) {
        stats[field] = Number(entry[field as keyof SubscriptionStats] as bigint);
        if (stats[field] !== want) ok = false;
      }
      for (const [field, want] of Object.entries(step.counters ?? {})) {
        const got = entry.counters?.[field as keyof NonNullable<SubscriptionStats["counters"]>];
        counters[field] = Number(got as bigint | undefined);
        if (counters[field] !== want) ok = false;
      }
      last = { expect: stats, counters };
      return ok;
    };
    if (!(await poll(matches, timeoutMs, 100)))
      fail(
        `stats of ${subscription} not reached within ${timeoutMs} ms: last ${JSON.stringify(last)}, wanted ${JSON.stringify({ expect: step.expect ?? {}, counters: step.counters ?? {} })}`,
      );
  }

  private async deadLetters(step: Extract<ScenarioStep, { do: "deadLetters" }>): Promise<void> {
    const decoder = new TextDecoder();
    const dead = await this.admin.listDeadLetters(this.queue, {
      subscription: step.subscription ?? "default",
    });
    const got = dead.map((d) => decoder.decode(d.message?.payload ?? new Uint8Array()));
    if (multiset(got) !== multiset(step.expect))
      fail(`dead letters ${JSON.stringify(got)}, expected ${JSON.stringify(step.expect)} (any order)`);
  }

  private async redrive(step: Extract<ScenarioStep, { do: "redrive" }>): Promise<void> {
    const { redriven } = await this.admin.redrive(this.queue, {
      subscription: step.subscription ?? "default",
    });
    if (Number(redriven) !== step.expect) fail(`redriven ${redriven}, expected ${step.expect}`);
  }
}

/**
 * Runs one scenario end to end. Throws an error naming the scenario, the step
 * index and its `do` when a step fails; brokers are SIGKILLed and the store
 * removed whatever happens.
 */
export async function runScenario(scenario: Scenario): Promise<void> {
  const ctx = new ScenarioContext(scenario);
  try {
    try {
      await ctx.start();
    } catch (error) {
      throw new Error(`scenario ${scenario.name}: setup failed: ${String(error)}`, { cause: error });
    }
    for (const [index, step] of scenario.steps.entries()) {
      try {
        await ctx.runStep(step);
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        throw new Error(`scenario ${scenario.name}: step ${index} (${step.do}) failed: ${message}`, {
          cause: error,
        });
      }
    }
  } finally {
    await ctx.close();
  }
}
