/**
 * `casq purge QUEUE --yes`: throws work away (AdminService.PurgeQueue). By
 * default every message leaves the queue; `--subscription S` settles only what
 * S has not settled; `--dead-letters` clears dead letters instead of
 * messages. Without `--yes` it only says what would go and exits 2.
 */
import type { Command } from "commander";
import { usageError } from "../cli-error.ts";
import { addConnectionOptions, type ClientOptions, clientFromOptions } from "../client.ts";
import { jsonOption, printJson, printLines } from "../output.ts";

interface PurgeOptions extends ClientOptions {
  subscription?: string;
  deadLetters?: boolean;
  yes?: boolean;
  json?: boolean;
}

/** Registers `casq purge`. */
export function registerPurge(program: Command): void {
  const command = program
    .command("purge")
    .description("throw away a queue's messages (or dead letters); cannot be undone")
    .argument("<queue>", "queue name")
    .option(
      "--subscription <name>",
      "purge only what this subscription has not settled (default: all of them)",
    )
    .option("--dead-letters", "clear dead letters instead of messages")
    .option("--yes", "really do it")
    .addOption(jsonOption());
  addConnectionOptions(command);
  command.addHelpText(
    "after",
    `
Purged leases are lost for their workers (their acks answer LEASE_LOST); dedup ids are kept.

Examples:
  $ casq purge jobs --yes                           # every message leaves the queue
  $ casq purge jobs --subscription audit --yes      # only audit's backlog counts as done
  $ casq purge jobs --dead-letters --yes            # clear every subscription's dead letters`,
  );
  command.action(async (queue: string, options: PurgeOptions) => {
    const client = clientFromOptions(options);
    try {
      const subscription = options.subscription;
      const deadLetters = options.deadLetters === true;
      if (!options.yes) {
        const info = await client.call((c, o) => c.admin.getQueue({ queue }, o));
        const subs =
          subscription === undefined
            ? info.subscriptions
            : info.subscriptions.filter((s) => s.subscription === subscription);
        if (subscription !== undefined && subs.length === 0)
          throw usageError(`${queue} has no subscription "${subscription}"`);
        const scope = subscription === undefined ? "all subscriptions" : `subscription ${subscription}`;
        const what = deadLetters
          ? `${subs.reduce((n, s) => n + s.dead, 0n)} dead letters of ${scope}`
          : subscription === undefined
            ? `${info.totals?.messages ?? 0n} messages (every subscription's backlog)`
            : `${subs.reduce((n, s) => n + s.depth, 0n)} unsettled messages of ${scope}`;
        throw usageError(
          `purge would throw away ${what} of ${queue} and cannot be undone; re-run with --yes`,
        );
      }
      const response = await client.call((c, o) =>
        c.admin.purgeQueue(
          {
            queue,
            subscription: subscription ?? "",
            allSubscriptions: subscription === undefined,
            deadLetters,
          },
          o,
        ),
      );
      if (options.json) {
        printJson({
          messagesPurged: Number(response.messagesPurged),
          leasesDropped: Number(response.leasesDropped),
          deadLettersPurged: Number(response.deadLettersPurged),
        });
        return;
      }
      printLines(
        deadLetters
          ? `purged ${response.deadLettersPurged} dead letters of ${queue}`
          : `purged ${response.messagesPurged} messages of ${queue} (${response.leasesDropped} leases dropped)`,
      );
    } finally {
      client.close();
    }
  });
}
