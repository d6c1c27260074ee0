/**
 * The language-neutral SDK scenarios (test/scenarios/*.json, spec in
 * test/scenarios/README.md) run with the TypeScript SDK: one test per file,
 * found by listing the directory so a new scenario is picked up by itself.
 */
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { ROOT } from "../e2e/support/processes.ts";
import { loadScenario, parseScenario, runScenario } from "./scenario-runner.ts";

const dir = join(ROOT, "test", "scenarios");
const files = readdirSync(dir)
  .filter((f) => f.endsWith(".json"))
  .sort();

describe("SDK scenarios (TypeScript)", () => {
  it("finds scenario files", () => {
    expect(files.length).toBeGreaterThan(0);
  });

  for (const file of files) {
    // Failover waits out a 2 s leader lease and the SDK's retries: be generous.
    it(file, { timeout: 180_000 }, async () => {
      await runScenario(loadScenario(join(dir, file)));
    });
  }
});

describe("scenario parsing", () => {
  const base = { name: "x", steps: [] as unknown[] };

  it("rejects an unknown do", () => {
    expect(() => parseScenario(JSON.stringify({ ...base, steps: [{ do: "teleport" }] }))).toThrow(
      /step 0 \(teleport\).*unknown do/,
    );
  });

  it("rejects unknown fields at every level", () => {
    expect(() => parseScenario(JSON.stringify({ ...base, extra: 1 }))).toThrow(/unknown field "extra"/);
    expect(() => parseScenario(JSON.stringify({ ...base, queue: { shard: 2 } }))).toThrow(
      /unknown field "shard"/,
    );
    expect(() =>
      parseScenario(JSON.stringify({ ...base, steps: [{ do: "redrive", expect: 1, subscriptions: "a" }] })),
    ).toThrow(/step 0 \(redrive\).*unknown field "subscriptions"/);
    expect(() =>
      parseScenario(
        JSON.stringify({ ...base, steps: [{ do: "enqueue", messages: [{ payload: "a", delay: 5 }] }] }),
      ),
    ).toThrow(/messages\[0\].*unknown field "delay"/);
    expect(() =>
      parseScenario(JSON.stringify({ ...base, steps: [{ do: "stats", expect: { readyy: 1 } }] })),
    ).toThrow(/unknown field "readyy"/);
  });

  it("parses restartBroker, expectLeaders and enqueue.via, checking broker indexes", () => {
    const two = { ...base, brokers: 2 };
    const parsed = parseScenario(
      JSON.stringify({
        ...two,
        steps: [
          { do: "restartBroker", broker: 0 },
          { do: "enqueue", via: 1, messages: [{ payload: "a" }] },
          { do: "expectLeaders", distinct: 2 },
        ],
      }),
    );
    expect(parsed.steps.map((s) => s.do)).toEqual(["restartBroker", "enqueue", "expectLeaders"]);
    expect(() =>
      parseScenario(JSON.stringify({ ...two, steps: [{ do: "restartBroker", broker: 2 }] })),
    ).toThrow(/step 0 \(restartBroker\).*broker index 2/);
    expect(() =>
      parseScenario(JSON.stringify({ ...two, steps: [{ do: "enqueue", via: -1, messages: [] }] })),
    ).toThrow(/broker index -1/);
    expect(() => parseScenario(JSON.stringify({ ...two, steps: [{ do: "restartBroker" }] }))).toThrow(
      /missing field "broker"/,
    );
    expect(() =>
      parseScenario(JSON.stringify({ ...two, steps: [{ do: "expectLeaders", distinct: 1, shards: 2 }] })),
    ).toThrow(/unknown field "shards"/);
    expect(() =>
      parseScenario(JSON.stringify({ ...two, steps: [{ do: "enqueue", via: "1", messages: [] }] })),
    ).toThrow(/field via must be integer/);
  });

  it("parses freezeBroker, thawBroker and awaitLeaseLapse, checking broker indexes", () => {
    const two = { ...base, brokers: 2 };
    const steps = [
      { do: "freezeBroker", broker: 0 },
      { do: "awaitLeaseLapse", broker: 0, timeoutMs: 5000 },
      { do: "thawBroker", broker: 0 },
    ];
    expect(parseScenario(JSON.stringify({ ...two, steps })).steps.map((s) => s.do)).toEqual([
      "freezeBroker",
      "awaitLeaseLapse",
      "thawBroker",
    ]);
    expect(() =>
      parseScenario(JSON.stringify({ ...two, steps: [{ do: "freezeBroker", broker: 2 }] })),
    ).toThrow(/broker index 2/);
    expect(() => parseScenario(JSON.stringify({ ...two, steps: [{ do: "thawBroker" }] }))).toThrow(
      /missing field "broker"/,
    );
    expect(() =>
      parseScenario(JSON.stringify({ ...two, steps: [{ do: "awaitLeaseLapse", broker: 0, timeout: 1 }] })),
    ).toThrow(/unknown field "timeout"/);
  });

  it("needs exactly one wait condition in awaitWorker", () => {
    expect(() =>
      parseScenario(
        JSON.stringify({ ...base, steps: [{ do: "awaitWorker", name: "w", started: 1, completed: 1 }] }),
      ),
    ).toThrow(/exactly one/);
  });
});
