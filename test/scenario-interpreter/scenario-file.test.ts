/**
 * Loading scenario files (scenario-file.ts): every file validates against
 * the schema, the schema's step kinds are the ones the interpreter
 * implements and its fields the ones of the loader's types, and the loader
 * refuses and accepts the cases of test/scenarios/loader-cases.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { STEP_RUNNERS } from "./interpreter.ts";
import {
  loadScenario,
  parseScenario,
  SCENARIO_DIR,
  SCHEMA_PATH,
  SCHEMA_STEP_KINDS,
  scenarioFiles,
  TYPE_FIELDS,
} from "./scenario-file.ts";

const files = scenarioFiles();

describe("scenario schema", () => {
  it("finds scenario files", () => {
    expect(files.length).toBeGreaterThan(0);
  });

  it("every scenario file validates", () => {
    for (const file of files) expect(() => loadScenario(join(SCENARIO_DIR, file)), file).not.toThrow();
  });

  it("allows exactly the step kinds the interpreter implements", () => {
    expect(Object.keys(STEP_RUNNERS).sort()).toEqual([...SCHEMA_STEP_KINDS].sort());
  });

  it("allows exactly the fields of the loader's types", () => {
    const schema = JSON.parse(readFileSync(SCHEMA_PATH, "utf8")) as {
      properties: Record<string, { properties?: object }>;
      $defs: Record<string, { properties?: object }>;
    };
    const names = (node: { properties?: object } | undefined) =>
      Object.keys(node?.properties ?? {})
        .filter((k) => k !== "do")
        .sort();
    const keys = (fields: object) => Object.keys(fields).sort();
    expect(keys(TYPE_FIELDS.scenario)).toEqual(names(schema));
    expect(keys(TYPE_FIELDS.queue)).toEqual(names(schema.properties.queue));
    expect(keys(TYPE_FIELDS.message)).toEqual(names(schema.$defs.message));
    for (const [kind, fields] of Object.entries(TYPE_FIELDS.steps))
      expect(keys(fields), kind).toEqual(names(schema.$defs[kind]));
  });
});

/** The loader cases (test/scenarios/loader-cases/cases.json). */
interface LoaderCases {
  readonly refused: { why: string; scenario: object; mentions: string[] }[];
  readonly accepted: { why: string; scenario: object }[];
}
const cases = JSON.parse(
  readFileSync(join(SCENARIO_DIR, "loader-cases", "cases.json"), "utf8"),
) as LoaderCases;

describe("scenario loading", () => {
  const base = { name: "x", steps: [{ do: "redrive", expect: 0 }] };

  for (const c of cases.refused)
    it(`refuses: ${c.why}`, () => {
      let message = "";
      try {
        parseScenario(JSON.stringify(c.scenario), "bad.json");
      } catch (error) {
        message = String(error);
      }
      expect(message, "refused").toMatch(/^Error: bad\.json: /);
      for (const m of c.mentions) expect(message).toContain(m);
    });

  for (const c of cases.accepted)
    it(`accepts: ${c.why}`, () => {
      expect(() => parseScenario(JSON.stringify(c.scenario))).not.toThrow();
    });

  it("lists every problem of a file, one a line", () => {
    expect(() =>
      parseScenario(
        JSON.stringify({ ...base, extra: 1, steps: [{ do: "restartBroker" }, { do: "teleport" }] }),
        "bad.json",
      ),
    ).toThrow(
      /^bad\.json: not a valid scenario \(.*scenario\.schema\.json\):\n {2}top level: unknown field "extra"\n {2}step 0 \(restartBroker\): missing field "broker"\n {2}step 1 \(teleport\) do: must be equal to one of the allowed values: enqueue, produce, /,
    );
  });

  it("accepts a minimal scenario and fills in the schema's defaults", () => {
    const parsed = parseScenario(
      JSON.stringify({
        ...base,
        steps: [
          { do: "stats", expect: { ready: 0 } },
          { do: "awaitLeaseLapse", broker: 0 },
          { do: "startWorker", name: "w", handler: "ack", subscription: "s" },
        ],
      }),
    );
    expect(parsed).toMatchObject({
      brokers: 1,
      queue: { shards: 1, leaseTtlMs: 2000, backoffMs: 100 },
      subscriptions: [],
      steps: [
        { do: "stats", subscription: "default", timeoutMs: 10_000 },
        { do: "awaitLeaseLapse", timeoutMs: 20_000 },
        { do: "startWorker", subscription: "s", concurrency: 1, handlerMs: 0 },
      ],
    });
    expect(parsed.queue).not.toHaveProperty("maxAttempts");
    expect(parsed.steps[2]).not.toHaveProperty("prefetch");
  });
});
