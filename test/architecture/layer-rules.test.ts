/**
 * The layer rules of .dependency-cruiser.cjs (`npm run check:deps`) fail on
 * planted violations: dependency-cruiser runs with the repository's config in
 * a temporary directory laid out like the repository, over a small program in
 * which each rule is broken exactly once, beside imports that are allowed.
 * The violations found must be exactly the planted ones.
 */
import { execFileSync } from "node:child_process";
import { cpSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const DEPCRUISE = join(ROOT, "node_modules", ".bin", "depcruise");

/** The planted program: path → source. Comments say which rule an import breaks. */
const PROGRAM: Record<string, string> = {
  "server/src/errors.ts": "export class CasqError extends Error {}\n",
  "server/src/util/clock.ts": "export const now = 0;\n",
  // errors-and-util-are-leaves
  "server/src/util/leaky.ts": 'import { record } from "../model/record.ts";\nexport const leaky = record;\n',
  "server/src/store/store.ts": 'import { now } from "../util/clock.ts";\nexport const store = now;\n',
  // store-below-everything
  "server/src/store/upward.ts":
    'import { record } from "../model/record.ts";\nexport const upward = record;\n',
  "server/src/model/record.ts":
    'import { CasqError } from "../errors.ts";\nexport const record = CasqError;\n',
  // model-is-pure (the store), and a library
  "server/src/model/impure.ts":
    'import { store } from "../store/store.ts";\nimport { createHash } from "node:crypto";\nimport { readFileSync } from "node:fs";\nexport const impure = [store, createHash, readFileSync];\n',
  // no-circular, through type-only imports
  "server/src/model/ping.ts":
    'import type { Pong } from "./pong.ts";\nexport interface Ping { pong?: Pong }\n',
  "server/src/model/pong.ts":
    'import type { Ping } from "./ping.ts";\nexport interface Pong { ping?: Ping }\n',
  "server/src/broker/broker.ts":
    'import { record } from "../model/record.ts";\nimport type { Ping } from "../model/ping.ts";\nimport { store } from "../store/store.ts";\nexport const broker = [record, store] as Ping[] | unknown[];\n',
  // broker-below-telemetry-service-cli, no-test-code-in-production (twice)
  "server/src/broker/upward.ts":
    'import { metrics } from "../telemetry/metrics.ts";\nimport { helper } from "../../testing/helper.ts";\nimport { fixture } from "./broker.test.ts";\nexport const upward = [metrics, helper, fixture];\n',
  "server/src/broker/broker.test.ts":
    'import { helper } from "../../testing/helper.ts";\nexport const fixture = helper;\n',
  "server/testing/helper.ts":
    'import { broker } from "../src/broker/broker.ts";\nexport const helper = broker;\n',
  // production-reachable-from-cli
  "server/src/broker/unused.ts": 'import { broker } from "./broker.ts";\nexport const unused = broker;\n',
  "server/src/telemetry/metrics.ts":
    'import { broker } from "../broker/broker.ts";\nimport { store } from "../store/store.ts";\nexport const metrics = [broker, store];\n',
  // telemetry-below-service
  "server/src/telemetry/upward.ts":
    'import { service } from "../service/service.ts";\nexport const upward = service;\n',
  "server/src/service/service.ts":
    'import { broker } from "../broker/broker.ts";\nimport { metrics } from "../telemetry/metrics.ts";\nimport { record } from "../model/record.ts";\nexport const service = [broker, metrics, record];\n',
  // service-below-cli
  "server/src/service/upward.ts":
    'import { command } from "../cli/command.ts";\nexport const upward = command;\n',
  "server/src/cli/command.ts":
    'import { service } from "../service/service.ts";\nexport const command = service;\n',
  // not-to-unresolvable
  "server/src/cli/broken.ts": 'import { gone } from "./gone.ts";\nexport const broken = gone;\n',
  "server/src/cli/main.ts": [
    'import { command } from "./command.ts";',
    'import { broken } from "./broken.ts";',
    'import { leaky } from "../util/leaky.ts";',
    'import { upward as a } from "../store/upward.ts";',
    'import { impure } from "../model/impure.ts";',
    'import { upward as b } from "../broker/upward.ts";',
    'import { upward as c } from "../telemetry/upward.ts";',
    'import { upward as d } from "../service/upward.ts";',
    'import { viaSdkGen } from "../service/via-sdk-gen.ts";',
    "export const main = [command, broken, leaky, a, impure, b, c, d, viaSdkGen];",
    "",
  ].join("\n"),
  // sdk-is-standalone
  "sdk/ts/src/index.ts":
    'import { CasqError } from "../../../server/src/errors.ts";\nexport const sdk = CasqError;\n',
  // The SDK's re-export of generated code (@casq/sdk/gen/*), which neither the server nor the SDK imports.
  "sdk/ts/src/gen/casq/v1/message_pb.ts": "export const MessageSchema = 1;\n",
  // server-takes-generated-code-from-api
  "server/src/service/via-sdk-gen.ts":
    'import { MessageSchema } from "../../../sdk/ts/src/gen/casq/v1/message_pb.ts";\nexport const viaSdkGen = MessageSchema;\n',
  // sdk-takes-generated-code-from-api
  "sdk/ts/src/via-sdk-gen.ts":
    'import { MessageSchema } from "./gen/casq/v1/message_pb.ts";\nexport const viaSdkGen = MessageSchema;\n',
};

/** Every violation planted above: rule, from, to (a cycle is reported once; an unreachable module as from and to). */
const PLANTED = [
  ["errors-and-util-are-leaves", "server/src/util/leaky.ts", "server/src/model/record.ts"],
  ["store-below-everything", "server/src/store/upward.ts", "server/src/model/record.ts"],
  ["model-is-pure", "server/src/model/impure.ts", "server/src/store/store.ts"],
  ["model-is-pure", "server/src/model/impure.ts", "fs"],
  ["no-circular", "server/src/model/ping.ts", "server/src/model/pong.ts"],
  ["broker-below-telemetry-service-cli", "server/src/broker/upward.ts", "server/src/telemetry/metrics.ts"],
  ["no-test-code-in-production", "server/src/broker/upward.ts", "server/testing/helper.ts"],
  ["no-test-code-in-production", "server/src/broker/upward.ts", "server/src/broker/broker.test.ts"],
  ["production-reachable-from-cli", "server/src/broker/unused.ts", "server/src/broker/unused.ts"],
  ["telemetry-below-service", "server/src/telemetry/upward.ts", "server/src/service/service.ts"],
  ["service-below-cli", "server/src/service/upward.ts", "server/src/cli/command.ts"],
  ["not-to-unresolvable", "server/src/cli/broken.ts", "./gone.ts"],
  ["sdk-is-standalone", "sdk/ts/src/index.ts", "server/src/errors.ts"],
  [
    "server-takes-generated-code-from-api",
    "server/src/service/via-sdk-gen.ts",
    "sdk/ts/src/gen/casq/v1/message_pb.ts",
  ],
  ["sdk-takes-generated-code-from-api", "sdk/ts/src/via-sdk-gen.ts", "sdk/ts/src/gen/casq/v1/message_pb.ts"],
].map(([rule, from, to]) => `${rule}: ${from} -> ${to}`);

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/** Runs `npm run check:deps`'s cruise over `program` with the repository's config; the violations as `rule: from -> to`. */
function cruise(program: Record<string, string>): string[] {
  const dir = mkdtempSync(join(tmpdir(), "casq-layers-"));
  dirs.push(dir);
  cpSync(join(ROOT, ".dependency-cruiser.cjs"), join(dir, ".dependency-cruiser.cjs"));
  cpSync(join(ROOT, "tsconfig.json"), join(dir, "tsconfig.json"));
  for (const [path, text] of Object.entries(program)) {
    mkdirSync(dirname(join(dir, path)), { recursive: true });
    writeFileSync(join(dir, path), text);
  }
  let output: string;
  try {
    output = execFileSync(
      DEPCRUISE,
      [
        "--config",
        ".dependency-cruiser.cjs",
        "--output-type",
        "json",
        "server/src",
        "server/testing",
        "sdk/ts/src",
      ],
      { cwd: dir, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], maxBuffer: 64 * 1024 * 1024 },
    );
  } catch (error) {
    // depcruise exits with the number of errors; the report is still on stdout.
    output = String((error as { stdout?: unknown }).stdout ?? "");
  }
  const report = JSON.parse(output) as {
    summary: { violations: { rule: { name: string }; from: string; to: string }[] };
  };
  return report.summary.violations.map((v) => `${v.rule.name}: ${v.from} -> ${v.to}`).sort();
}

describe("layer rules", () => {
  it("find exactly the planted violations", () => {
    expect(cruise(PROGRAM)).toEqual([...PLANTED].sort());
  });

  it("pass the program once the violations are removed", () => {
    const clean = Object.fromEntries(
      Object.entries(PROGRAM).filter(
        ([path]) => !/(leaky|upward|impure|ping|pong|unused|broken|via-sdk-gen)\.ts$/.test(path),
      ),
    );
    clean["server/src/broker/broker.ts"] =
      'import { record } from "../model/record.ts";\nimport { store } from "../store/store.ts";\nexport const broker = [record, store];\n';
    clean["server/src/cli/main.ts"] =
      'import { command } from "./command.ts";\nexport const main = command;\n';
    clean["sdk/ts/src/index.ts"] = "export const sdk = 1;\n";
    expect(cruise(clean)).toEqual([]);
  });
});
