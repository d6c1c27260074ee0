/**
 * Entry point of the `casq` command (run by server/bin/casq.js through tsx):
 * parses the command line, runs the command, and exits with the code of the
 * outcome: 0 ok, 1 server error, 2 usage error, 3 not found, 4 connection
 * failed (see cli-error.ts and docs/cli.md).
 */
import { flushOutput, runCli } from "./run-cli.ts";

// A closed stdout (`casq stats | head`) is the reader saying "enough", not a crash.
process.stdout.on("error", (error: NodeJS.ErrnoException) => {
  if (error.code === "EPIPE") process.exit(0);
  throw error;
});

const code = await runCli(process.argv.slice(2));
await flushOutput();
process.exit(code);
