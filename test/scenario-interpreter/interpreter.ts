/**
 * The scenario interpreter: runs one scenario of test/scenarios (spec in its
 * README) against one SDK. It owns everything but the SDK calls: it starts
 * the scenario's `casq serve` brokers on a fresh file store, kills, freezes
 * and restarts them, and checks every expectation; the SDK calls (enqueue,
 * workers, admin) go to a {@link ClientUnderTest} of that SDK's language.
 * So a step kind and its matching rules are written once, here.
 */
import { randomBytes } from "node:crypto";
import { Admin } from "@casq/sdk";
import { type CasqServerProcess, startServer, tempDir } from "../e2e/support/processes.ts";
import { ClientUnderTest, type Lang } from "./client-under-test.ts";
import type { Scenario, ScenarioMessage, ScenarioStep, StepKind, StepOf } from "./scenario-file.ts";

/** One handler invocation, in the order handlers started. */
interface Invocation {
  readonly payload: string;
  readonly attempt: number;
}

/** A worker's state as its client reports it (`workerState`, `stopWorker`). */
interface WorkerState {
  readonly started: number;
  readonly completed: number;
  readonly invocations: Invocation[];
  readonly ended: boolean;
  readonly error?: string;
  readonly errors: string[];
}

/** The parts of a `GetQueueResponse` in proto3 JSON that the steps read (zero fields are absent). */
interface QueueJson {
  readonly shards?: { shard?: number; leader?: { address?: string; leaseUntil?: string } }[];
  readonly subscriptions?: (Record<string, unknown> & {
    subscription?: string;
    counters?: Record<string, unknown>;
  })[];
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

/** A proto3 JSON integer (uint64 comes as a string, zero is absent). */
function count(value: unknown): number {
  return value === undefined ? 0 : Number(value);
}

/** Whether a shard's leader holds a lease that has not run out. */
function liveLeader(leader: { address?: string; leaseUntil?: string } | undefined, now: number): boolean {
  return !!leader?.address && leader.leaseUntil !== undefined && Date.parse(leader.leaseUntil) > now;
}

function queueName(lang: Lang, scenario: string): string {
  const suffix = randomBytes(4).toString("hex");
  const base = `${lang === "python" ? "py" : lang}-${scenario}`.toLowerCase().replace(/[^a-z0-9-]/g, "-");
  return `${base.slice(0, 100 - suffix.length - 1)}-${suffix}`;
}

/** Everything one scenario run owns; {@link ScenarioContext.close} releases it all. */
class ScenarioContext {
  readonly brokers: CasqServerProcess[] = [];
  readonly workers = new Set<string>();
  readonly dedupIds = new Map<string, string>();
  /** Indexes of the brokers frozen (SIGSTOP) and not thawed yet. */
  readonly frozen = new Set<number>();
  /** Clients besides the main one (crashWorker's), killed at the end. */
  readonly extraClients = new Set<ClientUnderTest>();
  /** The grace period of each worker: its stopWorker's (Go's Run takes it at the start). */
  readonly graces = new Map<string, number>();
  client!: ClientUnderTest;
  queue = "";

  private readonly store: { path: string; remove: () => void };

  constructor(
    readonly scenario: Scenario,
    readonly lang: Lang,
  ) {
    this.store = tempDir(`scenario-${lang}-${scenario.name}`);
    for (const step of scenario.steps)
      if (step.do === "stopWorker") this.graces.set(step.name, step.timeoutMs);
  }

  async start(): Promise<void> {
    for (let i = 0; i < this.scenario.brokers; i++) this.brokers.push(await this.startBroker());
    this.client = new ClientUnderTest(
      this.lang,
      this.brokers.map((b) => b.address),
    );
    this.queue = queueName(this.lang, this.scenario.name);
    const q = this.scenario.queue;
    await this.client.call("createQueue", {
      queue: this.queue,
      shards: q.shards,
      leaseTtlMs: q.leaseTtlMs,
      backoffMs: q.backoffMs,
      ...(q.maxAttempts === undefined ? {} : { maxAttempts: q.maxAttempts }),
    });
    for (const subscription of this.scenario.subscriptions)
      if (subscription !== "default")
        await this.client.call("createSubscription", { queue: this.queue, subscription });
  }

  /** Starts one `casq serve` on the scenario's store (on `listen` when given: a restart keeps its address). */
  private startBroker(listen?: string): Promise<CasqServerProcess> {
    return startServer({
      store: `file:${this.store.path}`,
      ...(listen === undefined ? {} : { listen }),
      args: ["--leader-lease", "2s"],
    });
  }

  /** Ends the clients, SIGKILLs every broker, removes the store. */
  async close(): Promise<void> {
    for (const c of this.extraClients) c.child.kill("SIGKILL");
    for (const index of this.frozen) this.brokers[index]?.child.kill("SIGCONT");
    await Promise.all(this.brokers.map((b) => b.stop("SIGKILL")));
    await this.client?.close();
    this.store.remove();
  }

  /** Failure context: what the client printed. */
  clientOutput(): string {
    return this.client ? `\n${this.lang} client stderr:\n${this.client.output()}` : "";
  }

  async runStep(step: ScenarioStep): Promise<void> {
    // The table is keyed by kind, so this entry takes this step (TypeScript cannot see it by itself).
    const run = STEP_RUNNERS[step.do] as (ctx: ScenarioContext, s: ScenarioStep) => Promise<void>;
    await run(this, step);
  }

  getQueue(): Promise<QueueJson> {
    return this.client.call<QueueJson>("getQueue", { queue: this.queue });
  }

  private checkDedup(message: ScenarioMessage, result: { id: string; duplicate: boolean }, index: number) {
    if (!result.id) fail(`result ${index} has no id`);
    if (message.dedupId === undefined) {
      if (result.duplicate) fail(`result ${index} is a duplicate, but its message has no dedupId`);
      return;
    }
    const known = this.dedupIds.get(message.dedupId);
    if (result.duplicate) {
      if (known !== result.id)
        fail(
          `result ${index} is a duplicate of ${message.dedupId} with id ${result.id}, stored was ${known}`,
        );
    } else if (known === undefined) this.dedupIds.set(message.dedupId, result.id);
  }

  async enqueue(step: StepOf<"enqueue">): Promise<void> {
    const via =
      step.via === undefined ? {} : { brokers: [(this.brokers[step.via] ?? fail("no broker")).address] };
    const { results } = await this.client.call<{ results: { id: string; duplicate: boolean }[] }>("enqueue", {
      queue: this.queue,
      batch: step.batch,
      messages: step.messages,
      ...via,
    });
    if (results.length !== step.messages.length)
      fail(`got ${results.length} results for ${step.messages.length} messages`);
    for (const [i, r] of results.entries()) this.checkDedup(step.messages[i] as ScenarioMessage, r, i);
    if (step.expectDuplicate) {
      const got = results.map((r) => r.duplicate);
      if (JSON.stringify(got) !== JSON.stringify(step.expectDuplicate))
        fail(`duplicate flags ${JSON.stringify(got)}, expected ${JSON.stringify(step.expectDuplicate)}`);
    }
  }

  async produce(step: StepOf<"produce">): Promise<void> {
    for (let i = 0; i < step.count; i++) {
      const payload = `${step.prefix}${i}`;
      const { results } = await this.client
        .call<{ results: { id: string }[] }>("enqueue", {
          queue: this.queue,
          batch: false,
          messages: [{ payload, dedupId: payload }],
        })
        .catch((error: unknown) => fail(`enqueue of ${payload} failed: ${String(error)}`));
      if (!results[0]?.id) fail(`enqueue of ${payload} returned no id`);
      if (i + 1 === step.killLeaderAfter) await this.killLeader();
    }
  }

  private async killLeader(): Promise<void> {
    const info = await this.getQueue();
    const address = info.shards?.[0]?.leader?.address ?? fail("GetQueue names no leader of shard 0");
    const broker =
      this.brokers.find((b) => b.address === address) ??
      fail(`leader ${address} is none of the brokers ${this.brokers.map((b) => b.address).join(", ")}`);
    await broker.stop("SIGKILL");
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
  async freezeBroker(index: number, freeze: boolean): Promise<void> {
    const broker = this.brokers[index] ?? fail(`no broker ${index}`);
    if (freeze === this.frozen.has(index)) fail(`broker ${index} is ${freeze ? "already" : "not"} frozen`);
    if (!broker.child.kill(freeze ? "SIGSTOP" : "SIGCONT")) fail(`could not signal broker ${index}`);
    if (freeze) this.frozen.add(index);
    else this.frozen.delete(index);
  }

  /**
   * Waits until no shard names broker `step.broker` as its live leader. The
   * interpreter's own TypeScript admin client asks, and only the brokers not
   * frozen: this is the harness watching, not the SDK under test.
   */
  async awaitLeaseLapse(step: StepOf<"awaitLeaseLapse">): Promise<void> {
    const address = (this.brokers[step.broker] ?? fail(`no broker ${step.broker}`)).address;
    const others = this.brokers.filter((_, i) => !this.frozen.has(i)).map((b) => b.address);
    if (others.length === 0) fail("every broker is frozen: none to ask");
    const admin = new Admin({ brokers: others, timeoutMs: 2_000 });
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
              Number(s.leader.leaseUntil.seconds) * 1000 + s.leader.leaseUntil.nanos / 1e6 > now,
          );
          last = `shards still led by ${address}: ${JSON.stringify(held.map((s) => s.shard))}`;
          return held.length === 0;
        } catch (error) {
          last = String(error);
          return false;
        }
      },
      step.timeoutMs,
      100,
    );
    if (!lapsed)
      fail(`the leases of broker ${step.broker} did not lapse within ${step.timeoutMs} ms: ${last}`);
  }

  async expectLeaders(step: StepOf<"expectLeaders">): Promise<void> {
    const info = await this.getQueue();
    const now = Date.now();
    const shards = info.shards ?? [];
    const distinct = new Set(shards.filter((s) => liveLeader(s.leader, now)).map((s) => s.leader?.address));
    if (distinct.size !== step.distinct)
      fail(
        `shards are led by ${distinct.size} distinct brokers (${JSON.stringify(shards.map((s) => ({ shard: s.shard ?? 0, leader: s.leader ?? null })))}), expected ${step.distinct}`,
      );
  }

  async startWorker(step: StepOf<"startWorker">): Promise<void> {
    if (this.workers.has(step.name)) fail(`worker ${step.name} already exists`);
    await this.client.call("startWorker", {
      name: step.name,
      queue: this.queue,
      subscription: step.subscription,
      concurrency: step.concurrency,
      prefetch: step.prefetch ?? step.concurrency,
      handler: step.handler,
      handlerMs: step.handlerMs,
      graceMs: this.graces.get(step.name) ?? 0,
      ...(step.leaseTtlMs === undefined ? {} : { leaseTtlMs: step.leaseTtlMs }),
    });
    this.workers.add(step.name);
  }

  private workerState(client: ClientUnderTest, name: string): Promise<WorkerState> {
    return client.call<WorkerState>("workerState", { name });
  }

  async awaitWorker(step: StepOf<"awaitWorker">): Promise<void> {
    if (!this.workers.has(step.name)) fail(`no worker named ${JSON.stringify(step.name)}`);
    const [what, target] =
      step.started !== undefined
        ? (["started", step.started] as const)
        : step.completed !== undefined
          ? (["completed", step.completed] as const)
          : (["distinctPayloads", step.distinctPayloads as number] as const);
    const value = (w: WorkerState) =>
      what === "started"
        ? w.started
        : what === "completed"
          ? w.completed
          : new Set(w.invocations.map((i) => i.payload)).size;
    let w = await this.workerState(this.client, step.name);
    const reached = await poll(async () => {
      w = await this.workerState(this.client, step.name);
      return value(w) >= target || w.ended;
    }, step.timeoutMs);
    if (w.ended && value(w) < target) fail(`worker run ended early: ${w.error ?? "without an error"}`);
    if (!reached)
      fail(
        `${what} reached ${value(w)} of ${target} within ${step.timeoutMs} ms; invocations: ${JSON.stringify(w.invocations)}; worker errors: ${JSON.stringify(w.errors)}`,
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
    if (!this.workers.has(step.name)) fail(`no worker named ${JSON.stringify(step.name)}`);
    const w = await this.client.call<WorkerState>("stopWorker", { name: step.name });
    if (w.error !== undefined) fail(`worker run ended with an error: ${w.error}`);
    if (step.expectStarted !== undefined && w.started !== step.expectStarted)
      fail(`started ${w.started}, expected ${step.expectStarted}`);
    if (step.expectCompleted !== undefined && w.completed !== step.expectCompleted)
      fail(`completed ${w.completed}, expected ${step.expectCompleted}`);
  }

  /** A second client process whose handlers never return, SIGKILLed once `jobs` of them started. */
  async crashWorker(step: StepOf<"crashWorker">): Promise<void> {
    const crash = new ClientUnderTest(
      this.lang,
      this.brokers.map((b) => b.address),
    );
    this.extraClients.add(crash);
    try {
      await crash.call("startWorker", {
        name: "crash",
        queue: this.queue,
        subscription: step.subscription,
        concurrency: step.jobs,
        prefetch: step.jobs,
        handler: "hang",
        handlerMs: 0,
        graceMs: 0,
      });
      let w = await this.workerState(crash, "crash");
      const reached = await poll(async () => {
        w = await this.workerState(crash, "crash");
        return w.started >= step.jobs || w.ended;
      }, step.timeoutMs);
      if (w.started < step.jobs)
        fail(
          `${reached ? `run ended (${w.error ?? "no error"})` : `timed out after ${step.timeoutMs} ms`} with ${w.started} of ${step.jobs} jobs started; worker errors ${JSON.stringify(w.errors)}; stderr:\n${crash.output()}`,
        );
      const seen = w.invocations.map((i) => i.payload);
      if (multiset(seen) !== multiset(step.expect))
        fail(`child started ${JSON.stringify(seen)}, expected ${JSON.stringify(step.expect)} (any order)`);
    } finally {
      crash.child.kill("SIGKILL");
      await crash.exited;
      this.extraClients.delete(crash);
    }
  }

  async stats(step: StepOf<"stats">): Promise<void> {
    let last: Record<string, unknown> = {};
    const matches = async (): Promise<boolean> => {
      const info = await this.getQueue();
      const entry = info.subscriptions?.find((s) => (s.subscription ?? "") === step.subscription);
      if (!entry) {
        last = { error: `no subscription ${step.subscription}` };
        return false;
      }
      const stats: Record<string, number> = {};
      const counters: Record<string, number> = {};
      let ok = true;
      for (const [field, want] of Object.entries(step.expect ?? {})) {
        stats[field] = count(entry[field]);
        if (stats[field] !== want) ok = false;
      }
      for (const [field, want] of Object.entries(step.counters ?? {})) {
        counters[field] = count(entry.counters?.[field]);
        if (counters[field] !== want) ok = false;
      }
      last = { expect: stats, counters };
      return ok;
    };
    if (!(await poll(matches, step.timeoutMs, 100)))
      fail(
        `stats of ${step.subscription} not reached within ${step.timeoutMs} ms: last ${JSON.stringify(last)}, wanted ${JSON.stringify({ expect: step.expect ?? {}, counters: step.counters ?? {} })}`,
      );
  }

  async deadLetters(step: StepOf<"deadLetters">): Promise<void> {
    const { payloads } = await this.client.call<{ payloads: string[] }>("listDeadLetters", {
      queue: this.queue,
      subscription: step.subscription,
    });
    if (multiset(payloads) !== multiset(step.expect))
      fail(`dead letters ${JSON.stringify(payloads)}, expected ${JSON.stringify(step.expect)} (any order)`);
  }

  async redrive(step: StepOf<"redrive">): Promise<void> {
    const { redriven } = await this.client.call<{ redriven: number }>("redrive", {
      queue: this.queue,
      subscription: step.subscription,
    });
    if (redriven !== step.expect) fail(`redriven ${redriven}, expected ${step.expect}`);
  }
}

/**
 * How each step kind runs: one entry per kind of the {@link ScenarioStep}
 * union (the type checker enforces it), and the drift test compares these
 * keys with the schema's step kinds.
 */
export const STEP_RUNNERS: {
  readonly [K in StepKind]: (ctx: ScenarioContext, step: StepOf<K>) => Promise<void>;
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
 * Runs one scenario end to end with the SDK of `lang`. Throws an error naming
 * the scenario, the language, the step index and its `do` when a step fails;
 * brokers are SIGKILLed and the store removed whatever happens.
 */
export async function interpretScenario(scenario: Scenario, lang: Lang): Promise<void> {
  const ctx = new ScenarioContext(scenario, lang);
  try {
    try {
      await ctx.start();
    } catch (error) {
      throw new Error(
        `scenario ${scenario.name} (${lang}): setup failed: ${String(error)}${ctx.clientOutput()}`,
        {
          cause: error,
        },
      );
    }
    for (const [index, step] of scenario.steps.entries()) {
      try {
        await ctx.runStep(step);
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        throw new Error(
          `scenario ${scenario.name} (${lang}): step ${index} (${step.do}) failed: ${message}${ctx.clientOutput()}`,
          { cause: error },
        );
      }
    }
  } finally {
    await ctx.close();
  }
}
