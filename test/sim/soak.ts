/**
 * Soak runner: many seeds of the simulation in one process, outside vitest.
 *
 *     npx tsx test/sim/soak.ts <count> [firstSeed] [--verbose]
 *
 * Runs seeds `firstSeed .. firstSeed + count - 1` one after another, prints a
 * line per failing seed (with its replay command) and a summary, and exits
 * with status 1 when any seed failed. `scripts/sim-soak.sh` runs several of
 * these in parallel over disjoint seed ranges.
 */
import { failureReport, replayCommand, runSimulation, summaryLine } from "./run-simulation.ts";

async function main(): Promise<void> {
  const args = process.argv.slice(2).filter((a) => !a.startsWith("--"));
  const verbose = process.argv.includes("--verbose");
  const count = Number(args[0] ?? 100);
  const first = Number(args[1] ?? 1);
  if (!Number.isInteger(count) || count < 1 || !Number.isInteger(first)) {
    console.error("usage: tsx test/sim/soak.ts <count> [firstSeed] [--verbose]");
    process.exit(2);
  }
  const failed: number[] = [];
  const started = performance.now();
  let messages = 0;
  let deliveries = 0;
  let redeliveries = 0;
  let faults = 0;
  let takeovers = 0;
  let crashes = 0;
  let virtualMs = 0;
  for (let seed = first; seed < first + count; seed++) {
    let result: Awaited<ReturnType<typeof runSimulation>>;
    try {
      result = await runSimulation(seed);
    } catch (error) {
      failed.push(seed);
      console.log(`seed ${seed}: CRASHED ${error instanceof Error ? error.stack : String(error)}`);
      console.log(`replay: ${replayCommand(seed)}`);
      continue;
    }
    messages += result.audit.acknowledgedMessages;
    deliveries += result.audit.deliveries;
    redeliveries += result.audit.redeliveries;
    faults += Object.values(result.faults).reduce((sum, n) => sum + n, 0);
    takeovers += result.history.takeovers;
    crashes += result.brokers.crashes;
    virtualMs += result.virtualMs;
    if (result.violations.length > 0) {
      failed.push(seed);
      console.log(failureReport(result));
    } else if (verbose) console.log(summaryLine(result));
  }
  const wallS = (performance.now() - started) / 1000;
  console.log(
    `soak: ${count} seeds (${first}..${first + count - 1}), ${failed.length} failed, ` +
      `${messages} messages, ${deliveries} deliveries (${redeliveries} redeliveries), ${faults} faults, ` +
      `${takeovers} epoch changes, ${crashes} broker crashes, ${Math.round(virtualMs / 1000)} virtual s ` +
      `in ${wallS.toFixed(1)} s wall`,
  );
  if (failed.length > 0) {
    console.log(`failed seeds: ${failed.join(" ")}`);
    process.exit(1);
  }
}

await main();
