/**
 * What `casq work` does with a job once its command has ended: exit 0 acks;
 * the dead-letter exit code (default 65, EX_DATAERR: "this input is bad,
 * retrying will not help") dead-letters; any other exit, a signal, a timeout
 * or a failure to start retries under the queue's backoff policy. The reason
 * (exit status and the tail of stderr) is kept with the dead letter.
 */
import type { JobExit } from "./job-process.ts";
import { formatMs } from "./output.ts";

/** The settlement a job's exit asks for. */
export interface JobVerdict {
  /** Ack, nack for a retry, or nack to the dead letters. */
  readonly kind: "ack" | "retry" | "dead-letter";
  /** Why (empty for an ack); at most 2 KiB, the broker's limit for a nack reason. */
  readonly reason: string;
}

/** How the exit status is read. */
export interface VerdictRules {
  /** Program run per job (named when it cannot be started). */
  readonly program: string;
  /** Exit code that dead-letters. */
  readonly deadLetterExitCode: number;
  /** The job timeout, if any (named in the reason of a timed-out job). */
  readonly jobTimeoutMs?: number;
}

const MAX_REASON = 2048;

/** The verdict for one exit of a job's command. */
export function jobVerdict(exit: JobExit, rules: VerdictRules): JobVerdict {
  const tail = exit.stderrTail.trim();
  const withTail = (reason: string) =>
    (tail === "" ? reason : `${reason}; stderr: ${tail}`).slice(0, MAX_REASON);
  if (exit.spawnError !== undefined)
    return { kind: "retry", reason: `cannot run ${rules.program}: ${exit.spawnError.message}` };
  if (exit.timedOut)
    return { kind: "retry", reason: withTail(`timed out after ${formatMs(rules.jobTimeoutMs ?? 0)}`) };
  if (exit.code === 0) return { kind: "ack", reason: "" };
  if (exit.code === rules.deadLetterExitCode)
    return { kind: "dead-letter", reason: withTail(`exit code ${exit.code} (dead-letter requested)`) };
  if (exit.code !== null) return { kind: "retry", reason: withTail(`exit code ${exit.code}`) };
  return { kind: "retry", reason: withTail(`killed by ${exit.signal ?? "a signal"}`) };
}
