/**
 * Keeps docs/sdk-typescript.md honest: every fenced ```ts example is written
 * to a temporary module (importing this checkout's @casq/sdk, talking to a
 * live in-process server instead of 127.0.0.1:50051) and run with tsx, in
 * document order. An example that installs a SIGTERM handler (the worker) is
 * sent SIGTERM once it printed something and must then exit cleanly.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { tempDirForTest } from "../../server/testing/test-temp-dir.ts";
import { closeServers, eventually, startServer } from "./support.ts";

const root = resolve(import.meta.dirname, "../..");
const doc = readFileSync(join(root, "docs/sdk-typescript.md"), "utf8");
const examples = [...doc.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1] as string);
const sdkEntry = join(root, "sdk/ts/src/index.ts");

afterAll(closeServers);

function runExample(file: string): {
  child: ChildProcess;
  output: () => string;
  exit: Promise<number | null>;
} {
  const child = spawn(process.execPath, ["--import", "tsx", file], {
    cwd: root,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout?.on("data", (d: Buffer) => {
    out += d.toString();
  });
  child.stderr?.on("data", (d: Buffer) => {
    out += d.toString();
  });
  const exit = new Promise<number | null>((done) => child.on("exit", (code) => done(code)));
  return { child, output: () => out, exit };
}

describe("docs/sdk-typescript.md examples", () => {
  it("has examples", () => {
    expect(examples.length).toBeGreaterThanOrEqual(4);
  });

  it("run against a live server", async () => {
    const server = await startServer();
    const dir = tempDirForTest("casq-sdk-docs-");
    for (const [index, source] of examples.entries()) {
      const code = source
        .replaceAll("127.0.0.1:50051", server.address)
        .replaceAll('"@casq/sdk"', JSON.stringify(sdkEntry));
      const file = join(dir, `example-${index}.mts`);
      writeFileSync(file, code);
      const run = runExample(file);
      const timer = setTimeout(() => run.child.kill("SIGKILL"), 30_000);
      if (source.includes('process.once("SIGTERM"')) {
        await eventually(() => run.output().includes("mail to"), 20_000);
        run.child.kill("SIGTERM");
      }
      const status = await run.exit;
      clearTimeout(timer);
      expect({ example: index, status, output: run.output() }).toMatchObject({ example: index, status: 0 });
      if (source.includes('process.once("SIGTERM"')) {
        expect(run.output()).toContain("mail to ann@example.com");
        expect(run.output()).toContain("worker stopped");
      }
    }
  });
});
