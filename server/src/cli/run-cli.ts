/**
 * Runs the `casq` command line and maps every outcome to an exit code (see
 * cli-error.ts): commander's usage errors to 2, a {@link CliError} to its
 * code, anything else (a bug) to 1 with its stack.
 */
import { CommanderError } from "commander";
import { CliError, ExitCode } from "./cli-error.ts";
import { buildProgram } from "./program.ts";

/** Runs the CLI with the given arguments (without `node` and the script) and returns the exit code. */
export async function runCli(args: readonly string[]): Promise<number> {
  try {
    const program = buildProgram();
    await program.parseAsync([...args], { from: "user" });
    return typeof process.exitCode === "number" ? process.exitCode : ExitCode.ok;
  } catch (error) {
    if (error instanceof CommanderError) {
      // Commander printed the message (or the help) already.
      return error.exitCode === 0 ? ExitCode.ok : ExitCode.usage;
    }
    if (error instanceof CliError) {
      process.stderr.write(`casq: ${error.message}\n`);
      return error.exitCode;
    }
    process.stderr.write(`casq: unexpected error (a bug in casq, please report it): ${describe(error)}\n`);
    return ExitCode.serverError;
  }
}

function describe(error: unknown): string {
  return error instanceof Error ? (error.stack ?? error.message) : String(error);
}

/** Waits until everything written to stdout and stderr has been handed to the OS. */
export async function flushOutput(): Promise<void> {
  await Promise.all(
    [process.stdout, process.stderr].map(
      (stream) => new Promise<void>((resolve) => stream.write("", () => resolve())),
    ),
  );
}
