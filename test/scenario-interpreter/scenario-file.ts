/**
 * Scenario files (test/scenarios/*.json) for the scenario interpreter: their
 * types, and loading, which validates each file against
 * test/scenarios/scenario.schema.json with ajv and then checks what a schema
 * cannot say (fields that depend on one another).
 */
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Ajv2020, type ErrorObject } from "ajv/dist/2020.js";
import { ROOT } from "../e2e/support/processes.ts";

/** The folder of the scenario files and their schema. */
export const SCENARIO_DIR = join(ROOT, "test", "scenarios");

/** The JSON Schema every scenario file must satisfy. */
export const SCHEMA_PATH = join(SCENARIO_DIR, "scenario.schema.json");

const schema = JSON.parse(readFileSync(SCHEMA_PATH, "utf8")) as {
  $defs: { step: { properties: { do: { enum: string[] } } } };
};

/** The step kinds (`do` values) the schema allows. */
export const SCHEMA_STEP_KINDS: readonly string[] = schema.$defs.step.properties.do.enum;

// strictRequired off: `oneOf: [{required: [a]}, ...]` names properties defined beside it.
// useDefaults: validation fills in each absent property that has a `default` in the schema.
const validate = new Ajv2020({
  allErrors: true,
  strict: true,
  strictRequired: false,
  useDefaults: true,
}).compile(schema);

/** The scenario files, sorted (every `*.json` of the folder but the schema). */
export function scenarioFiles(): string[] {
  return readdirSync(SCENARIO_DIR)
    .filter((f) => f.endsWith(".json") && !f.endsWith(".schema.json"))
    .sort();
}

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
  readonly shards: number;
  readonly leaseTtlMs: number;
  readonly maxAttempts?: number;
  readonly backoffMs: number;
}

/**
 * A step as the schema allows it, with the schema's defaults filled in (so a
 * field with a `default` there is never absent here); `do` selects the kind
 * (fields as in test/scenarios/README.md).
 */
export type ScenarioStep =
  | {
      readonly do: "enqueue";
      readonly batch: boolean;
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
  | { readonly do: "awaitLeaseLapse"; readonly broker: number; readonly timeoutMs: number }
  | { readonly do: "expectLeaders"; readonly distinct: number }
  | {
      readonly do: "startWorker";
      readonly name: string;
      readonly subscription: string;
      readonly concurrency: number;
      readonly prefetch?: number;
      readonly handler: "ack" | "nack" | "deadLetter";
      readonly handlerMs: number;
      readonly leaseTtlMs?: number;
    }
  | {
      readonly do: "awaitWorker";
      readonly name: string;
      readonly started?: number;
      readonly completed?: number;
      readonly distinctPayloads?: number;
      readonly timeoutMs: number;
      readonly expect?: string[];
      readonly ordered: boolean;
      readonly expectAttempts?: number[];
      readonly expectAllOf?: { readonly prefix: string; readonly count: number };
    }
  | {
      readonly do: "stopWorker";
      readonly name: string;
      readonly timeoutMs: number;
      readonly expectStarted?: number;
      readonly expectCompleted?: number;
    }
  | {
      readonly do: "crashWorker";
      readonly subscription: string;
      readonly jobs: number;
      readonly expect: string[];
      readonly timeoutMs: number;
    }
  | {
      readonly do: "stats";
      readonly subscription: string;
      readonly expect?: Record<string, number>;
      readonly counters?: Record<string, number>;
      readonly timeoutMs: number;
    }
  | { readonly do: "deadLetters"; readonly subscription: string; readonly expect: string[] }
  | { readonly do: "redrive"; readonly subscription: string; readonly expect: number };

/** A step kind. */
export type StepKind = ScenarioStep["do"];

/** The step of kind `K`. */
export type StepOf<K extends StepKind> = Extract<ScenarioStep, { do: K }>;

/** A set of names, written as an object so that the compiler checks it holds every key of `T` and no other. */
type Fields<T> = { readonly [K in Exclude<keyof T, "do">]-?: true };

/**
 * The fields of each type above, for the drift test that compares them with
 * the schema's properties: the compiler checks each entry against its type,
 * the test against the schema, so a property the schema allows cannot be
 * missing from the types (and so silently skipped by the runner).
 */
export const TYPE_FIELDS: {
  readonly steps: { readonly [K in StepKind]: Fields<StepOf<K>> };
  readonly scenario: Fields<Scenario>;
  readonly queue: Fields<ScenarioQueue>;
  readonly message: Fields<ScenarioMessage>;
} = {
  steps: {
    enqueue: { batch: true, via: true, messages: true, expectDuplicate: true },
    produce: { count: true, prefix: true, killLeaderAfter: true },
    restartBroker: { broker: true },
    freezeBroker: { broker: true },
    thawBroker: { broker: true },
    awaitLeaseLapse: { broker: true, timeoutMs: true },
    expectLeaders: { distinct: true },
    startWorker: {
      name: true,
      subscription: true,
      concurrency: true,
      prefetch: true,
      handler: true,
      handlerMs: true,
      leaseTtlMs: true,
    },
    awaitWorker: {
      name: true,
      started: true,
      completed: true,
      distinctPayloads: true,
      timeoutMs: true,
      expect: true,
      ordered: true,
      expectAttempts: true,
      expectAllOf: true,
    },
    stopWorker: { name: true, timeoutMs: true, expectStarted: true, expectCompleted: true },
    crashWorker: { subscription: true, jobs: true, expect: true, timeoutMs: true },
    stats: { subscription: true, expect: true, counters: true, timeoutMs: true },
    deadLetters: { subscription: true, expect: true },
    redrive: { subscription: true, expect: true },
  },
  scenario: {
    $schema: true,
    name: true,
    description: true,
    brokers: true,
    queue: true,
    subscriptions: true,
    steps: true,
  },
  queue: { shards: true, leaseTtlMs: true, maxAttempts: true, backoffMs: true },
  message: {
    payload: true,
    key: true,
    priority: true,
    delayMs: true,
    maxAttempts: true,
    dedupId: true,
    headers: true,
  },
};

/** A loaded scenario file, with the schema's defaults filled in. */
export interface Scenario {
  /** Editors' link to the schema. */
  readonly $schema?: string;
  readonly name: string;
  readonly description?: string;
  readonly brokers: number;
  readonly queue: ScenarioQueue;
  readonly subscriptions: string[];
  readonly steps: ScenarioStep[];
}

/** Where an ajv error is, in words: `step 2 (enqueue) messages/0` rather than `/steps/2/messages/0`. */
function place(raw: unknown, instancePath: string): string {
  const match = /^\/steps\/(\d+)(.*)$/.exec(instancePath);
  if (!match) return instancePath === "" ? "top level" : instancePath.slice(1);
  const steps = (raw as { steps?: unknown[] }).steps;
  const step = steps?.[Number(match[1])] as { do?: unknown } | undefined;
  const kind = typeof step?.do === "string" ? step.do : "?";
  return `step ${match[1]} (${kind})${match[2] ? ` ${match[2].slice(1)}` : ""}`;
}

function describeError(raw: unknown, error: ErrorObject): string {
  const params = error.params as Record<string, unknown>;
  const what =
    error.keyword === "additionalProperties"
      ? `unknown field ${JSON.stringify(params.additionalProperty)}`
      : error.keyword === "required"
        ? `missing field ${JSON.stringify(params.missingProperty)}`
        : error.keyword === "enum"
          ? `${error.message}: ${(params.allowedValues as unknown[]).join(", ")}`
          : (error.message ?? error.keyword);
  return `${place(raw, error.instancePath)}: ${what}`;
}

/** The checks that relate several fields, which the schema cannot express. */
function checkSemantics(scenario: Scenario): string[] {
  const problems: string[] = [];
  for (const [i, step] of scenario.steps.entries()) {
    const where = `step ${i} (${step.do})`;
    const index =
      step.do === "restartBroker" ||
      step.do === "freezeBroker" ||
      step.do === "thawBroker" ||
      step.do === "awaitLeaseLapse"
        ? step.broker
        : step.do === "enqueue"
          ? step.via
          : undefined;
    if (index !== undefined && index >= scenario.brokers)
      problems.push(`${where}: broker index ${index} is not one of the ${scenario.brokers} brokers`);
    if (step.do === "enqueue" && step.expectDuplicate && step.expectDuplicate.length !== step.messages.length)
      problems.push(`${where}: expectDuplicate needs one entry per message`);
    if (step.do === "produce" && step.killLeaderAfter !== undefined && step.killLeaderAfter > step.count)
      problems.push(`${where}: killLeaderAfter ${step.killLeaderAfter} is above count ${step.count}`);
  }
  return problems;
}

/**
 * Parses a scenario document: it must satisfy the schema (unknown step kinds,
 * unknown fields, missing fields and wrong types are errors, all listed) and
 * the cross-field checks. Throws an error naming `label` and every problem.
 */
export function parseScenario(source: string, label = "scenario"): Scenario {
  const raw = JSON.parse(source) as unknown;
  if (!validate(raw)) {
    const problems = (validate.errors ?? [])
      // An `if`/`then` failure repeats the errors of its `then`.
      .filter((e) => e.keyword !== "if")
      .map((e) => describeError(raw, e));
    throw new Error(`${label}: not a valid scenario (${SCHEMA_PATH}):\n  ${problems.join("\n  ")}`);
  }
  const scenario = raw as Scenario;
  const problems = checkSemantics(scenario);
  if (problems.length > 0) throw new Error(`${label}: ${problems.join("; ")}`);
  return scenario;
}

/** Reads and parses a scenario file. */
export function loadScenario(path: string): Scenario {
  return parseScenario(readFileSync(path, "utf8"), path);
}
