/**
 * `casq dead QUEUE`: lists the dead letters of one subscription (messages it
 * gave up on, with the reason and attempts), and with `--redrive` makes them
 * runnable again with a fresh attempt budget (AdminService.ListDeadLetters,
 * RedriveDeadLetters).
 */
import type { Command } from "commander";
import { Option } from "commander";
import { type DeadLetter, DeadLetterSchema, RedriveDeadLettersResponseSchema } from "../api.ts";
import { addConnectionOptions, type ClientOptions, clientFromOptions } from "../client.ts";
import {
  formatTimestamp,
  jsonOption,
  messageJson,
  payloadPreview,
  printJson,
  printLines,
  table,
} from "../output.ts";
import { collect, intIn } from "../parse.ts";

interface DeadOptions extends ClientOptions {
  subscription: string;
  limit?: number;
  redrive?: boolean;
  id?: string[];
  json?: boolean;
}

/** Registers `casq dead`. */
export function registerDead(program: Command): void {
  const command = program
    .command("dead")
    .description("list a subscription's dead letters, or redrive them (--redrive)")
    .argument("<queue>", "queue name")
    .addOption(new Option("--subscription <name>", "subscription").default("default"))
    .option("--limit <n>", "at most this many (oldest first within each shard)", intIn(1, 1_000_000))
    .option("--redrive", "make the dead letters runnable again, with a fresh attempt budget")
    .option("--id <message-id>", "with --redrive: only this message (repeatable)", collect)
    .addOption(jsonOption());
  addConnectionOptions(command);
  command.addHelpText(
    "after",
    `
--redrive alone redrives every dead letter of the subscription; --id and --limit narrow it.
JSON: {"deadLetters": [...]} when listing, the RedriveDeadLettersResponse with --redrive.

Examples:
  $ casq dead jobs
  $ casq dead jobs --subscription audit --json | jq -r '.deadLetters[].reason'
  $ casq dead jobs --redrive
  $ casq dead jobs --redrive --id 01J9Z6Q3M8V1K2X4Y5Z6A7B8C9`,
  );
  command.action(async (queue: string, options: DeadOptions) => {
    const client = clientFromOptions(options);
    const subscription = options.subscription;
    try {
      if (options.redrive) {
        const ids = options.id ?? [];
        const response = await client.call((c, o) =>
          c.admin.redriveDeadLetters(
            { queue, subscription, all: ids.length === 0, ids, limit: options.limit ?? 0 },
            o,
          ),
        );
        if (options.json) {
          printJson(messageJson(RedriveDeadLettersResponseSchema, response));
          return;
        }
        printLines(
          `redrove ${response.redriven} dead letters of ${queue}/${subscription}; they are runnable now`,
        );
        if (response.missingIds.length > 0) {
          printLines(`not dead letters of ${queue}/${subscription}: ${response.missingIds.join(", ")}`);
        }
        return;
      }
      if (options.id !== undefined) {
        printLines("note: --id only selects what --redrive redrives; listing everything");
      }
      const letters: DeadLetter[] = [];
      let pageToken = "";
      const limit = options.limit ?? Number.POSITIVE_INFINITY;
      do {
        const pageSize = Math.min(1000, limit - letters.length);
        const page = await client.call((c, o) =>
          c.admin.listDeadLetters({ queue, subscription, pageSize, pageToken }, o),
        );
        letters.push(...page.deadLetters.slice(0, limit - letters.length));
        pageToken = page.nextPageToken;
      } while (pageToken !== "" && letters.length < limit);
      if (options.json) {
        printJson({ deadLetters: letters.map((letter) => messageJson(DeadLetterSchema, letter)) });
        return;
      }
      if (letters.length === 0) {
        printLines(`no dead letters in ${queue}/${subscription}`);
        return;
      }
      printLines(
        ...table(
          ["MESSAGE-ID", "SHARD", "OFFSET", "ATTEMPTS", "DEAD-AT", "REASON", "PAYLOAD"],
          letters.map((letter) => [
            letter.message?.id ?? "-",
            letter.message?.shard ?? 0,
            letter.message?.offset ?? 0n,
            letter.attempts,
            formatTimestamp(letter.deadAt),
            oneLine(letter.reason, 60),
            payloadPreview(letter.message?.payload ?? new Uint8Array(), 40),
          ]),
        ),
        "",
        `${letters.length} dead letters${pageToken === "" ? "" : " (more exist: raise --limit)"}; ` +
          `redrive with: casq dead ${queue}${subscription === "default" ? "" : ` --subscription ${subscription}`} --redrive`,
      );
    } finally {
      client.close();
    }
  });
}

function oneLine(text: string, max: number): string {
  const flat = text.replace(/\s+/g, " ").trim();
  if (flat === "") return "-";
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat;
}
