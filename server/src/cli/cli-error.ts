/**
 * Exit codes of the `casq` CLI and the one error type its commands throw.
 *
 * Every command ends in exactly one of these codes, so that shell scripts can
 * branch on what went wrong without parsing messages:
 *
 * | code | meaning                                                            |
 * |------|--------------------------------------------------------------------|
 * | 0    | success                                                            |
 * | 1    | the server (or the command it ran) failed; the message says why    |
 * | 2    | usage error: bad flag, bad value, missing argument, or a request the server refused as malformed |
 * | 3    | not found: no such queue, subscription or shard                    |
 * | 4    | connection failed: nothing answered at the server address          |
 *
 * `casq serve` and `casq work` additionally exit with 128 + signal number
 * (130 for SIGINT, 143 for SIGTERM) when a second signal cuts a graceful stop
 * short.
 */

/** The exit codes of the CLI; see the module header and docs/cli.md. */
export const ExitCode = {
  /** Success. */
  ok: 0,
  /** The server or the work command failed. */
  serverError: 1,
  /** Bad command line, or a request the server refused as malformed. */
  usage: 2,
  /** No such queue, subscription or shard. */
  notFound: 3,
  /** Nothing answered at the server address (refused, unknown host, TLS handshake). */
  connectionFailed: 4,
} as const;

/** One of the values of {@link ExitCode}. */
export type ExitCodeValue = (typeof ExitCode)[keyof typeof ExitCode];

/**
 * An error meant for a human at a terminal: `message` says what happened and,
 * where possible, what to do; `exitCode` is what the process exits with.
 */
export class CliError extends Error {
  /** Exit code of the process. */
  readonly exitCode: number;

  constructor(exitCode: number, message: string, options?: { cause?: unknown }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = "CliError";
    this.exitCode = exitCode;
  }
}

/** A usage error (exit code 2) with the given message. */
export function usageError(message: string): CliError {
  return new CliError(ExitCode.usage, message);
}
