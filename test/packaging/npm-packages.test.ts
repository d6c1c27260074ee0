/**
 * The npm packages as a user outside the repository gets them: `npm run
 * artifacts` builds and packs `casq` (server), `@casq/sdk` and `@casq/api`
 * (the generated code both use), and the Python wheel and sdist, with
 * SHA256SUMS; a fresh project under the system temp dir installs the three
 * tarballs with `npm install --prefer-offline` (the packages' own
 * dependencies come from the registry cache, nothing from this checkout's
 * node_modules). There, with
 * plain `node` (no tsx, no loader):
 *
 * - the installed `casq serve` bin runs the broker on a temporary file store;
 * - a producer script enqueues a job and a worker script consumes it;
 * - the benchmark's slow-store server, compiled beside the installation,
 *   serves an enqueue (bench/lib/built-server.ts);
 * - `tsc` with NodeNext settings type-checks a file that imports the SDK
 *   (and the generated code, from `@casq/api` and as `@casq/sdk/gen/*`),
 *   and reports a type error in one that misuses it.
 */
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { compileSlowStoreServer } from "../../bench/lib/built-server.ts";
import {
  cleanEnv,
  expectOk,
  outsideDir,
  ROOT,
  runProgram,
  type StartedBroker,
  startBroker,
  within,
} from "./support.ts";

const rootManifest = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as {
  devDependencies: Record<string, string>;
};
const VERSION = readFileSync(join(ROOT, "VERSION"), "utf8").trim();

const PRODUCER = `import { Producer } from "@casq/sdk";
const [broker, queue, text] = process.argv.slice(2);
const { id } = await new Producer({ brokers: [broker] }).enqueue(queue, { text });
console.log(id);
process.exit(0);
`;

const WORKER = `import { Worker } from "@casq/sdk";
const [broker, queue] = process.argv.slice(2);
const worker = new Worker({ brokers: [broker] });
await worker.run(queue, async (job) => {
  console.log(JSON.stringify({ id: job.id, payload: job.json() }));
  setImmediate(() => void worker.stop({ timeoutMs: 5000 }));
});
process.exit(0);
`;

const TYPED = `import { Admin, type EnqueueResult, type Job, Producer, Worker } from "@casq/sdk";
import { QueueService } from "@casq/sdk/gen/casq/v1/queue_service_pb.js";
import { QueueService as FromApi } from "@casq/api/casq/v1/queue_service_pb.js";
const kind: "unary" = QueueService.method.enqueue.methodKind;
console.log(kind, FromApi === QueueService);
const brokers: string[] = ["127.0.0.1:50051"];
const result: EnqueueResult = await new Producer({ brokers }).enqueue("emails", { to: "ada@example.com" });
const id: string = result.id;
await new Worker({ brokers }).run("emails", async (job: Job) => {
  console.log(id, job.id, job.attempt, job.json());
});
await new Admin({ brokers }).listQueues();
`;

const MISTYPED = `import { Producer } from "@casq/sdk";
const count: number = (await new Producer({ brokers: ["127.0.0.1:50051"] }).enqueue("q", "x")).id;
console.log(count);
`;

/** NodeNext as \`tsc --init\` sets it up, strict, without skipLibCheck (the SDK's .d.ts are checked too). */
const TSCONFIG = {
  compilerOptions: {
    module: "nodenext",
    target: "esnext",
    strict: true,
    noEmit: true,
    types: ["node"],
  },
};

describe("npm packages installed in a project outside the repository", () => {
  const artifacts = outsideDir("npm-artifacts");
  const project = outsideDir("npm-project");
  const store = outsideDir("npm-store");
  let tarballs: string[] = [];
  let broker: StartedBroker | undefined;

  beforeAll(async () => {
    expectOk("npm run artifacts", await runProgram("npm", ["run", "artifacts", "--", artifacts.path]));
    tarballs = [`casq-api-${VERSION}.tgz`, `casq-sdk-${VERSION}.tgz`, `casq-${VERSION}.tgz`].map((name) =>
      join(artifacts.path, name),
    );
    writeFileSync(
      join(project.path, "package.json"),
      JSON.stringify({ name: "casq-consumer", private: true, type: "module" }),
    );
    expectOk(
      "npm install",
      await runProgram(
        "npm",
        [
          "install",
          "--prefer-offline",
          "--no-audit",
          "--no-fund",
          ...tarballs,
          `typescript@${rootManifest.devDependencies.typescript}`,
          `@types/node@${rootManifest.devDependencies["@types/node"]}`,
        ],
        { cwd: project.path },
      ),
    );
  }, 600_000);

  /** Runs the producer script against `address` in the project; returns the job id it printed (checked). */
  const produce = async (address: string, queue: string, text: string): Promise<string> => {
    writeFileSync(join(project.path, "producer.mjs"), PRODUCER);
    const produced = expectOk(
      "producer.mjs",
      await runProgram("node", ["producer.mjs", address, queue, text], {
        cwd: project.path,
        env: cleanEnv(),
      }),
    );
    const id = produced.stdout.trim();
    expect(id).toMatch(/^[0-9A-Z]{26}$/);
    return id;
  };

  afterAll(async () => {
    broker?.child.kill("SIGKILL");
    await broker?.exited;
    artifacts.remove();
    project.remove();
    store.remove();
  });

  test("npm run artifacts writes every artifact and a SHA256SUMS that verifies", async () => {
    const names = [
      `casq-${VERSION}.tgz`,
      `casq-api-${VERSION}.tgz`,
      `casq-sdk-${VERSION}.tgz`,
      `casq_sdk-${VERSION}-py3-none-any.whl`,
      `casq_sdk-${VERSION}.tar.gz`,
    ];
    expect(readdirSync(artifacts.path).sort()).toEqual([...names, "SHA256SUMS"].sort());
    const sums = readFileSync(join(artifacts.path, "SHA256SUMS"), "utf8");
    expect(
      sums
        .trim()
        .split("\n")
        .map((line) => line.split(/\s+/)[1])
        .sort(),
    ).toEqual([...names].sort());
    expectOk("sha256sum -c", await runProgram("sha256sum", ["-c", "SHA256SUMS"], { cwd: artifacts.path }));
  });

  test("the npm tarballs install the build only, with the SDK's own dependencies", () => {
    const api = join(project.path, "node_modules", "@casq", "api");
    const sdk = join(project.path, "node_modules", "@casq", "sdk");
    const server = join(project.path, "node_modules", "casq");
    // Real directories with the build, not links back into the checkout, and no TypeScript source.
    for (const dir of [api, sdk, server]) {
      expect(existsSync(join(dir, "src"))).toBe(false);
      expect(existsSync(join(dir, "dist"))).toBe(true);
    }
    const sdkManifest = JSON.parse(readFileSync(join(sdk, "package.json"), "utf8"));
    expect(sdkManifest.exports["."]).toEqual({ types: "./dist/index.d.ts", default: "./dist/index.js" });
    expect(sdkManifest.private).toBeUndefined();
    expect(sdkManifest.version).toBe(VERSION);
    // The SDK's dependencies were installed for it in this project.
    for (const dep of Object.keys(sdkManifest.dependencies)) {
      expect(existsSync(join(project.path, "node_modules", dep, "package.json")), dep).toBe(true);
    }
    expect(readdirSync(join(sdk, "dist")).filter((f) => f.endsWith(".ts") && !f.endsWith(".d.ts"))).toEqual(
      [],
    );
    // The SDK takes its generated code from the installed @casq/api, at the same version.
    expect(sdkManifest.dependencies["@casq/api"]).toBe(VERSION);
    const apiManifest = JSON.parse(readFileSync(join(api, "package.json"), "utf8"));
    expect(apiManifest.version).toBe(VERSION);
    expect(apiManifest.private).toBeUndefined();
    expect(apiManifest.exports["./*.ts"]).toEqual({ types: "./dist/*.d.ts", default: "./dist/*.js" });
  });

  test("the installed casq serve runs with plain node; a producer and a worker script enqueue and consume a job", async () => {
    const env = cleanEnv();
    broker = await startBroker(
      [
        join(project.path, "node_modules", ".bin", "casq"),
        "serve",
        "--store",
        `file:${store.path}`,
        "--listen",
        "127.0.0.1:0",
      ],
      { cwd: project.path, env },
    );
    writeFileSync(join(project.path, "worker.mjs"), WORKER);
    const id = await produce(broker.address, "emails", "hello from outside");
    const worked = expectOk(
      "worker.mjs",
      await runProgram("node", ["worker.mjs", broker.address, "emails"], {
        cwd: project.path,
        env,
        timeoutMs: 60_000,
      }),
    );
    expect(JSON.parse(worked.stdout.trim())).toEqual({ id, payload: { text: "hello from outside" } });
    const version = expectOk(
      "casq --version",
      await runProgram(join(project.path, "node_modules", ".bin", "casq"), ["--version"], {
        cwd: project.path,
        env,
      }),
    );
    expect(version.stdout.trim()).toBe(VERSION);
    broker.child.kill("SIGTERM");
    expect(await within("the broker to exit on SIGTERM", broker.exited, 30_000)).toBe(0);
  }, 180_000);

  test("the benchmark's slow-store server compiles beside the installed packages and serves with plain node", async () => {
    // `npm run bench` runs its S3-like profile so (bench/lib/built-server.ts): a broken import
    // there would only show in a benchmark run.
    const slow = compileSlowStoreServer(project.path);
    const slowStore = outsideDir("npm-slow-store");
    const env = cleanEnv();
    const started = await startBroker(["node", slow, slowStore.path, "20"], { cwd: project.path, env });
    try {
      await produce(started.address, "slow", "through a slow store");
      expect(started.output()).toContain("metrics on http://");
    } finally {
      started.child.kill("SIGTERM");
      await within("the slow-store server to exit on SIGTERM", started.exited, 30_000);
      slowStore.remove();
    }
  }, 180_000);

  test("tsc with NodeNext settings type-checks a file importing the SDK and catches a misuse", async () => {
    writeFileSync(join(project.path, "tsconfig.json"), JSON.stringify({ ...TSCONFIG, files: ["typed.ts"] }));
    writeFileSync(join(project.path, "typed.ts"), TYPED);
    const tsc = join(project.path, "node_modules", "typescript", "bin", "tsc");
    expectOk("tsc (typed.ts)", await runProgram("node", [tsc, "-p", "tsconfig.json"], { cwd: project.path }));

    writeFileSync(
      join(project.path, "tsconfig.json"),
      JSON.stringify({ ...TSCONFIG, files: ["mistyped.ts"] }),
    );
    writeFileSync(join(project.path, "mistyped.ts"), MISTYPED);
    const wrong = await runProgram("node", [tsc, "-p", "tsconfig.json"], { cwd: project.path });
    expect(wrong.code).not.toBe(0);
    expect(wrong.stdout).toContain("error TS2322");
  }, 120_000);
});
