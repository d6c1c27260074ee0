/**
 * casq's deterministic simulation (in the style of FoundationDB's and
 * SlateDB's): one seed -> one complete, reproducible run of brokers, clients
 * and a misbehaving object store, judged by an auditor.
 *
 * What one run does:
 *
 * 1. **World** (`sim-world.ts`). A single `ManualClock` is the only time;
 *    a seeded random source, split per component, makes every decision. The
 *    truth is one in-memory store whose every landed write is observed
 *    (`observed-store.ts`, `committed-history.ts`). Two or three broker
 *    machines (`broker-slot.ts`) each reach it through their own
 *    fault-injecting link (latency distributions, 5xx, connect timeouts,
 *    409s, lost answers of writes that landed or did not), sometimes with a
 *    `RetryingStore` on top. The queue has one to three shards and two
 *    subscriptions (`default` and `audit`, created first: fan-out).
 * 2. **Chaos** (a minute or so of virtual time). Producers enqueue with and
 *    without dedup ids, keys, priorities, delays (`producer.ts`). Workers long-poll, heartbeat (sometimes too late), ack, nack for retry or to the
 *    dead letters, and crash mid-job (`worker.ts`). Clients follow redirects
 *    and retry `unavailable`, a bounded number of times, never assuming an
 *    unanswered call happened (`sim-client.ts`). In some seeds
 *    (`sdkWorkers`) workers are also, or only, the real TypeScript SDK
 *    `Worker` (`sdk-worker.ts`): it runs against each broker's real
 *    QueueService handlers, the Work stream included (`broker-services.ts`),
 *    over connect's in-memory transport with simulated refused and reset
 *    connections and virtual deadlines (`sim-connections.ts`), and the
 *    auditor hears what crossed its wire (`sdk-wire-audit.ts`). In those
 *    seeds producers are also, or only, the real SDK `Producer`
 *    (`sdk-producer.ts`) over the same simulated connections; the auditor
 *    counts an enqueue only when the SDK returned it. The nemesis
 *    crashes brokers (a new process with a new identity restarts later), stops them
 *    gracefully, partitions one from the store until a rival takes its
 *    leases, and raises fault storms (`nemesis.ts`).
 * 3. **Drain**. Faults off, every machine healthy, producers finish their
 *    last call and stop, workers ack everything, until no shard holds an
 *    unsettled message (or the drain limit says the run is stuck).
 * 4. **Verdict** (`auditor.ts`). Every acknowledged result was checked when it
 *    arrived and every committed version on arrival; the final audit checks
 *    that every acknowledged message reached every subscription and was
 *    acked or dead-lettered with its attempts accounted for, and that leases
 *    never overlapped.
 *
 * Determinism: nothing reads the wall clock or `Math.random`, no real timer
 * runs (the SDK takes the ManualClock, a seeded jitter source and the
 * simulated transports through its internal options); the event loop is
 * only ever turned by the ManualClock's `setImmediate`-based settling. The trace (`trace.ts`) hashes every event,
 * and running a seed twice must give the same hash.
 *
 * Replay a failing seed (it is printed with the violations):
 *
 *     CASQ_SIM_SEED=1234 npx vitest run test/sim
 *     CASQ_SIM_SEED=1234 CASQ_SIM_TRACE=1 npx vitest run test/sim   # print the whole trace
 *
 * Run more seeds: `CASQ_SIM_SEEDS=1000 npx vitest run test/sim`, or
 * `bash scripts/sim-soak.sh 5000` for thousands.
 */
import type { AuditStats, Violation } from "./auditor.ts";
import type { SlotStats } from "./broker-slot.ts";
import type { HistoryStats } from "./committed-history.ts";
import type { SimConfig, SimConfigOverrides } from "./sim-config.ts";
import { SimWorld } from "./sim-world.ts";

/** Everything a run produced. */
export interface SimResult {
  readonly seed: number;
  readonly config: SimConfig;
  readonly violations: readonly Violation[];
  /** True when the drain finished (no unsettled message left). */
  readonly drained: boolean;
  readonly traceHash: string;
  readonly traceEvents: number;
  readonly traceTail: readonly string[];
  readonly virtualMs: number;
  readonly wallMs: number;
  readonly audit: AuditStats;
  readonly history: HistoryStats;
  readonly brokers: SlotStats;
  /** Faults the links injected, by kind. */
  readonly faults: Readonly<Record<string, number>>;
  readonly storeCalls: number;
}

/** Runs one seed to the end and returns its verdict and statistics. */
export async function runSimulation(seed: number, overrides: SimConfigOverrides = {}): Promise<SimResult> {
  const wallStart = performance.now();
  const world = new SimWorld(seed, overrides);
  const { clock, config, auditor } = world;
  const start = clock.now();

  await world.setup();
  world.startChaos();
  await world.advance(config.chaosMs);

  world.calm();
  const drainStart = clock.now();
  let drained = false;
  while (!drained && clock.now() - drainStart < config.maxDrainMs) {
    await world.advance(2_000);
    drained = world.producing === 0 && auditor.drained(config.shards);
  }
  if (!drained)
    auditor.violation("drained", `messages still unsettled ${config.maxDrainMs} ms after the chaos ended`);
  // Let answers already on the wire arrive, then stop the actors.
  await world.advance(2_000);
  world.finish();
  await world.advance(4_000);
  auditor.finalAudit();

  const faults: Record<string, number> = {};
  let storeCalls = 0;
  const brokers: SlotStats = { crashes: 0, restarts: 0, gracefulStops: 0, partitions: 0, storms: 0 };
  for (const slot of world.slots) {
    const stats = slot.link.stats();
    for (const [kind, n] of Object.entries(stats.injected)) faults[kind] = (faults[kind] ?? 0) + n;
    for (const n of Object.values(stats.calls)) storeCalls += n;
    for (const key of Object.keys(brokers) as (keyof SlotStats)[]) brokers[key] += slot.stats[key];
  }
  return {
    seed,
    config,
    violations: auditor.violations,
    drained,
    traceHash: world.trace.digest(),
    traceEvents: world.trace.length,
    traceTail: world.trace.lastLines(),
    virtualMs: clock.now() - start,
    wallMs: performance.now() - wallStart,
    audit: auditor.stats(),
    history: auditor.history.stats(),
    brokers,
    faults,
    storeCalls,
  };
}

/** The command that replays one seed. */
export function replayCommand(seed: number): string {
  return `CASQ_SIM_SEED=${seed} npx vitest run test/sim`;
}

/** A one-line summary of a run. */
export function summaryLine(result: SimResult): string {
  const a = result.audit;
  const faults = Object.values(result.faults).reduce((sum, n) => sum + n, 0);
  const b = result.brokers;
  return [
    `seed ${result.seed}:`,
    result.violations.length === 0 ? "ok" : `${result.violations.length} VIOLATIONS`,
    `shards=${result.config.shards} brokers=${result.config.brokers}${result.config.retryingStore ? "+retry" : ""}`,
    `msgs=${a.acknowledgedMessages} deliveries=${a.deliveries} redeliveries=${a.redeliveries}`,
    `acked=${a.finallyAcked} dead=${a.finallyDead}`,
    `versions=${result.history.versions} takeovers=${result.history.takeovers}`,
    `faults=${faults} crashes=${b.crashes} stops=${b.gracefulStops} partitions=${b.partitions}`,
    `virtual=${Math.round(result.virtualMs / 1000)}s wall=${Math.round(result.wallMs)}ms`,
    `trace=${result.traceHash.slice(0, 12)}`,
  ].join(" ");
}

/** A multi-line report of a failed run: violations, replay command, trace tail. */
export function failureReport(result: SimResult): string {
  const lines = [
    `simulation seed ${result.seed} failed with ${result.violations.length} violation(s):`,
    ...result.violations.slice(0, 20).map((v) => `  [${v.invariant}] t=${v.atMs} ${v.detail}`),
    ...(result.violations.length > 20 ? [`  ... and ${result.violations.length - 20} more`] : []),
    `replay: ${replayCommand(result.seed)}`,
    summaryLine(result),
    "last trace lines:",
    ...result.traceTail.slice(-40).map((line) => `  ${line}`),
  ];
  return lines.join("\n");
}
