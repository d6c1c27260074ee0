/**
 * `casq work QUEUE -- COMMAND ARGS...`: a worker that runs COMMAND once per
 * job, with the payload on stdin and the job's metadata in CASQ_* variables;
 * exit 0 acks, the dead-letter exit code (65) dead-letters, anything else
 * retries. command-worker.ts runs the commands over the SDK's Worker.
 *
 * Signals: the first SIGINT/SIGTERM stops taking jobs and waits for the
 * running ones (their results are delivered), then exits 0; a second one
 * kills the running jobs and exits at once (130 / 143).
 */
import { hostname } from "node:os";
import type { Command } from "commander";
import { Option } from "commander";
import { usageError } from "../cli-error.ts";
import { addConnectionOptions, type ClientOptions, clientFromOptions } from "../client.ts";
import { CommandWorker } from "../command-worker.ts";
import { commandProblem } from "../job-process.ts";
import { intIn, parseDurationMs } from "../parse.ts";

/** Exit code of a job command that asks for its message to be dead-lettered (EX_DATAERR). */
export const DEFAULT_DEAD_LETTER_EXIT_CODE = 65;

interface WorkOptions extends ClientOptions {
  subscription: string;
  concurrency: number;
  jobTimeout?: number;
  leaseTtl?: number;
  maxJobs?: number;
  deadLetterExitCode: number;
  workerId?: string;
  verbose?: boolean;
}

/** Registers `casq work`. */
export function registerWork(program: Command): void {
  const command = program
    .command("work")
    .description("run a command for every job of a queue (payload on stdin); ack on exit 0")
    .argument("<queue>", "queue name")
    .argument("<command...>", "command and arguments to run per job, after --")
    .usage("[options] <queue> -- <command...>")
    .addOption(
      new Option("--subscription <name>", "subscription (consumer group) to work for").default("default"),
    )
    .addOption(
      new Option("--concurrency <n>", "jobs run at once, 1..1000").default(1).argParser(intIn(1, 1000)),
    )
    .option(
      "--job-timeout <duration>",
      "stop a job's command after this long (then it is retried), e.g. 5m",
      parseDurationMs,
    )
    .option(
      "--lease-ttl <duration>",
      "lease per job, 100ms..24h (default: the queue's lease TTL)",
      parseDurationMs,
    )
    .option("--max-jobs <n>", "exit after this many jobs", intIn(1, Number.MAX_SAFE_INTEGER))
    .addOption(
      new Option(
        "--dead-letter-exit-code <n>",
        "exit code of COMMAND that dead-letters the job instead of retrying",
      )
        .default(DEFAULT_DEAD_LETTER_EXIT_CODE)
        .argParser(intIn(1, 255)),
    )
    .option("--worker-id <id>", "identity recorded in leases (default HOST/pid-PID)")
    .option("-v, --verbose", "log every job, not only failures");
  addConnectionOptions(command);
  command.addHelpText(
    "after",
    `
Per job, COMMAND gets the payload on stdin and these environment variables:
  CASQ_QUEUE CASQ_SUBSCRIPTION CASQ_MESSAGE_ID CASQ_RECEIPT CASQ_ATTEMPT CASQ_MAX_ATTEMPTS
  CASQ_SHARD CASQ_OFFSET CASQ_KEY CASQ_PRIORITY CASQ_DEDUP_ID CASQ_ENQUEUED_AT
  CASQ_LEASE_DEADLINE CASQ_HEADERS (JSON object) CASQ_WORKER_ID, TRACEPARENT/TRACESTATE if set.
Its stdout and stderr pass through; the tail of stderr is kept as the failure reason.

COMMAND's exit status decides:
  0                      ack: done, never delivered to this subscription again
  65 (EX_DATAERR)        dead-letter now: the input is bad, retrying will not help
                         (--dead-letter-exit-code changes it)
  anything else, signal  retry later (queue backoff); after max attempts it is dead-lettered
The lease is heartbeated while COMMAND runs; if it is lost anyway, COMMAND gets SIGTERM.
--server may name any broker: the worker keeps a stream to every broker leading a shard of QUEUE.

Stopping: SIGINT/SIGTERM stops taking jobs, waits for running ones and delivers their
results, then exits 0; a second signal kills running jobs and exits at once (130 / 143).

Examples:
  $ casq work emails -- ./send-email.sh
  $ casq work images --concurrency 8 --job-timeout 2m -- python3 resize.py
  $ casq work events --subscription audit -- sh -c 'jq . >> audit.log'`,
  );
  command.action(async (queue: string, argv: string[], options: WorkOptions) => {
    const program = argv[0];
    if (program === undefined || program === "")
      throw usageError("no command: casq work QUEUE -- COMMAND ARGS...");
    const problem = commandProblem(program);
    if (problem !== undefined) throw usageError(problem);
    const client = clientFromOptions(options);
    const worker = new CommandWorker(client, options, {
      queue,
      subscription: options.subscription,
      concurrency: options.concurrency,
      command: argv,
      workerId: options.workerId ?? `${hostname()}/pid-${process.pid}`,
      deadLetterExitCode: options.deadLetterExitCode,
      verbose: options.verbose === true,
      ...(options.jobTimeout !== undefined && { jobTimeoutMs: options.jobTimeout }),
      ...(options.leaseTtl !== undefined && { leaseTtlMs: options.leaseTtl }),
      ...(options.maxJobs !== undefined && { maxJobs: options.maxJobs }),
    });
    let signals = 0;
    const onSignal = (signal: NodeJS.Signals) => {
      signals++;
      if (signals === 1) {
        process.stderr.write(`casq work: ${signal}: finishing running jobs (signal again to exit at once)\n`);
        worker.stop();
        return;
      }
      process.stderr.write(`casq work: ${signal} again: killing running jobs and exiting\n`);
      worker.kill();
      process.exit(128 + (signal === "SIGINT" ? 2 : 15));
    };
    process.on("SIGINT", onSignal);
    process.on("SIGTERM", onSignal);
    try {
      const summary = await worker.run();
      process.stderr.write(
        `casq work: stopped after ${summary.started} job(s): ${summary.acked} acked, ${summary.retried} retried, ` +
          `${summary.deadLettered} dead-lettered, ${summary.lost} lost` +
          (summary.unsettled > 0 ? `, ${summary.unsettled} results undelivered` : "") +
          "\n",
      );
      if (summary.unsettled > 0) process.exitCode = 1;
    } finally {
      process.off("SIGINT", onSignal);
      process.off("SIGTERM", onSignal);
      client.close();
    }
  });
}
