/**
 * One chaos run, start to verdict:
 *
 * 1. Three `casq serve` processes on one store (a file store in the run's
 *    temporary directory, or a prefix of an S3 bucket) with a short leader
 *    lease, and a queue with two shards.
 * 2. A producer and a worker in each SDK language (six processes), every one
 *    configured with every broker address and writing its history.
 * 3. Load for `seconds` with the seeded nemesis (`nemesis.ts`) at work.
 * 4. The nemesis stops and undoes its fault; every broker runs again. The
 *    producers are stopped (each finishes the enqueue it has in flight), the
 *    workers drain until the queue's depth is 0 or the drain deadline passes,
 *    then stop gracefully.
 * 5. The final GetQueue and dead letters, and every history, go to the
 *    checker (`checker.ts`). Client or broker processes that exited without
 *    being told to are violations too.
 *
 * The summary is one JSON object; the run's directory (histories and store)
 * is removed unless something was found or `keep` is set.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Admin } from "@casq/sdk";
import { SimRandom } from "../sim/sim-random.ts";
import { S3_TEST_CREDENTIALS, S3_TEST_REGION } from "../support/s3-server.ts";
import { type CheckCounts, checkHistories, type Violation } from "./checker.ts";
import {
  buildGoClient,
  type ClientProcess,
  type ClientSettings,
  LANGS,
  type Lang,
  type Role,
  startClient,
  stopClient,
} from "./clients.ts";
import { Cluster } from "./cluster.ts";
import { type HistoryRecord, readHistory } from "./history.ts";
import { NEMESIS_KINDS, type NemesisEvent, type NemesisKind, runNemesis } from "./nemesis.ts";

/** Where the brokers keep their state. */
export type StoreKind = "file" | "s3";

/** Options of {@link runChaos}. */
export interface ChaosOptions {
  /** Length of the load phase with the nemesis, seconds. */
  readonly seconds: number;
  readonly seed: number;
  readonly store: StoreKind;
  /** For `s3`: the S3-compatible server and bucket. */
  readonly s3?: { readonly endpoint: string; readonly bucket: string };
  /** Fault kinds (default all). */
  readonly kinds?: readonly NemesisKind[];
  /** `--leader-lease` in ms (default 2 000). */
  readonly leaderLeaseMs?: number;
  /** Per producer, messages per second (default 6). */
  readonly rate?: number;
  /** Per worker, handlers at once (default 4). */
  readonly concurrency?: number;
  /** Lease TTL of the jobs, ms (default 3 000). */
  readonly leaseTtlMs?: number;
  /** Longest drain, ms (default 120 000). */
  readonly drainTimeoutMs?: number;
  /** Keep the run's directory even when nothing was found. */
  readonly keep?: boolean;
  /** Progress lines (default: none). */
  readonly log?: (line: string) => void;
}

/** The JSON summary of a run. */
export interface ChaosSummary {
  readonly seed: number;
  readonly seconds: number;
  readonly store: StoreKind;
  readonly brokers: number;
  readonly leaderLeaseMs: number;
  /** Every client process, with what it was told: enqueues acknowledged, or deliveries and acks sent. */
  readonly clients: Record<string, { enqueued?: number; delivered?: number; acked?: number }>;
  readonly counts: CheckCounts & { nemesis: Record<string, number> };
  readonly final: { depth: number; deadLetters: number; drainedInMs: number | null };
  readonly wallSeconds: number;
  readonly violations: Violation[];
  /** The run's directory, when kept. */
  readonly dir?: string;
}

const QUEUE = "chaos";
const BROKERS = 3;

/** Runs one chaos run and returns its summary (it never throws for a violation, only for a broken harness). */
export async function runChaos(options: ChaosOptions): Promise<ChaosSummary> {
  const startedAt = Date.now();
  const log = (line: string) =>
    options.log?.(`[chaos +${Math.round((Date.now() - startedAt) / 1000)}s] ${line}`);
  const leaderLeaseMs = options.leaderLeaseMs ?? 2_000;
  const dir = mkdtempSync(join(tmpdir(), `casq-chaos-${options.seed}-`));
  const random = new SimRandom(options.seed);
  const nemesisSeed = random.int(0, 2 ** 31);

  let storeUrl: string;
  let env: Record<string, string> | undefined;
  if (options.store === "s3") {
    if (!options.s3) throw new Error("an s3 chaos run needs options.s3 (endpoint and bucket)");
    const prefix = `chaos-${options.seed}-${startedAt}`;
    const query = new URLSearchParams({
      endpoint: options.s3.endpoint,
      region: S3_TEST_REGION,
      path_style: "true",
    });
    storeUrl = `s3://${options.s3.bucket}/${prefix}?${query}`;
    env = {
      AWS_ACCESS_KEY_ID: S3_TEST_CREDENTIALS.accessKeyId,
      AWS_SECRET_ACCESS_KEY: S3_TEST_CREDENTIALS.secretAccessKey,
      AWS_REGION: S3_TEST_REGION,
    };
  } else {
    storeUrl = `file:${join(dir, "store")}`;
  }

  log(`seed ${options.seed}, store ${options.store}, ${options.seconds} s of load in ${dir}`);
  const [goBinary, cluster] = await Promise.all([
    buildGoClient(dir),
    Cluster.start({
      store: storeUrl,
      brokers: BROKERS,
      leaderLease: `${leaderLeaseMs}ms`,
      log,
      ...(env ? { env } : {}),
    }),
  ]);
  const admin = new Admin({ brokers: cluster.addresses, timeoutMs: 3_000, retryTimeoutMs: 30_000 });
  const clients: ClientProcess[] = [];
  const expectedExit = new Set<ClientProcess>();
  const crashes: Violation[] = [];
  // Kept when asked, when something was found, or when the harness itself failed.
  let keepDir = true;
  try {
    await admin.createQueue(QUEUE, {
      shardCount: 2,
      config: {
        leaseTtl: durationFromMs(options.leaseTtlMs ?? 3_000),
        maxAttempts: 50,
        dedupWindow: durationFromMs(3_600_000),
      },
    });

    const settings: ClientSettings = {
      brokers: cluster.addresses,
      queue: QUEUE,
      dir,
      goBinary,
      rate: options.rate ?? 6,
      concurrency: options.concurrency ?? 4,
      leaseTtlMs: options.leaseTtlMs ?? 3_000,
      holdMaxMs: 4_500,
    };
    const serial = new Map<string, number>();
    const launch = (lang: Lang, role: Role): ClientProcess => {
      const n = (serial.get(`${lang}-${role}`) ?? 0) + 1;
      serial.set(`${lang}-${role}`, n);
      const client = startClient(settings, lang, role, `${lang}-${role}-${n}`, random.int(1, 2 ** 31));
      clients.push(client);
      void client.exited.then((code) => {
        if (expectedExit.has(client)) return;
        crashes.push({
          kind: "process-crash",
          subject: client.name,
          detail: `${client.name} exited (code ${code}, signal ${client.child.signalCode}) on its own: ${client.output().slice(-1500)}`,
        });
      });
      return client;
    };
    const workers = new Map<Lang, ClientProcess>();
    const producers: ClientProcess[] = [];
    for (const lang of LANGS) {
      workers.set(lang, launch(lang, "worker"));
      producers.push(launch(lang, "producer"));
    }

    const killWorker = async (r: SimRandom): Promise<string | undefined> => {
      const busy = [...workers.values()].filter((w) => openJobs(w) > 0);
      if (busy.length === 0) return undefined;
      const victim = r.pick(busy);
      expectedExit.add(victim);
      victim.child.kill("SIGKILL");
      await victim.exited;
      workers.set(victim.lang, launch(victim.lang, "worker"));
      return victim.name;
    };

    const stopNemesis = new AbortController();
    const nemesis = runNemesis(
      {
        cluster,
        admin,
        queue: QUEUE,
        leaderLeaseMs,
        killWorker,
      },
      {
        seed: nemesisSeed,
        kinds: options.kinds ?? NEMESIS_KINDS,
        onEvent: (e) => log(`${e.kind} ${e.target} (${e.durationMs} ms)`),
      },
      stopNemesis.signal,
    );
    const loadTimer = setTimeout(() => stopNemesis.abort(), options.seconds * 1000);
    const events: NemesisEvent[] = await nemesis;
    clearTimeout(loadTimer);
    log(`load over: ${events.length} faults; healing the cluster and stopping the producers`);

    await cluster.heal();
    await Promise.all(
      producers.map(async (p) => {
        expectedExit.add(p);
        await stopClient(p, 90_000);
      }),
    );

    log("draining");
    const drainStart = Date.now();
    const drainDeadline = drainStart + (options.drainTimeoutMs ?? 120_000);
    let depth = Number.NaN;
    let drainedInMs: number | null = null;
    for (;;) {
      try {
        depth = Number((await admin.getQueue(QUEUE, { timeoutMs: 5_000 })).totals?.depth ?? 0n);
      } catch (error) {
        log(`GetQueue failed while draining: ${String(error)}`);
      }
      if (depth === 0) {
        drainedInMs = Date.now() - drainStart;
        break;
      }
      if (Date.now() > drainDeadline) break;
      await new Promise((r) => setTimeout(r, 500));
    }
    log(drainedInMs === null ? `drain deadline passed at depth ${depth}` : `drained in ${drainedInMs} ms`);

    await Promise.all(
      [...workers.values()].map(async (w) => {
        expectedExit.add(w);
        await stopClient(w, 20_000);
      }),
    );
    const final = await admin.getQueue(QUEUE, { timeoutMs: 10_000 });
    const dead = await admin.listDeadLetters(QUEUE, { timeoutMs: 10_000 });
    depth = Number(final.totals?.depth ?? 0n);

    const records = clients.flatMap((c) => readHistory(c.history));
    const checked = checkHistories(records, {
      depth,
      deadLetterIds: dead.map((d) => d.message?.id ?? ""),
    });
    const violations = [...checked.violations, ...crashes];
    for (const crash of cluster.crashes)
      violations.push({
        kind: "process-crash",
        subject: crash.broker,
        detail: `broker ${crash.broker} exited (code ${crash.code}, signal ${crash.signal}) on its own: ${crash.output}`,
      });
    const nemesisCounts: Record<string, number> = {};
    for (const kind of options.kinds ?? NEMESIS_KINDS) nemesisCounts[kind] = 0;
    for (const event of events) nemesisCounts[event.kind] = (nemesisCounts[event.kind] ?? 0) + 1;
    keepDir = options.keep === true || violations.length > 0;
    return {
      seed: options.seed,
      seconds: options.seconds,
      store: options.store,
      brokers: BROKERS,
      leaderLeaseMs,
      clients: perClient(records),
      counts: { ...checked.counts, nemesis: nemesisCounts },
      final: { depth, deadLetters: dead.length, drainedInMs },
      wallSeconds: Math.round((Date.now() - startedAt) / 1000),
      violations,
      ...(keepDir ? { dir } : {}),
    };
  } finally {
    for (const client of clients) {
      expectedExit.add(client);
      if (client.child.exitCode === null && client.child.signalCode === null) client.child.kill("SIGKILL");
    }
    await cluster.stop();
    if (keepDir) log(`kept ${dir}`);
    else rmSync(dir, { recursive: true, force: true });
  }
}

/** What each client process was told, by its history. */
function perClient(records: readonly HistoryRecord[]): ChaosSummary["clients"] {
  const out: Record<string, { enqueued?: number; delivered?: number; acked?: number }> = {};
  const bump = (proc: string, key: "enqueued" | "delivered" | "acked") => {
    const entry = out[proc] ?? {};
    entry[key] = (entry[key] ?? 0) + 1;
    out[proc] = entry;
  };
  for (const r of records) {
    out[r.proc] ??= {};
    if (r.kind === "enqueue-ok") bump(r.proc, "enqueued");
    else if (r.kind === "deliver") bump(r.proc, "delivered");
    else if (r.kind === "ack-sent") bump(r.proc, "acked");
  }
  return out;
}

/** Deliveries a worker started that it has not finished (by its history so far). */
function openJobs(worker: ClientProcess): number {
  const open = new Set<string>();
  try {
    for (const r of readHistory(worker.history)) {
      if (r.kind === "deliver") open.add(r.receipt);
      else if (r.kind === "ack-sent" || r.kind === "nack-sent" || r.kind === "lease-lost")
        open.delete(r.receipt);
    }
  } catch {
    return 0; // not written yet
  }
  return open.size;
}
