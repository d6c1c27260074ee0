/**
 * `casq serve --warm-sealed-messages`: beyond that many sealed messages per
 * shard, untouched segments go cold (only their index entry in memory), as
 * the broker's metrics show; their messages are still delivered, whole and in
 * order. Bad values are usage errors.
 */
import { afterAll, describe, expect, it } from "vitest";
import { Admin, Producer, Worker } from "../../sdk/ts/src/index.ts";
import { parseExposition, sampleValue } from "../telemetry/exposition.ts";
import { type CasqServerProcess, casq, startServer, tempDir, waitFor } from "./support/processes.ts";

const servers: CasqServerProcess[] = [];
const stores: ReturnType<typeof tempDir>[] = [];

afterAll(async () => {
  await Promise.all(servers.map((s) => s.stop("SIGKILL")));
  for (const store of stores) store.remove();
});

/** The value of `name{queue="jobs"}` in the broker's metrics (0 when absent). */
async function gauge(server: CasqServerProcess, name: string): Promise<number> {
  let address = "";
  await waitFor("the metrics address", () => {
    address = /metrics on http:\/\/(\S+)\/metrics/.exec(server.output())?.[1] ?? "";
    return address !== "";
  });
  const metrics = parseExposition(await (await fetch(`http://${address}/metrics`)).text());
  return sampleValue(metrics, name, { queue: "jobs" }) ?? 0;
}

async function run(warm: string | undefined): Promise<{ cold: number; delivered: string[] }> {
  const store = tempDir("warm-sealed");
  stores.push(store);
  const args = [
    "--metrics-listen",
    "127.0.0.1:0",
    ...(warm === undefined ? [] : ["--warm-sealed-messages", warm]),
  ];
  const server = await startServer({ store: `file:${store.path}`, args });
  if (!server) throw new Error("broker did not start");
  servers.push(server);
  const brokers = [server.address];
  await new Admin({ brokers }).createQueue("jobs", { shardCount: 1 });
  const producer = new Producer({ brokers });
  const payload = (i: number) => new TextEncoder().encode(`job-${i}-${"x".repeat(1000)}`);
  for (let i = 0; i < 3000; i += 500)
    await producer.enqueueBatch(
      "jobs",
      Array.from({ length: 500 }, (_, k) => ({ payload: payload(i + k) })),
    );
  const cold = await gauge(server, "casq_cold_messages");
  const delivered: string[] = [];
  const worker = new Worker({ brokers, logger: null });
  const running = worker.run(
    "jobs",
    (job) => {
      const text = job.text();
      if (/^job-\d+-x{1000}$/.test(text)) delivered.push(text.split("-")[1] as string);
    },
    { concurrency: 8 },
  );
  await waitFor("3,000 jobs handled", () => new Set(delivered).size >= 3000, 60_000);
  await worker.stop({ timeoutMs: 5_000 });
  await running;
  return { cold, delivered };
}

describe("--warm-sealed-messages", () => {
  it("with 0, sealed segments go cold and are still delivered; with the default, none of 3,000 is cold", async () => {
    const none = await run("0");
    expect(none.cold).toBeGreaterThan(1000);
    expect(new Set(none.delivered).size).toBe(3000);
    const byDefault = await run(undefined);
    expect(byDefault.cold).toBe(0);
    expect(new Set(byDefault.delivered).size).toBe(3000);
  });

  it("refuses values that are not a whole number up to 100,000,000", async () => {
    for (const value of ["-1", "1.5", "lots", "100000001"]) {
      const r = await casq([
        "serve",
        "--store",
        "memory:",
        "--listen",
        "127.0.0.1:0",
        "--warm-sealed-messages",
        value,
      ]);
      expect(r.code, value).toBe(2);
      expect(r.stderr).toContain("--warm-sealed-messages");
    }
  });
});
