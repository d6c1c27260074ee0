/**
 * `casq repair QUEUE --shard N`: replaces a shard document the brokers refuse
 * (AdminService.RepairShard). It shows what is wrong, asks for confirmation
 * (`--yes` for scripts; without a terminal and without `--yes` it refuses),
 * then the broker copies the refused bytes to a backup key under `repairs/`
 * and writes a fresh or salvaged document, only if the stored one is still
 * the version shown (etag).
 */
import { createInterface } from "node:readline/promises";
import type { Command } from "commander";
import { CliError, ExitCode, usageError } from "../cli-error.ts";
import { addConnectionOptions, type ClientOptions, clientFromOptions } from "../client.ts";
import { jsonOption, note, printJson, printLines } from "../output.ts";
import { intIn, parseUint64 } from "../parse.ts";

interface RepairOptions extends ClientOptions {
  shard: number;
  yes?: boolean;
  nextOffset?: bigint;
  json?: boolean;
}

/** Registers `casq repair`. */
export function registerRepair(program: Command): void {
  const command = program
    .command("repair")
    .description("replace a refused (corrupt, misplaced or missing) shard document; the old bytes are kept")
    .argument("<queue>", "queue name")
    .requiredOption("--shard <n>", "the shard to repair", intIn(0, 255))
    .option("--yes", "do not ask for confirmation (for scripts)")
    .option(
      "--next-offset <n>",
      "lowest next_offset of the new document (when the old one does not tell how far offsets went)",
      parseUint64,
    )
    .addOption(jsonOption());
  addConnectionOptions(command);
  command.addHelpText(
    "after",
    `
Only a shard the brokers refuse (DATA_LOSS: the document does not parse, names another queue or
shard, or is missing) can be repaired. The refused bytes are copied, exactly, to
repairs/<queue>/<shard>/<ms>.json (casq never deletes them). The new document keeps what the old
bytes still tell (config, subscriptions, next_offset, messages: pending again for every
subscription, so they are delivered again); the rest comes from another shard of the queue.
Runbook: "Repairing refused shards" in docs/operations.md.

Examples:
  $ casq stats jobs                          # the PROBLEM column names the refused shard
  $ casq repair jobs --shard 1               # asks before writing
  $ casq repair jobs --shard 1 --yes --json  # for scripts`,
  );
  command.action(async (queue: string, options: RepairOptions) => {
    const client = clientFromOptions(options);
    try {
      const info = await client.call((c, o) => c.admin.getQueue({ queue }, o));
      const status = info.shards.find((s) => s.shard === options.shard);
      if (status === undefined)
        throw usageError(
          `queue ${queue} has ${info.shardCount} shard(s); --shard ${options.shard} does not exist`,
        );
      if (status.problem === "")
        throw new CliError(
          ExitCode.serverError,
          `shard ${queue}/${options.shard} is readable; there is nothing to repair`,
        );
      // No document: nothing tells how far the shard's offsets went (unless segments remain).
      if (status.etag === "" && options.nextOffset === undefined) {
        note(
          `warning: the document of shard ${queue}/${options.shard} is missing, so unless segment objects of it remain, ` +
            "its offsets restart at 0: receipts that workers still hold for its old messages could then settle new " +
            "messages that get the same offsets. Stop those workers first, or pass --next-offset N above the " +
            "highest offset the shard used (the NEXT-OFFSET of an earlier casq stats, or the offsets casq enqueue --json printed).",
        );
      }
      if (!options.yes) {
        if (!process.stdin.isTTY || !process.stderr.isTTY)
          throw usageError(
            `shard ${queue}/${options.shard} is refused: ${status.problem}\nrepairing it replaces the document; without a terminal to confirm, re-run with --yes`,
          );
        note(`shard ${queue}/${options.shard} is refused: ${status.problem}`);
        note("The stored bytes will be kept under repairs/ and replaced by a fresh or salvaged document;");
        note("salvaged messages are delivered again, anything not salvaged stays only in the backup.");
        const rl = createInterface({ input: process.stdin, output: process.stderr });
        const answer = await rl.question(`Repair shard ${queue}/${options.shard}? Type "yes": `);
        rl.close();
        if (answer.trim() !== "yes") throw usageError("not confirmed; nothing was changed");
      }
      const r = await client.call((c, o) =>
        c.admin.repairShard(
          {
            queue,
            shard: options.shard,
            expectedEtag: status.etag,
            ...(options.nextOffset === undefined ? {} : { nextOffset: options.nextOffset }),
          },
          o,
        ),
      );
      if (options.json) {
        printJson({
          queue,
          shard: options.shard,
          problem: r.problem,
          backupKey: r.backupKey,
          etag: r.etag,
          messagesSalvaged: Number(r.messagesSalvaged),
          subscriptions: r.subscriptions,
          nextOffset: Number(r.nextOffset),
          configSource: r.configSource,
        });
        return;
      }
      printLines(
        `repaired shard ${queue}/${options.shard}: ${r.messagesSalvaged} message(s) salvaged, next offset ${r.nextOffset}, ` +
          `subscriptions ${r.subscriptions.join(", ")}, config from ${r.configSource}`,
        r.backupKey === ""
          ? "  (the document was missing: no backup)"
          : `  the refused bytes are kept at ${r.backupKey}`,
      );
    } finally {
      client.close();
    }
  });
}
