/**
 * `casq enqueue QUEUE [PAYLOAD]`: stores messages durably and prints their
 * ids. With PAYLOAD, one message; without it, one message per stdin line
 * (NDJSON), both read by the one rule of message-input.ts, sent in batches of up to 1000 per Enqueue
 * call, in input order, one batch at a time (so per-key order holds across
 * batches). A progress bar on stderr shows large inputs when stderr is a
 * terminal; otherwise a progress line is printed every few seconds.
 *
 * Every message without a dedup id gets a generated one (a random UUID, made
 * once per message, sent again by every resend of its batch), as the SDK
 * producers do: an attempt that timed out or lost its connection may have
 * stored the batch, and a resend must not store it twice. `--no-dedup` turns
 * that off; such a batch is then never resent after an ambiguous attempt.
 */
import { randomUUID } from "node:crypto";
import { fstatSync } from "node:fs";
import { createInterface } from "node:readline";
import type { Command } from "commander";
import { InvalidArgumentError, Option } from "commander";
import { EnqueuedMessageSchema, type NewMessage } from "../api.ts";
import { CliError, ExitCode, usageError } from "../cli-error.ts";
import {
  addConnectionOptions,
  type CasqClient,
  type ClientOptions,
  clientFromOptions,
  MaybeAppliedError,
} from "../client.ts";
import {
  type InputMode,
  type MessageDefaults,
  MessageInputError,
  MessageLineError,
  parseMessageLine,
  parseMessageText,
} from "../message-input.ts";
import { formatMs, jsonOption, messageJson, note, printLines } from "../output.ts";
import { collect, intIn, parseDurationMs } from "../parse.ts";
import { type ProgressReporter, startProgress } from "../progress.ts";

interface EnqueueOptions extends ClientOptions {
  key?: string;
  priority?: number;
  delay?: number;
  header?: string[];
  dedupId?: string;
  /** False with `--no-dedup`: no generated dedup ids. */
  dedup: boolean;
  maxAttempts?: number;
  batchSize: number;
  json?: boolean;
  progress: boolean;
  raw?: boolean;
}

/** Registers `casq enqueue`. */
export function registerEnqueue(program: Command): void {
  const command = program
    .command("enqueue")
    .description("enqueue one message (PAYLOAD) or one message per stdin line (NDJSON) and print the ids")
    .argument("<queue>", "queue name")
    .argument(
      "[payload]",
      "the message, read like a stdin line (see below); omit it to read messages from stdin, one per line",
    )
    .option("--key <key>", "partition key: messages with the same key share a shard and keep their order")
    .option("--priority <n>", "claim priority, -1000..1000 (higher first)", intIn(-1000, 1000))
    .option("--delay <duration>", "run no earlier than this from now, e.g. 30s, 5m", parseDurationMs)
    .option("--header <name=value>", "application header (repeatable)", collect)
    .option("--dedup-id <id>", "deduplication id of PAYLOAD: a repeat within the dedup window stores nothing")
    .option(
      "--no-dedup",
      "no generated dedup ids for messages without one (a request that may have been stored is then not resent)",
    )
    .option(
      "--max-attempts <n>",
      "deliveries before dead-lettering, 1..1000 (default: the queue's)",
      intIn(1, 1000),
    )
    .addOption(
      new Option("--batch-size <n>", "messages per Enqueue call when reading stdin, 1..1000")
        .default(1000)
        .argParser(intIn(1, 1000)),
    )
    .option(
      "--raw",
      "every input is the payload as it is: no message envelopes, no JSON check (for payloads that look like envelopes)",
    )
    .addOption(jsonOption().default(false))
    .option("--no-progress", "no progress bar or progress lines on stderr");
  addConnectionOptions(command);
  command.addHelpText(
    "after",
    `
PAYLOAD and each stdin line follow one rule:
  - a JSON object with "payload" (or "payload_base64") is a message envelope:
      {"payload": "text", "key": "user-7", "priority": 5, "delay_ms": 1000, "headers": {"type": "email"},
       "dedup_id": "order-42", "max_attempts": 3}
      {"payload_base64": "AAEC"}    binary payload; "run_at": "2030-01-01T00:00:00Z" schedules absolutely
    a string payload is stored as its text, any other JSON value as its compact JSON;
    any other field is an error;
  - anything else is the payload byte for byte: plain text, "a JSON string" with its quotes,
    {"to":"ada@example.com"} (an object without "payload");
  - text starting with { or [ must be valid JSON. --raw turns envelopes and this check off.
Flags (--key, --priority, ...) are defaults for every message; an envelope's own fields win.

Messages without a dedup id get a generated one, so that a request resent after a timeout or a
broken connection is not stored twice (--no-dedup: none; such a request is then not resent).

Output: the message id (one per line with --json: {"line", "id", "shard", "offset", "duplicate"}).
When the enqueue created the queue (auto-create is on), stderr says "created queue QUEUE (auto-create ...)".

Examples:
  $ casq enqueue emails '{"to":"ada@example.com"}'
  $ casq enqueue emails hello --key user-7 --delay 10s --header content-type=text/plain
  $ seq 1 10000 | casq enqueue numbers
  $ echo '{"payload": {"to": "ada@example.com"}, "priority": 5}' | casq enqueue emails
  $ jq -c '.[] | {payload: ., key: .user}' orders.json | casq enqueue orders --json > ids.ndjson`,
  );
  command.action(async (queue: string, payload: string | undefined, options: EnqueueOptions) => {
    const defaults = flagDefaults(options);
    const mode: InputMode = { raw: options.raw === true };
    let message: NewMessage | undefined;
    if (payload !== undefined) {
      try {
        message = parseMessageText(payload, defaults, mode);
      } catch (error) {
        if (error instanceof MessageInputError) throw usageError(`PAYLOAD: ${error.message}`);
        throw error;
      }
    }
    if (options.dedup === false && options.dedupId !== undefined) {
      throw usageError("--dedup-id and --no-dedup contradict each other: pass one of them.");
    }
    const client = clientFromOptions(options);
    try {
      if (message !== undefined) {
        await enqueueOne(client, queue, message, options);
      } else {
        if (options.dedupId !== undefined) {
          throw usageError(
            "--dedup-id names one message; on stdin give each line its own dedup_id instead (see casq enqueue --help).",
          );
        }
        if (process.stdin.isTTY) {
          throw usageError(
            "no payload: pass PAYLOAD, or pipe messages to stdin one per line (see casq enqueue --help).",
          );
        }
        await enqueueStdin(client, queue, defaults, mode, options);
      }
    } finally {
      client.close();
    }
  });
}

function flagDefaults(options: EnqueueOptions): MessageDefaults {
  const headers: Record<string, string> = {};
  for (const header of options.header ?? []) {
    const eq = header.indexOf("=");
    if (eq <= 0) throw new InvalidArgumentError(`--header "${header}" is not NAME=VALUE`);
    headers[header.slice(0, eq)] = header.slice(eq + 1);
  }
  return {
    headers,
    ...(options.key !== undefined && { key: options.key }),
    ...(options.priority !== undefined && { priority: options.priority }),
    ...(options.delay !== undefined && { delayMs: options.delay }),
    ...(options.dedupId !== undefined && { dedupId: options.dedupId }),
    ...(options.maxAttempts !== undefined && { maxAttempts: options.maxAttempts }),
  };
}

/**
 * Gives `message` a generated dedup id when it has none and generated ids
 * are on; true when it did.
 */
function generateDedupId(message: NewMessage, options: EnqueueOptions): boolean {
  if (message.dedupId !== "" || options.dedup === false) return false;
  message.dedupId = randomUUID();
  return true;
}

/**
 * One Enqueue call; resent after an ambiguous attempt only when every message
 * has a dedup id. A "duplicate" answer for a generated id is this command's
 * own earlier attempt, which stored the message: reported as stored.
 */
async function send(client: CasqClient, queue: string, messages: NewMessage[], generated: boolean[]) {
  const response = await client.call((c, o) => c.queue.enqueue({ queue, messages }, o), {
    idempotent: messages.every((m) => m.dedupId !== ""),
    changesState: true,
  });
  response.messages.forEach((result, index) => {
    if (generated[index]) result.duplicate = false;
  });
  return response;
}

async function enqueueOne(client: CasqClient, queue: string, message: NewMessage, options: EnqueueOptions) {
  const generated = generateDedupId(message, options);
  const response = await send(client, queue, [message], [generated]);
  if (response.queueCreated) noteCreated(queue);
  const result = response.messages[0];
  if (result === undefined)
    throw new CliError(ExitCode.serverError, "the server answered without a message id");
  if (options.json) {
    printLines(JSON.stringify({ line: 1, ...(messageJson(EnqueuedMessageSchema, result) as object) }));
  } else {
    printLines(result.duplicate ? `${result.id} (duplicate: stored before, nothing new stored)` : result.id);
  }
}

async function enqueueStdin(
  client: CasqClient,
  queue: string,
  defaults: MessageDefaults,
  mode: InputMode,
  options: EnqueueOptions,
) {
  const started = Date.now();
  const input = createInterface({ input: process.stdin, crlfDelay: Number.POSITIVE_INFINITY });
  const progress: ProgressReporter = options.progress
    ? startProgress(`enqueue ${queue}`, stdinSize())
    : noProgress;
  let batch: NewMessage[] = [];
  let batchLines: number[] = [];
  let batchGenerated: boolean[] = [];
  let lineNumber = 0;
  let enqueued = 0;
  let duplicates = 0;
  let lastOkLine = 0;

  const flush = async () => {
    if (batch.length === 0) return;
    const messages = batch;
    const lines = batchLines;
    const generated = batchGenerated;
    batch = [];
    batchLines = [];
    batchGenerated = [];
    const response = await send(client, queue, messages, generated).catch((error: unknown) => {
      progress.stop();
      const first = lines[0] ?? 0;
      const last = lines[lines.length - 1] ?? 0;
      const done =
        enqueued === 0
          ? "nothing was enqueued"
          : `lines up to ${lastOkLine} are enqueued (${enqueued} messages)`;
      const cliError = error as CliError;
      // A MaybeAppliedError (an attempt timed out or lost its connection) may have stored the batch.
      const nothingApplied =
        !(cliError instanceof MaybeAppliedError) &&
        (cliError.exitCode === ExitCode.usage ||
          cliError.exitCode === ExitCode.notFound ||
          cliError.exitCode === ExitCode.connectionFailed);
      if (nothingApplied && enqueued === 0) throw cliError;
      if (nothingApplied) {
        throw new CliError(
          cliError.exitCode,
          `${cliError.message}\n  ${done}; lines from ${first} on were not.`,
        );
      }
      throw new CliError(
        cliError.exitCode ?? ExitCode.serverError,
        `${cliError.message}\n  ${done}; lines ${first}..${last} (this batch) may be partly stored ` +
          "(each shard's part is atomic), later lines were not sent. Resume from line " +
          `${first}; lines with their own dedup_id are safe to resend (the ids this run generated are not reused).`,
      );
    });
    if (response.queueCreated) noteCreated(queue);
    const out: string[] = [];
    response.messages.forEach((result, index) => {
      if (result.duplicate) duplicates++;
      if (options.json) {
        out.push(
          JSON.stringify({ line: lines[index], ...(messageJson(EnqueuedMessageSchema, result) as object) }),
        );
      }
    });
    if (out.length > 0) printLines(...out);
    enqueued += messages.length;
    lastOkLine = lines[lines.length - 1] ?? lastOkLine;
    progress.update(enqueued);
  };

  try {
    for await (const text of input) {
      lineNumber++;
      progress.addBytes(Buffer.byteLength(text) + 1);
      let message: NewMessage | undefined;
      try {
        message = parseMessageLine(text, lineNumber, defaults, mode);
      } catch (error) {
        if (error instanceof MessageLineError) {
          await flush();
          progress.stop();
          const done =
            enqueued === 0 ? "nothing was enqueued" : `lines before it are enqueued (${enqueued} messages)`;
          throw usageError(`${error.message}; ${done}.`);
        }
        throw error;
      }
      if (message === undefined) continue;
      batchGenerated.push(generateDedupId(message, options));
      batch.push(message);
      batchLines.push(lineNumber);
      if (batch.length >= options.batchSize) await flush();
    }
    await flush();
  } finally {
    progress.stop();
    input.close();
  }
  const elapsed = Date.now() - started;
  const rate = elapsed > 0 ? Math.round((enqueued * 1000) / elapsed) : enqueued;
  const dup = duplicates > 0 ? `, ${duplicates} duplicates (not stored again)` : "";
  const summary = `enqueued ${enqueued} messages to ${queue}${dup} in ${formatMs(elapsed)} (${rate}/s)`;
  if (options.json) note(summary);
  else printLines(summary);
  if (enqueued === 0) note("stdin held no messages (empty lines are skipped)");
}

/**
 * Says on stderr that the enqueue created the queue (the broker's auto-create
 * is on), so that a typo in the name does not go unnoticed.
 */
function noteCreated(queue: string): void {
  note(
    `created queue ${queue} (auto-create: it did not exist; casq serve --auto-create-queues off refuses unknown queues instead)`,
  );
}

/** Size of stdin in bytes when it is a regular file (for a percentage), else undefined. */
function stdinSize(): number | undefined {
  try {
    const stat = fstatSync(0);
    return stat.isFile() && stat.size > 0 ? stat.size : undefined;
  } catch {
    return undefined;
  }
}

const noProgress: ProgressReporter = { addBytes() {}, update() {}, stop() {} };
