/**
 * The `casq` command tree: one commander program with one subcommand per
 * file under ./commands. Usage errors throw (exitOverride) so that main.ts
 * maps them to exit code 2.
 */
import { readFileSync } from "node:fs";
import { Command } from "commander";
import { registerDead } from "./commands/dead.ts";
import { registerEnqueue } from "./commands/enqueue.ts";
import { registerHealth } from "./commands/health.ts";
import { registerInspect } from "./commands/inspect.ts";
import { registerPurge } from "./commands/purge.ts";
import { registerQueue } from "./commands/queue.ts";
import { registerRepair } from "./commands/repair.ts";
import { registerServe } from "./commands/serve.ts";
import { registerStats } from "./commands/stats.ts";
import { registerSubscription } from "./commands/subscription.ts";
import { registerWork } from "./commands/work.ts";

function packageVersion(): string {
  try {
    const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as {
      version?: string;
    };
    return pkg.version ?? "0.0.0";
  } catch {
    return "0.0.0";
  }
}

/** Builds the `casq` program with every subcommand registered. */
export function buildProgram(): Command {
  const program = new Command("casq")
    .description(
      "casq: a durable job queue and pub/sub log whose whole state lives in object storage.\n" +
        "Start a broker with `casq serve`; the other commands are clients of a running broker.",
    )
    .version(packageVersion(), "-V, --version", "print the casq version")
    .helpCommand("help [command]", "show help for a command")
    .exitOverride()
    .showHelpAfterError("(add --help for usage and examples)")
    .configureHelp({ sortSubcommands: false, showGlobalOptions: false })
    .addHelpText(
      "after",
      `
Examples:
  $ casq serve                                  # broker on 127.0.0.1:50051, state in ./casq-data
  $ casq queue create jobs --shards 2
  $ casq enqueue jobs '{"to":"ada@example.com"}'
  $ casq work jobs --concurrency 4 -- ./send-mail.sh
  $ casq stats jobs

Exit codes: 0 ok, 1 server error, 2 usage error, 3 not found, 4 connection failed.
Client commands reach the broker at --server (env CASQ_SERVER, default 127.0.0.1:50051).`,
    );
  registerServe(program);
  registerEnqueue(program);
  registerWork(program);
  registerStats(program);
  registerInspect(program);
  registerDead(program);
  registerPurge(program);
  registerQueue(program);
  registerSubscription(program);
  registerRepair(program);
  registerHealth(program);
  return program;
}
