/**
 * A casq server whose store answers every PUT after a fixed delay: the
 * S3-like profile of the benchmark (object stores take ~100-200 ms per PUT).
 * It is the file store behind the fault-injecting wrapper, started in-process
 * the way `casq serve` starts (with its default heap growth, before anything
 * else); it prints the same "listening on" and "metrics on" lines.
 *
 *   tsx bench/systems/slow-store-server.ts DIR PUT_LATENCY_MS
 */
import pino from "pino";
import { applyHeapGrowth, DEFAULT_HEAP_GROWTH_PERCENT } from "../../server/src/cli/heap-growth.ts";
import { startCasqServer } from "../../server/src/service/casq-server.ts";
import { openStore } from "../../server/src/store/open-store.ts";
import { FaultInjectingStore } from "../../server/testing/fault-injecting-store.ts";

const [dir, latency] = process.argv.slice(2);
if (!dir || !latency) {
  console.error("usage: tsx bench/systems/slow-store-server.ts DIR PUT_LATENCY_MS");
  process.exit(2);
}
applyHeapGrowth(DEFAULT_HEAP_GROWTH_PERCENT);
const store = new FaultInjectingStore(openStore(`file:${dir}`), {
  latency: { put: { kind: "fixed", ms: Number(latency) } },
});
const logger = pino({ level: "warn", base: { service: "casq" } }, pino.destination(2));
const server = await startCasqServer({ store, listen: "127.0.0.1:0", metricsListen: "127.0.0.1:0", logger });
console.log(`casq serve: listening on ${server.address}`);
console.log(`casq serve: metrics on http://${server.metricsAddress}/metrics`);
process.on("SIGTERM", () => {
  void server.close({ graceful: true, timeoutMs: 5_000 }).then(() => process.exit(0));
});
