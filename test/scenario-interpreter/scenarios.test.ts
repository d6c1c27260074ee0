/**
 * The language-neutral SDK scenarios (test/scenarios/*.json) run by the one
 * interpreter against each SDK's client under test: one test per file and
 * language, files found by listing the directory.
 */
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { tempDir } from "../e2e/support/processes.ts";
import { buildClients, LANGS } from "./client-under-test.ts";
import { interpretScenario } from "./interpreter.ts";
import { loadScenario, parseScenario, SCENARIO_DIR, scenarioFiles } from "./scenario-file.ts";

const files = scenarioFiles();
const build = tempDir("scenario-clients");

beforeAll(async () => {
  if (LANGS.includes("go")) await buildClients(build.path);
}, 300_000);
afterAll(() => build.remove());

for (const lang of LANGS)
  describe(`SDK scenarios (${lang})`, () => {
    it("fails a scenario whose expectation does not hold, naming the step", async () => {
      const scenario = parseScenario(
        JSON.stringify({
          name: "must-fail",
          steps: [
            { do: "enqueue", messages: [{ payload: "a" }] },
            { do: "stats", expect: { ready: 2 }, timeoutMs: 500 },
          ],
        }),
      );
      await expect(interpretScenario(scenario, lang)).rejects.toThrow(
        new RegExp(`scenario must-fail \\(${lang}\\): step 1 \\(stats\\) failed: .*"ready":1`),
      );
    });

    it("passes a client's error on, naming the step", async () => {
      const scenario = parseScenario(
        JSON.stringify({
          name: "client-error",
          steps: [{ do: "deadLetters", subscription: "no-such-subscription", expect: [] }],
        }),
      );
      await expect(interpretScenario(scenario, lang)).rejects.toThrow(
        new RegExp(`step 0 \\(deadLetters\\) failed: ${lang} client: .*no-such-subscription`),
      );
    });

    for (const file of files)
      it(file, { timeout: 180_000 }, async () => {
        await interpretScenario(loadScenario(join(SCENARIO_DIR, file)), lang);
      });
  });
