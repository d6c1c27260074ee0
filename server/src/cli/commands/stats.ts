/**
 * `casq stats [QUEUE]`: how much work is waiting, running and dead. Without
 * QUEUE, one line per queue in the store (a queue whose manifest cannot be
 * read gets a line with its problem, the others are still shown, and the
 * command exits 1); with QUEUE, its config, totals,
 * per-subscription figures and per-shard leaders (AdminService.GetQueue,
 * answered by any broker: shards it does not lead are read from the store).
 */
import type { Command } from "commander";
import { type GetQueueResponse, GetQueueResponseSchema, type QueueConfig } from "../api.ts";
import { CliError, ExitCode } from "../cli-error.ts";
import { addConnectionOptions, type ClientOptions, clientFromOptions } from "../client.ts";
import {
  formatBytes,
  formatDuration,
  formatTimestamp,
  jsonOption,
  messageJson,
  printJson,
  printLines,
  table,
} from "../output.ts";

interface StatsOptions extends ClientOptions {
  json?: boolean;
}

/** What the figures mean; printed under the tables and in --help. */
export const LEGEND = [
  "READY claimable now · IN-FLIGHT leased to workers · DELAYED waiting for run_at or a retry backoff ·",
  "DEAD dead letters · OLDEST age of the oldest unsettled message · LAG offsets from the oldest unsettled",
  "message to the newest, per shard (settled messages in between count too, so LAG can exceed READY).",
  "A message pending for two subscriptions counts once per subscription in READY..LAG, once in MESSAGES.",
];

/** `n` and the noun, in the singular for 1: `1 message`, `2 messages`. */
function count(n: number | bigint, noun: string, plural = `${noun}s`): string {
  return `${n} ${BigInt(n) === 1n ? noun : plural}`;
}

/** Registers `casq stats`. */
export function registerStats(program: Command): void {
  const command = program
    .command("stats")
    .description("show queue statistics: every queue, or one queue in detail")
    .argument("[queue]", "queue name; omit it for a summary of every queue")
    .addOption(jsonOption());
  addConnectionOptions(command);
  command.addHelpText(
    "after",
    `
${LEGEND.join("\n")}
--json prints numbers as JSON numbers (exact up to 2^53), durations as "1.500s".

Examples:
  $ casq stats
  $ casq stats jobs
  $ casq stats jobs --json | jq -r '.totals.depth'`,
  );
  command.action(async (queue: string | undefined, options: StatsOptions) => {
    const client = clientFromOptions(options);
    try {
      if (queue !== undefined) {
        const response = await client.call((c, o) => c.admin.getQueue({ queue }, o));
        if (options.json) printJson(messageJson(GetQueueResponseSchema, response));
        else printLines(...describeQueue(response));
        return;
      }
      const names: string[] = [];
      const problems: { queue: string; problem: string }[] = [];
      let pageToken = "";
      do {
        const page = await client.call((c, o) => c.admin.listQueues({ pageSize: 1000, pageToken }, o));
        for (const q of page.queues) {
          if (q.problem === "") names.push(q.name);
          else problems.push({ queue: q.name, problem: q.problem });
        }
        pageToken = page.nextPageToken;
      } while (pageToken !== "");
      const queues: GetQueueResponse[] = [];
      for (const name of names) {
        queues.push(await client.call((c, o) => c.admin.getQueue({ queue: name }, o)));
      }
      if (options.json) {
        printJson({ queues: queues.map((q) => messageJson(GetQueueResponseSchema, q)), problems });
      } else if (queues.length === 0 && problems.length === 0) {
        printLines("no queues yet; create one with: casq queue create NAME");
      } else {
        printLines(
          ...table(
            ["QUEUE", "SHARDS", "MESSAGES", "READY", "IN-FLIGHT", "DELAYED", "DEAD", "LAG", "OLDEST", "SIZE"],
            queues.map((q) => {
              const t = q.totals;
              return [
                q.queue,
                q.shardCount,
                t?.messages ?? 0n,
                t?.ready ?? 0n,
                t?.inFlight ?? 0n,
                t?.delayed ?? 0n,
                t?.dead ?? 0n,
                t?.lag ?? 0n,
                formatDuration(t?.oldestUnackedAge),
                formatBytes(t?.documentBytes ?? 0n),
              ];
            }),
          ),
          ...problems.map((p) => `${p.queue}: CANNOT BE READ: ${p.problem}`),
          "",
          ...LEGEND,
        );
      }
      if (problems.length > 0) {
        throw new CliError(
          ExitCode.serverError,
          `cannot read the manifest of ${problems.map((p) => p.queue).join(", ")} (left untouched; see "Repairing refused shards" in docs/operations.md); the other queues are shown`,
        );
      }
    } finally {
      client.close();
    }
  });
}

/** The human description of one queue. */
export function describeQueue(q: GetQueueResponse): string[] {
  const t = q.totals;
  const lines = [
    `queue ${q.queue}: ${count(q.shardCount, "shard")}, ${count(t?.messages ?? 0n, "message")} stored ` +
      `(${formatBytes(t?.documentBytes ?? 0n)}), ${t?.enqueued ?? 0n} enqueued since creation`,
    `  totals: ready ${t?.ready ?? 0n}, in flight ${t?.inFlight ?? 0n}, delayed ${t?.delayed ?? 0n}, ` +
      `dead ${t?.dead ?? 0n}, offset lag ${t?.lag ?? 0n}, oldest unsettled ${formatDuration(t?.oldestUnackedAge)}`,
    `  config: ${describeConfig(q.config)}`,
    "",
    ...table(
      [
        "SUBSCRIPTION",
        "READY",
        "IN-FLIGHT",
        "DELAYED",
        "DEAD",
        "LAG",
        "OLDEST",
        "DELIVERED",
        "ACKED",
        "RETRIED",
        "DEAD-LETTERED",
      ],
      q.subscriptions.map((s) => [
        s.subscription,
        s.ready,
        s.inFlight,
        s.delayed,
        s.dead,
        s.lag,
        formatDuration(s.oldestUnackedAge),
        s.counters?.delivered ?? 0n,
        s.counters?.acked ?? 0n,
        s.counters?.redelivered ?? 0n,
        s.counters?.deadLettered ?? 0n,
      ]),
    ),
    "",
    ...table(
      ["SHARD", "LEADER", "EPOCH", "LEASE-UNTIL", "HERE", "MESSAGES", "NEXT-OFFSET", "SIZE", "PROBLEM"],
      q.shards.map((s) => [
        s.shard,
        s.leader === undefined ? "(none)" : `${s.leader.address} (${s.leader.brokerId})`,
        s.leader?.epoch ?? 0n,
        formatTimestamp(s.leader?.leaseUntil),
        s.servedHere ? "yes" : "no",
        s.messages,
        s.nextOffset,
        formatBytes(s.documentBytes),
        s.problem === "" ? "-" : s.problem,
      ]),
    ),
    "",
    `observed at ${formatTimestamp(q.observedAt)}`,
    ...LEGEND,
  ];
  return lines;
}

/** One line summarizing a queue config. */
export function describeConfig(config: QueueConfig | undefined): string {
  if (config === undefined) return "(unknown)";
  const b = config.backoff;
  const l = config.limits;
  const backoff =
    b === undefined
      ? "-"
      : `${formatDuration(b.initialDelay)} x${b.multiplier ?? "-"} up to ${formatDuration(b.maxDelay)} ±${
          b.jitter === undefined ? "-" : `${Math.round(b.jitter * 100)}%`
        }`;
  return [
    `lease ${formatDuration(config.leaseTtl)}`,
    `max attempts ${config.maxAttempts ?? "-"}`,
    `backoff ${backoff}`,
    `dedup window ${formatDuration(config.dedupWindow)}`,
    `retention ${formatDuration(config.retention)}`,
    `max payload ${l?.maxPayloadBytes === undefined ? "-" : formatBytes(l.maxPayloadBytes)}`,
    `dead-letter limit ${l?.deadLetterLimit ?? "-"}`,
  ].join(", ");
}
