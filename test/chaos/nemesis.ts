/**
 * The nemesis of a chaos run: one fault at a time, chosen and timed by a
 * seeded PRNG, each undone before the next begins, so at least one broker
 * is always up and answering.
 *
 * - `kill-leader`: SIGKILL a broker that leads a shard, restart it on its
 *   port after a short pause (its shards move once the leader lease runs out).
 * - `pause-leader`: SIGSTOP a leader for longer than its leader lease, then
 *   SIGCONT: another broker takes its shards over meanwhile, and the thawed
 *   one must learn it was deposed before it answers anything.
 * - `kill-worker`: SIGKILL a worker that holds a job and start a new worker
 *   of the same language (the job is redelivered once its lease expires).
 *
 * The seed fixes which kinds come in which order, their targets and their
 * timings; what the processes do meanwhile is not reproducible.
 */
import type { Admin } from "@casq/sdk";
import { SimRandom } from "../sim/sim-random.ts";
import type { BrokerSlot, Cluster } from "./cluster.ts";

/** A kind of fault. */
export type NemesisKind = "kill-leader" | "pause-leader" | "kill-worker";

/** Every kind of fault. */
export const NEMESIS_KINDS: readonly NemesisKind[] = ["kill-leader", "pause-leader", "kill-worker"];

/** One fault, as it happened. */
export interface NemesisEvent {
  readonly kind: NemesisKind;
  /** Broker name or worker name. */
  readonly target: string;
  /** When it began (ms since the epoch). */
  readonly at: number;
  /** How long the fault lasted, ms. */
  readonly durationMs: number;
}

/** What the nemesis acts on. */
export interface NemesisTargets {
  readonly cluster: Cluster;
  readonly admin: Admin;
  readonly queue: string;
  /** Leader lease of the brokers, ms. */
  readonly leaderLeaseMs: number;
  /** Kills a worker that holds a job and starts a replacement; returns its name, or undefined if none holds one. */
  killWorker(random: SimRandom): Promise<string | undefined>;
}

/** Options of {@link runNemesis}. */
export interface NemesisOptions {
  readonly seed: number;
  /** Kinds to draw from (default all). */
  readonly kinds?: readonly NemesisKind[];
  /** Pause between faults, ms (default 1 500..5 000). */
  readonly gapMs?: readonly [number, number];
  /** Called after each fault is undone. */
  readonly onEvent?: (event: NemesisEvent) => void;
}

/** Runs faults until `signal` aborts; resolves (with the events) once the fault in progress is undone. */
export async function runNemesis(
  targets: NemesisTargets,
  options: NemesisOptions,
  signal: AbortSignal,
): Promise<NemesisEvent[]> {
  const random = new SimRandom(options.seed);
  const kinds = options.kinds ?? NEMESIS_KINDS;
  const [gapMin, gapMax] = options.gapMs ?? [1_500, 5_000];
  const events: NemesisEvent[] = [];
  while (!signal.aborted) {
    await sleep(random.int(gapMin, gapMax), signal);
    if (signal.aborted || kinds.length === 0) break;
    const kind = random.pick(kinds);
    const at = Date.now();
    const target = await act(kind, targets, random);
    if (target === undefined) continue;
    const event: NemesisEvent = { kind, target, at, durationMs: Date.now() - at };
    events.push(event);
    options.onEvent?.(event);
  }
  return events;
}

async function act(
  kind: NemesisKind,
  targets: NemesisTargets,
  random: SimRandom,
): Promise<string | undefined> {
  const { cluster } = targets;
  switch (kind) {
    case "kill-leader": {
      const slot = await pickLeader(targets, random);
      if (!slot) return undefined;
      await cluster.kill(slot);
      await sleep(random.int(200, 2_500));
      await cluster.startBroker(slot);
      return slot.name;
    }
    case "pause-leader": {
      const slot = await pickLeader(targets, random);
      if (!slot) return undefined;
      cluster.freeze(slot);
      await sleep(targets.leaderLeaseMs + random.int(500, 3_000));
      cluster.thaw(slot);
      return slot.name;
    }
    case "kill-worker":
      return targets.killWorker(random);
  }
}

/**
 * A healthy broker that the queue's shards name as leader, when there is one
 * and another broker stays healthy; otherwise any healthy broker but the last.
 */
async function pickLeader(targets: NemesisTargets, random: SimRandom): Promise<BrokerSlot | undefined> {
  const healthy = targets.cluster.healthy;
  if (healthy.length < 2) return undefined;
  let leaders: BrokerSlot[] = [];
  try {
    const queue = await targets.admin.getQueue(targets.queue, { timeoutMs: 3_000 });
    const names = new Set(queue.shards.map((s) => s.leader?.address ?? ""));
    leaders = healthy.filter((slot) => names.has(slot.address));
  } catch {
    // No answer in time: any healthy broker will do.
  }
  return random.pick(leaders.length > 0 ? leaders : healthy);
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const onAbort = () => {
      clearTimeout(timer);
      resolve();
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
