/**
 * `casq health`, the check the container recipe's HEALTHCHECK runs: against a
 * real `casq serve` it prints SERVING and exits 0; a service the broker does
 * not serve is not found (exit 3); nothing listening is exit 4.
 */
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { CASQ_BIN as CASQ } from "../e2e/support/processes.ts";
import { outsideDir, runProgram, type StartedBroker, startBroker, within } from "./support.ts";

describe("casq health", () => {
  const store = outsideDir("health-store");
  let broker: StartedBroker;

  beforeAll(async () => {
    broker = await startBroker([
      "node",
      CASQ,
      "serve",
      "--store",
      `file:${store.path}`,
      "--listen",
      "127.0.0.1:0",
    ]);
  });
  afterAll(async () => {
    broker.child.kill("SIGTERM");
    await within("the broker to exit", broker.exited, 30_000);
    store.remove();
  });

  test("a serving broker: SERVING, exit 0 (for the server and for a casq service)", async () => {
    const whole = await runProgram("node", [CASQ, "health", "--server", broker.address]);
    expect([whole.code, whole.stdout.trim()]).toEqual([0, "SERVING"]);
    const queue = await runProgram("node", [
      CASQ,
      "health",
      "--server",
      broker.address,
      "--service",
      "casq.v1.QueueService",
    ]);
    expect([queue.code, queue.stdout.trim()]).toEqual([0, "SERVING"]);
  });

  test("a service the broker does not serve is not found: exit 3", async () => {
    const result = await runProgram("node", [
      CASQ,
      "health",
      "--server",
      broker.address,
      "--service",
      "no.Such",
    ]);
    expect(result.code).toBe(3);
  });

  test("nothing listening: exit 4 with the address in the message", async () => {
    const result = await runProgram("node", [CASQ, "health", "--server", "127.0.0.1:1", "--timeout", "5s"]);
    expect(result.code).toBe(4);
    expect(result.stderr).toContain("127.0.0.1:1");
  });
});
