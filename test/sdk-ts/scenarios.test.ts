/**
 * The language-neutral SDK scenarios (test/scenarios/*.json, spec in
 * test/scenarios/README.md) run with the TypeScript SDK: one test per file,
 * found by listing the directory so a new scenario is picked up by itself.
 * Before them: every file validates against the schema, the schema's step
 * kinds are the ones this runner implements, and malformed files are refused.
 */
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import {
  loadScenario,
  parseScenario,
  SCENARIO_DIR,
  SCHEMA_STEP_KINDS,
  scenarioFiles,
} from "./scenario-file.ts";
import { runScenario, STEP_RUNNERS } from "./scenario-runner.ts";

const files = scenarioFiles();

describe("scenario schema", () => {
  it("finds scenario files", () => {
    expect(files.length).toBeGreaterThan(0);
  });

  it("every scenario file validates", () => {
    for (const file of files) expect(() => loadScenario(join(SCENARIO_DIR, file)), file).not.toThrow();
  });

  it("allows exactly the step kinds this runner implements", () => {
    expect(Object.keys(STEP_RUNNERS).sort()).toEqual([...SCHEMA_STEP_KINDS].sort());
  });
});

describe("SDK scenarios (TypeScript)", () => {
  for (const file of files) {
    // Failover waits out a 2 s leader lease and the SDK's retries: be generous.
    it(file, { timeout: 180_000 }, async () => {
      await runScenario(loadScenario(join(SCENARIO_DIR, file)));
    });
  }
});

describe("scenario loading refuses malformed files", () => {
  const base = { name: "x", steps: [{ do: "redrive", expect: 0 }] };
  const parse = (value: object) => () => parseScenario(JSON.stringify(value), "bad.json");

  it("accepts a minimal scenario and fills in the defaults", () => {
    const parsed = parseScenario(JSON.stringify(base));
    expect(parsed).toMatchObject({ brokers: 1, queue: {}, subscriptions: [] });
  });

  it("refuses an unknown step kind, listing the known ones", () => {
    expect(parse({ ...base, steps: [{ do: "teleport" }] })).toThrow(
      /bad\.json: not a valid scenario.*\n.*step 0 \(teleport\) do: must be equal to one of the allowed values: enqueue, produce/,
    );
  });

  it("refuses a missing field", () => {
    expect(parse({ ...base, steps: [{ do: "restartBroker" }] })).toThrow(
      /step 0 \(restartBroker\): missing field "broker"/,
    );
    expect(parse({ steps: base.steps })).toThrow(/top level: missing field "name"/);
    expect(parse({ ...base, steps: [] })).toThrow(/steps: must NOT have fewer than 1 items/);
  });

  it("refuses unknown fields at every level", () => {
    expect(parse({ ...base, extra: 1 })).toThrow(/top level: unknown field "extra"/);
    expect(parse({ ...base, queue: { shard: 2 } })).toThrow(/queue: unknown field "shard"/);
    expect(parse({ ...base, steps: [{ do: "redrive", expect: 1, subscriptions: "a" }] })).toThrow(
      /step 0 \(redrive\): unknown field "subscriptions"/,
    );
    expect(parse({ ...base, steps: [{ do: "enqueue", messages: [{ payload: "a", delay: 5 }] }] })).toThrow(
      /step 0 \(enqueue\) messages\/0: unknown field "delay"/,
    );
    expect(parse({ ...base, steps: [{ do: "stats", expect: { readyy: 1 } }] })).toThrow(
      /step 0 \(stats\) expect: unknown field "readyy"/,
    );
    expect(parse({ ...base, steps: [{ do: "enqueue", messages: [{ Payload: "a" }] }] })).toThrow(
      /unknown field "Payload"/,
    );
  });

  it("refuses wrong types and values", () => {
    expect(parse({ ...base, brokers: 2, steps: [{ do: "enqueue", via: "1", messages: [] }] })).toThrow(
      /step 0 \(enqueue\) via: must be integer/,
    );
    expect(parse({ ...base, steps: [{ do: "startWorker", name: "w", handler: "explode" }] })).toThrow(
      /handler: must be equal to one of the allowed values: ack, nack, deadLetter/,
    );
    expect(
      parse({ ...base, steps: [{ do: "enqueue", messages: [{ payload: "a", headers: { h: 1 } }] }] }),
    ).toThrow(/messages\/0\/headers\/h: must be string/);
  });

  it("needs exactly one wait condition in awaitWorker and something to check in stats", () => {
    expect(parse({ ...base, steps: [{ do: "awaitWorker", name: "w", started: 1, completed: 1 }] })).toThrow(
      /step 0 \(awaitWorker\): must match exactly one schema in oneOf/,
    );
    expect(parse({ ...base, steps: [{ do: "awaitWorker", name: "w" }] })).toThrow(/oneOf/);
    expect(parse({ ...base, steps: [{ do: "stats" }] })).toThrow(/anyOf/);
  });

  it("checks broker indexes, expectDuplicate lengths and killLeaderAfter (beyond the schema)", () => {
    const two = { ...base, brokers: 2 };
    const parsed = parseScenario(
      JSON.stringify({
        ...two,
        steps: [
          { do: "restartBroker", broker: 1 },
          { do: "enqueue", via: 1, messages: [{ payload: "a" }] },
          { do: "freezeBroker", broker: 1 },
          { do: "awaitLeaseLapse", broker: 1, timeoutMs: 5000 },
          { do: "thawBroker", broker: 1 },
          { do: "expectLeaders", distinct: 2 },
        ],
      }),
    );
    expect(parsed.steps.map((s) => s.do)).toEqual([
      "restartBroker",
      "enqueue",
      "freezeBroker",
      "awaitLeaseLapse",
      "thawBroker",
      "expectLeaders",
    ]);
    for (const step of [
      { do: "restartBroker", broker: 2 },
      { do: "freezeBroker", broker: 2 },
      { do: "thawBroker", broker: 2 },
      { do: "awaitLeaseLapse", broker: 2 },
      { do: "enqueue", via: 2, messages: [{ payload: "a" }] },
    ])
      expect(parse({ ...two, steps: [step] })).toThrow(/broker index 2 is not one of the 2 brokers/);
    expect(parse({ ...two, steps: [{ do: "enqueue", via: -1, messages: [{ payload: "a" }] }] })).toThrow(
      /via: must be >= 0/,
    );
    expect(
      parse({
        ...base,
        steps: [{ do: "enqueue", messages: [{ payload: "a" }], expectDuplicate: [false, true] }],
      }),
    ).toThrow(/expectDuplicate needs one entry per message/);
    expect(parse({ ...base, steps: [{ do: "produce", count: 2, prefix: "m", killLeaderAfter: 3 }] })).toThrow(
      /killLeaderAfter 3 is above count 2/,
    );
  });
});
