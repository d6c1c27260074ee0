/**
 * The TypeScript interpreter of the language-neutral SDK scenarios in
 * test/scenarios (spec: test/scenarios/README.md): given a scenario loaded
 * by scenario-file.ts, starts its `casq serve` brokers on a fresh file store,
 * creates its queue through {@link Admin}, runs its steps with the TypeScript
 * SDK, and always kills the brokers and removes the store afterwards.
 */
import type { ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
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
import type { Scenario, ScenarioMessage, ScenarioStep, StepKind, StepOf } from "./scenario-file.ts";

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
    const backoff = durationFromMs(q.backoffMs);
    await this.admin.createQueue(this.queue, {
      shardCount: q.shards,
      config: {
        leaseTtl: durationFromMs(q.leaseTtlMs),
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

  /** Runs one step with the method of its kind. */
  async runStep(step: ScenarioStep): Promise<void> {
    // The table is keyed by kind, so this entry takes this step (TypeScript cannot see it by itself).
    const run = STEP_RUNNERS[step.do] as (ctx: ScenarioContext, s: ScenarioStep) => void | Promise<void>;
    await run(this, step);
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

  async enqueue(step: StepOf<"enqueue">): Promise<void> {
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

  async restartBroker(step: StepOf<"restartBroker">): Promise<void> {
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
  freezeBroker(index: number, freeze: boolean): void {
    const broker = this.brokers[index] ?? fail(`no broker ${index}`);
    if (freeze === this.frozen.has(index)) fail(`broker ${index} is ${freeze ? "already" : "not"} frozen`);
    if (!broker.child.kill(freeze ? "SIGSTOP" : "SIGCONT")) fail(`could not signal broker ${index}`);
    if (freeze) this.frozen.add(index);
    else this.frozen.delete(index);
  }

  /** Waits until no shard names broker `step.broker` as its live leader, asking only brokers that are not frozen. */
  async awaitLeaseLapse(step: StepOf<"awaitLeaseLapse">): Promise<void> {
    const address = (this.brokers[step.broker] ?? fail(`no broker ${step.broker}`)).address;
    const others = this.brokers.filter((_, i) => !this.frozen.has(i)).map((b) => b.address);
    if (others.length === 0) fail("every broker is frozen: none to ask");
    const admin = new Admin({ brokers: others, timeoutMs: 2_000 });
    const { timeoutMs } = step;
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

  async expectLeaders(step: StepOf<"expectLeaders">): Promise<void> {
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

  async produce(step: StepOf<"produce">): Promise<void> {
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

  startWorker(step: StepOf<"startWorker">): void {
    if (this.workers.has(step.name)) fail(`worker ${step.name} already exists`);
    const worker = new Worker({ ...this.clientOptions, workerId: `scenario-${step.name}` });
    const invocations: Invocation[] = [];
    const { concurrency } = step;
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
        if (step.handlerMs > 0) await sleep(step.handlerMs);
        if (step.handler === "nack") throw new Error("scenario handler: nack");
        if (step.handler === "deadLetter") throw new DeadLetterError("scenario handler: dead letter");
      } finally {
        state.completed++;
      }
    };
    const run = worker.run(this.queue, handler, {
      subscription: step.subscription,
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

  async awaitWorker(step: StepOf<"awaitWorker">): Promise<void> {
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
    const { timeoutMs } = step;
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

  async stopWorker(step: StepOf<"stopWorker">): Promise<void> {
    const w = this.worker(step.name);
    await w.worker.stop({ timeoutMs: step.timeoutMs });
    await w.run;
    if (w.runError !== undefined) fail(`worker run ended with an error: ${String(w.runError)}`);
    if (step.expectStarted !== undefined && w.started !== step.expectStarted)
      fail(`started ${w.started}, expected ${step.expectStarted}`);
    if (step.expectCompleted !== undefined && w.completed !== step.expectCompleted)
      fail(`completed ${w.completed}, expected ${step.expectCompleted}`);
  }

  async crashWorker(step: StepOf<"crashWorker">): Promise<void> {
    const config = {
      brokers: this.clientOptions.brokers,
      queue: this.queue,
      subscription: step.subscription,
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
    const { timeoutMs } = step;
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

  async stats(step: StepOf<"stats">): Promise<void> {
    const { subscription, timeoutMs } = step;
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

  async deadLetters(step: StepOf<"deadLetters">): Promise<void> {
    const decoder = new TextDecoder();
    const dead = await this.admin.listDeadLetters(this.queue, {
      subscription: step.subscription,
    });
    const got = dead.map((d) => decoder.decode(d.message?.payload ?? new Uint8Array()));
    if (multiset(got) !== multiset(step.expect))
      fail(`dead letters ${JSON.stringify(got)}, expected ${JSON.stringify(step.expect)} (any order)`);
  }

  async redrive(step: StepOf<"redrive">): Promise<void> {
    const { redriven } = await this.admin.redrive(this.queue, {
      subscription: step.subscription,
    });
    if (Number(redriven) !== step.expect) fail(`redriven ${redriven}, expected ${step.expect}`);
  }
}

/**
 * How each step kind runs: one entry per kind of the {@link ScenarioStep}
 * union (the type checker enforces it), and the drift test compares these
 * keys with the schema's step kinds.
 */
export const STEP_RUNNERS: {
  readonly [K in StepKind]: (ctx: ScenarioContext, step: StepOf<K>) => void | Promise<void>;
} = {
  enqueue: (ctx, step) => ctx.enqueue(step),
  produce: (ctx, step) => ctx.produce(step),
  restartBroker: (ctx, step) => ctx.restartBroker(step),
  freezeBroker: (ctx, step) => ctx.freezeBroker(step.broker, true),
  thawBroker: (ctx, step) => ctx.freezeBroker(step.broker, false),
  awaitLeaseLapse: (ctx, step) => ctx.awaitLeaseLapse(step),
  expectLeaders: (ctx, step) => ctx.expectLeaders(step),
  startWorker: (ctx, step) => ctx.startWorker(step),
  awaitWorker: (ctx, step) => ctx.awaitWorker(step),
  stopWorker: (ctx, step) => ctx.stopWorker(step),
  crashWorker: (ctx, step) => ctx.crashWorker(step),
  stats: (ctx, step) => ctx.stats(step),
  deadLetters: (ctx, step) => ctx.deadLetters(step),
  redrive: (ctx, step) => ctx.redrive(step),
};

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
