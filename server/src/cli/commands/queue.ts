/**
 * `casq queue create|update|delete|list`: manages queues
 * (AdminService.CreateQueue, UpdateQueue, DeleteQueue, ListQueues). The
 * config flags are shared by create (unset: defaults) and update (unset:
 * unchanged); the shard count is fixed at creation.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import type { Command } from "commander";
import { Option } from "commander";
import { QueueConfigSchema } from "../api.ts";
import { CliError, usageError } from "../cli-error.ts";
import { addConnectionOptions, type ClientOptions, clientFromOptions } from "../client.ts";
import { jsonOption, messageJson, printJson, printLines, table } from "../output.ts";
import { intIn, numberIn, parseDurationMs, parseUint64 } from "../parse.ts";
import { describeConfig } from "./stats.ts";

/** The config flags, as commander parses them. */
interface ConfigFlags {
  leaseTtl?: number;
  maxAttempts?: number;
  backoffInitial?: number;
  backoffMultiplier?: number;
  backoffMax?: number;
  backoffJitter?: number;
  dedupWindow?: number;
  retention?: number;
  maxPayloadBytes?: number;
  maxDocumentBytes?: bigint;
  maxBatch?: number;
  deadLetterLimit?: number;
  maxHeaders?: number;
  maxHeaderBytes?: number;
  maxSubscriptions?: number;
}

interface QueueCommandOptions extends ClientOptions, ConfigFlags {
  shards?: number;
  ifNotExists?: boolean;
  force?: boolean;
  yes?: boolean;
  json?: boolean;
}

function addConfigOptions(command: Command): Command {
  return command
    .option(
      "--lease-ttl <duration>",
      "lease of a claim without its own, 100ms..24h (default 60s)",
      parseDurationMs,
    )
    .option("--max-attempts <n>", "deliveries before dead-lettering, 1..1000 (default 5)", intIn(1, 1000))
    .option(
      "--backoff-initial <duration>",
      "retry delay after the first failure (default 1s)",
      parseDurationMs,
    )
    .option("--backoff-multiplier <x>", "growth per further failure, 1..100 (default 2)", numberIn(1, 100))
    .option("--backoff-max <duration>", "cap of any retry delay (default 5m)", parseDurationMs)
    .option("--backoff-jitter <x>", "relative jitter 0..1 (default 0.2)", numberIn(0, 1))
    .option(
      "--dedup-window <duration>",
      "how long dedup ids are remembered, 0 disables (default 5m)",
      parseDurationMs,
    )
    .option("--retention <duration>", "keep settled messages this long (default 0s)", parseDurationMs)
    .option("--max-payload-bytes <n>", "largest payload (default 1048576)", intIn(1, 2 ** 30))
    .option("--max-document-bytes <n>", "largest shard document (default 67108864)", parseUint64)
    .option("--max-batch <n>", "most messages/receipts per call (default 1000)", intIn(1, 100_000))
    .option(
      "--dead-letter-limit <n>",
      "dead letters kept per subscription and shard (default 10000)",
      intIn(0, 1_000_000),
    )
    .option("--max-headers <n>", "most headers per message (default 64)", intIn(0, 1024))
    .option("--max-header-bytes <n>", "largest total header size (default 16384)", intIn(0, 2 ** 20))
    .option("--max-subscriptions <n>", "most subscriptions (default 64)", intIn(1, 1000));
}

/** The QueueConfig holding exactly the flags that were given, and whether any was. */
function configFromFlags(flags: ConfigFlags): {
  config: MessageInitShape<typeof QueueConfigSchema>;
  any: boolean;
} {
  const backoff = {
    ...(flags.backoffInitial !== undefined && { initialDelay: durationFromMs(flags.backoffInitial) }),
    ...(flags.backoffMultiplier !== undefined && { multiplier: flags.backoffMultiplier }),
    ...(flags.backoffMax !== undefined && { maxDelay: durationFromMs(flags.backoffMax) }),
    ...(flags.backoffJitter !== undefined && { jitter: flags.backoffJitter }),
  };
  const limits = {
    ...(flags.maxPayloadBytes !== undefined && { maxPayloadBytes: flags.maxPayloadBytes }),
    ...(flags.maxDocumentBytes !== undefined && { maxDocumentBytes: flags.maxDocumentBytes }),
    ...(flags.maxBatch !== undefined && { maxBatch: flags.maxBatch }),
    ...(flags.deadLetterLimit !== undefined && { deadLetterLimit: flags.deadLetterLimit }),
    ...(flags.maxHeaders !== undefined && { maxHeaders: flags.maxHeaders }),
    ...(flags.maxHeaderBytes !== undefined && { maxHeaderBytes: flags.maxHeaderBytes }),
    ...(flags.maxSubscriptions !== undefined && { maxSubscriptions: flags.maxSubscriptions }),
  };
  const config = {
    ...(flags.leaseTtl !== undefined && { leaseTtl: durationFromMs(flags.leaseTtl) }),
    ...(flags.maxAttempts !== undefined && { maxAttempts: flags.maxAttempts }),
    ...(Object.keys(backoff).length > 0 && { backoff }),
    ...(flags.dedupWindow !== undefined && { dedupWindow: durationFromMs(flags.dedupWindow) }),
    ...(flags.retention !== undefined && { retention: durationFromMs(flags.retention) }),
    ...(Object.keys(limits).length > 0 && { limits }),
  };
  return { config, any: Object.keys(config).length > 0 };
}

/** Registers `casq queue` and its subcommands. */
export function registerQueue(program: Command): void {
  const queue = program
    .command("queue")
    .description("create, update, delete or list queues")
    .addHelpText(
      "after",
      `
Examples:
  $ casq queue create jobs --shards 4 --lease-ttl 2m --max-attempts 10
  $ casq queue update jobs --backoff-initial 5s --backoff-max 1h
  $ casq queue list
  $ casq queue delete jobs --yes`,
    );

  const create = queue
    .command("create")
    .description('create a queue (with the subscription "default")')
    .argument("<queue>", "queue name: [a-z0-9][a-z0-9._-]{0,127}")
    .addOption(
      new Option("--shards <n>", "number of shards, 1..256, fixed for the queue's life")
        .default(1)
        .argParser(intIn(1, 256)),
    )
    .option(
      "--if-not-exists",
      "a queue of that name is fine: show it as it is (flags not applied) and exit 0 instead of failing",
    );
  addConfigOptions(create).addOption(jsonOption());
  addConnectionOptions(create);
  create.addHelpText(
    "after",
    `
More shards spread load over more documents (and brokers); order then holds only per key.

Without --if-not-exists, an existing queue is an error (exit 1, ALREADY_EXISTS).

Examples:
  $ casq queue create jobs
  $ casq queue create events --shards 4 --retention 1h --dedup-window 0s
  $ casq queue create jobs --if-not-exists    # idempotent, e.g. in a deploy script`,
  );
  create.action(async (name: string, options: QueueCommandOptions) => {
    const { config } = configFromFlags(options);
    const client = clientFromOptions(options);
    try {
      const response = await client.call((c, o) =>
        c.admin.createQueue(
          {
            queue: name,
            shardCount: options.shards ?? 1,
            config,
            ifNotExists: options.ifNotExists === true,
          },
          o,
        ),
      );
      if (options.json) {
        printJson({
          queue: response.queue,
          shardCount: response.shardCount,
          config: response.config === undefined ? null : messageJson(QueueConfigSchema, response.config),
          created: response.created,
        });
        return;
      }
      const shards = `${response.shardCount} shard${response.shardCount === 1 ? "" : "s"}`;
      printLines(
        response.created
          ? `created queue ${response.queue} with ${shards}`
          : `queue ${response.queue} already exists with ${shards} (unchanged)`,
        `  config: ${describeConfig(response.config)}`,
      );
    } finally {
      client.close();
    }
  });

  const update = queue
    .command("update")
    .description("change config fields of a queue (unset flags keep their values)")
    .argument("<queue>", "queue name");
  addConfigOptions(update).addOption(jsonOption());
  addConnectionOptions(update);
  update.addHelpText(
    "after",
    `
Leases already granted keep their TTL; lowering --dead-letter-limit evicts the oldest dead letters.

Examples:
  $ casq queue update jobs --lease-ttl 5m
  $ casq queue update jobs --max-attempts 3 --dead-letter-limit 100`,
  );
  update.action(async (name: string, options: QueueCommandOptions) => {
    const { config, any } = configFromFlags(options);
    if (!any)
      throw usageError("nothing to change: give at least one config flag (see casq queue update --help)");
    const client = clientFromOptions(options);
    try {
      const response = await client.call((c, o) => c.admin.updateQueue({ queue: name, config }, o));
      if (options.json) {
        printJson({
          config: response.config === undefined ? null : messageJson(QueueConfigSchema, response.config),
          deadLettersEvicted: Number(response.deadLettersEvicted),
        });
        return;
      }
      printLines(`updated queue ${name}`, `  config: ${describeConfig(response.config)}`);
      if (response.deadLettersEvicted > 0n)
        printLines(`  evicted ${response.deadLettersEvicted} dead letters`);
    } finally {
      client.close();
    }
  });

  const del = queue
    .command("delete")
    .description("delete a queue with all its messages, dead letters and dedup ids")
    .argument("<queue>", "queue name")
    .option("--force", "delete even if it still holds unsettled messages or dead letters")
    .option("--yes", "really do it");
  addConnectionOptions(del);
  del.addHelpText(
    "after",
    `
Without --force a queue that still holds work is refused (FAILED_PRECONDITION, exit 1).

Examples:
  $ casq queue delete scratch --yes
  $ casq queue delete old-jobs --force --yes`,
  );
  del.action(async (name: string, options: QueueCommandOptions) => {
    if (!options.yes) throw usageError(`deleting ${name} cannot be undone; re-run with --yes`);
    const client = clientFromOptions(options);
    try {
      await client
        .call((c, o) => c.admin.deleteQueue({ queue: name, force: options.force === true }, o))
        .catch((error: CliError) => {
          if (!error.message.startsWith("FAILED_PRECONDITION")) throw error;
          throw new CliError(
            error.exitCode,
            `${error.message}\n  empty it first (casq purge ${name} --yes) or delete it anyway with --force`,
          );
        });
      printLines(`deleted queue ${name}`);
    } finally {
      client.close();
    }
  });

  const list = queue.command("list").description("list the queues in the store").addOption(jsonOption());
  addConnectionOptions(list);
  list.addHelpText(
    "after",
    "\nExamples:\n  $ casq queue list\n  $ casq queue list --json | jq -r '.queues[].name'",
  );
  list.action(async (options: QueueCommandOptions) => {
    const client = clientFromOptions(options);
    try {
      const queues: { name: string; shardCount: number }[] = [];
      let pageToken = "";
      do {
        const page = await client.call((c, o) => c.admin.listQueues({ pageSize: 1000, pageToken }, o));
        queues.push(...page.queues.map((q) => ({ name: q.name, shardCount: q.shardCount })));
        pageToken = page.nextPageToken;
      } while (pageToken !== "");
      if (options.json) printJson({ queues });
      else if (queues.length === 0) printLines("no queues yet; create one with: casq queue create NAME");
      else
        printLines(
          ...table(
            ["QUEUE", "SHARDS"],
            queues.map((q) => [q.name, q.shardCount]),
          ),
        );
    } finally {
      client.close();
    }
  });
}
