/**
 * `casq subscription create|delete QUEUE NAME`: manages the consumer groups
 * of a queue (AdminService.CreateSubscription, DeleteSubscription). Every
 * subscription sees every message once (fan-out).
 */
import type { Command } from "commander";
import { Option } from "commander";
import { SubscriptionStart } from "../api.ts";
import { usageError } from "../cli-error.ts";
import { addConnectionOptions, type ClientOptions, clientFromOptions } from "../client.ts";
import { jsonOption, printJson, printLines } from "../output.ts";

interface SubscriptionOptions extends ClientOptions {
  from: "latest" | "earliest";
  yes?: boolean;
  json?: boolean;
}

/** Registers `casq subscription` and its subcommands. */
export function registerSubscription(program: Command): void {
  const subscription = program
    .command("subscription")
    .description("create or delete a subscription (consumer group) of a queue")
    .addHelpText(
      "after",
      `
Examples:
  $ casq subscription create orders audit --from earliest
  $ casq work orders --subscription audit -- ./audit.sh
  $ casq subscription delete orders audit --yes`,
    );

  const create = subscription
    .command("create")
    .description(
      "add a subscription; it sees messages from now on (or every stored one with --from earliest)",
    )
    .argument("<queue>", "queue name")
    .argument("<name>", "subscription name: [a-z0-9][a-z0-9._-]{0,127}")
    .addOption(
      new Option("--from <where>", "where it starts reading")
        .choices(["latest", "earliest"])
        .default("latest"),
    )
    .addOption(jsonOption());
  addConnectionOptions(create);
  create.addHelpText("after", "\nExamples:\n  $ casq subscription create orders audit --from earliest");
  create.action(async (queue: string, name: string, options: SubscriptionOptions) => {
    const client = clientFromOptions(options);
    try {
      const start = options.from === "earliest" ? SubscriptionStart.EARLIEST : SubscriptionStart.LATEST;
      const response = await client.call((c, o) =>
        c.admin.createSubscription({ queue, subscription: name, start }, o),
      );
      if (options.json) {
        printJson({
          subscription: response.subscription,
          start: options.from,
          backlog: Number(response.backlog),
        });
        return;
      }
      printLines(
        `created subscription ${queue}/${response.subscription} (${response.backlog} messages pending for it)`,
      );
    } finally {
      client.close();
    }
  });

  const del = subscription
    .command("delete")
    .description("remove a subscription with its leases, ack state and dead letters")
    .argument("<queue>", "queue name")
    .argument("<name>", "subscription name")
    .option("--yes", "really do it")
    .addOption(jsonOption());
  addConnectionOptions(del);
  del.addHelpText("after", "\nExamples:\n  $ casq subscription delete orders audit --yes");
  del.action(async (queue: string, name: string, options: SubscriptionOptions) => {
    if (!options.yes) throw usageError(`deleting ${queue}/${name} cannot be undone; re-run with --yes`);
    const client = clientFromOptions(options);
    try {
      const r = await client.call((c, o) => c.admin.deleteSubscription({ queue, subscription: name }, o));
      if (options.json) {
        printJson({
          messagesDropped: Number(r.messagesDropped),
          leasesDropped: Number(r.leasesDropped),
          deadLettersDropped: Number(r.deadLettersDropped),
        });
        return;
      }
      printLines(
        `deleted subscription ${queue}/${name}: ${r.messagesDropped} messages, ${r.leasesDropped} leases and ` +
          `${r.deadLettersDropped} dead letters went with it`,
      );
    } finally {
      client.close();
    }
  });
}
