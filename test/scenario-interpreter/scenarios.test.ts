/**
 * The language-neutral SDK scenarios (test/scenarios/*.json) run by the one
 * interpreter against each SDK's client under test: one test per file and
 * language, files found by listing the directory.
 */
import { join } from "node:path";
import { afterAll, beforeAll, describe, it } from "vitest";
import { tempDir } from "../e2e/support/processes.ts";
import { buildClients, LANGS } from "./client-under-test.ts";
import { interpretScenario } from "./interpreter.ts";
import { loadScenario, SCENARIO_DIR, scenarioFiles } from "./scenario-file.ts";

const files = scenarioFiles();
const build = tempDir("scenario-clients");

beforeAll(async () => {
  if (LANGS.includes("go")) await buildClients(build.path);
}, 300_000);
afterAll(() => build.remove());

for (const lang of LANGS)
  describe(`SDK scenarios (${lang})`, () => {
    // Failover waits out a 2 s leader lease and the SDK's retries: be generous.
    for (const file of files)
      it(file, { timeout: 180_000 }, async () => {
        await interpretScenario(loadScenario(join(SCENARIO_DIR, file)), lang);
      });
  });
