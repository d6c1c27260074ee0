/**
 * The checkout's launcher, `server/bin/casq.js`, runs the TypeScript source
 * through tsx (no build step). `npm test` runs every other suite's brokers
 * and commands on the build (`CASQ_TEST_BIN`, test/support/install-built-casq.ts),
 * so this test keeps the source path of the launcher, the one developers and
 * the README's tour use, under test.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { CHECKOUT_CASQ_BIN, ROOT, run, startServer, tempDir } from "../e2e/support/processes.ts";

describe("the checkout's launcher", () => {
  const store = tempDir("checkout-launcher");
  afterAll(() => store.remove());

  it("runs the source: it prints the version, and a broker it starts takes a queue", async () => {
    const version = readFileSync(join(ROOT, "VERSION"), "utf8").trim();
    const printed = await run(process.execPath, [CHECKOUT_CASQ_BIN, "--version"]);
    expect(printed.code, printed.stderr).toBe(0);
    expect(printed.stdout.trim()).toBe(version);
    const broker = await startServer({ store: `file:${store.path}`, bin: CHECKOUT_CASQ_BIN });
    try {
      const created = await run(process.execPath, [
        CHECKOUT_CASQ_BIN,
        "queue",
        "create",
        "launched",
        "--server",
        broker.address,
      ]);
      expect(created.code, created.stderr).toBe(0);
    } finally {
      await broker.stop("SIGTERM");
    }
  });
});
