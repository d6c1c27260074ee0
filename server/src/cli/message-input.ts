/**
 * What `casq enqueue` takes as a message: the PAYLOAD argument, or each stdin
 * line (NDJSON). One rule for both, so the same text means the same message
 * either way:
 *
 * 1. A JSON object with a `"payload"` or `"payload_base64"` field is a
 *    message envelope: `{"payload": "text", "key": "k", "priority": 5,
 *    "delay_ms": 1000, "headers": {"h": "v"}, "dedup_id": "d",
 *    "max_attempts": 3}` (`run_at`, RFC 3339, instead of `delay_ms`). A
 *    string payload is stored as its text; any other JSON value (object,
 *    array, number, ...) as its compact JSON. Every other field must be an
 *    envelope field: a typo is an error, never a silently different message.
 * 2. Anything else is the payload, byte for byte: plain text, a JSON string
 *    with its quotes, a JSON object without a payload field
 *    (`{"to":"ada@example.com"}`). A stdin line loses only its line break.
 * 3. Text that starts with `{` or `[` must be valid JSON: a truncated object
 *    is an error, never stored as a payload by accident.
 *
 * `--raw` turns rules 1 and 3 off: every input is the payload as it is. On
 * stdin, empty lines are skipped.
 */
import { create } from "@bufbuild/protobuf";
import { durationFromMs, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { type NewMessage, NewMessageSchema } from "./api.ts";

/** Message fields set by flags; NDJSON lines override them per message. */
export interface MessageDefaults {
  /** Partition key. */
  readonly key?: string;
  /** Claim priority. */
  readonly priority?: number;
  /** Delay before the message becomes claimable, in milliseconds. */
  readonly delayMs?: number;
  /** Headers (a line's headers are merged over these). */
  readonly headers?: Readonly<Record<string, string>>;
  /** Deduplication id (only sensible for a single message). */
  readonly dedupId?: string;
  /** Deliveries before dead-lettering. */
  readonly maxAttempts?: number;
}

/** An input that does not fit the rule (see the module header); the message says why and what to do. */
export class MessageInputError extends Error {
  constructor(problem: string) {
    super(problem);
    this.name = "MessageInputError";
  }
}

/** A stdin line that cannot become a message; `line` is 1-based. */
export class MessageLineError extends Error {
  /** 1-based line number. */
  readonly line: number;

  constructor(line: number, problem: string) {
    super(`stdin line ${line}: ${problem}`);
    this.name = "MessageLineError";
    this.line = line;
  }
}

/** How inputs are read. */
export interface InputMode {
  /** Every input is the payload as it is: no envelopes, no JSON check (`--raw`). */
  readonly raw?: boolean;
}

const FIELDS = new Set([
  "payload",
  "payload_base64",
  "key",
  "priority",
  "delay_ms",
  "run_at",
  "headers",
  "dedup_id",
  "max_attempts",
]);

/** Builds a NewMessage from a payload and the flag defaults. */
export function messageFromPayload(payload: Uint8Array, defaults: MessageDefaults): NewMessage {
  const message = create(NewMessageSchema, {
    payload,
    key: defaults.key ?? "",
    priority: defaults.priority ?? 0,
    headers: { ...(defaults.headers ?? {}) },
    dedupId: defaults.dedupId ?? "",
    maxAttempts: defaults.maxAttempts ?? 0,
  });
  if (defaults.delayMs !== undefined) {
    message.schedule = { case: "delay", value: durationFromMs(defaults.delayMs) };
  }
  return message;
}

/**
 * Turns one input (the PAYLOAD argument, or a stdin line without its line
 * break) into a message by the module's rule. Throws {@link MessageInputError}.
 */
export function parseMessageText(text: string, defaults: MessageDefaults, mode: InputMode = {}): NewMessage {
  const verbatim = () => messageFromPayload(new TextEncoder().encode(text), defaults);
  if (mode.raw) return verbatim();
  const start = text.trimStart()[0];
  if (start !== "{" && start !== "[") return verbatim();
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new MessageInputError(
      `starts with "${start}" but is not valid JSON (${(error as Error).message}); fix it, or pass --raw to store the text as it is`,
    );
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return verbatim();
  const object = value as Record<string, unknown>;
  if (!("payload" in object) && !("payload_base64" in object)) return verbatim();
  return messageFromObject(object, defaults);
}

/**
 * Parses one stdin line into a message, or returns undefined for an empty
 * line. Throws {@link MessageLineError} naming the line and the problem.
 */
export function parseMessageLine(
  text: string,
  lineNumber: number,
  defaults: MessageDefaults,
  mode: InputMode = {},
): NewMessage | undefined {
  const line = text.endsWith("\r") ? text.slice(0, -1) : text;
  if (line.trim() === "") return undefined;
  try {
    return parseMessageText(line, defaults, mode);
  } catch (error) {
    if (error instanceof MessageInputError) throw new MessageLineError(lineNumber, error.message);
    throw error;
  }
}

function messageFromObject(object: Record<string, unknown>, defaults: MessageDefaults): NewMessage {
  const fail = (problem: string): never => {
    throw new MessageInputError(problem);
  };
  for (const field of Object.keys(object)) {
    if (!FIELDS.has(field)) {
      fail(
        `a JSON object with "payload" is a message envelope, and "${field}" is not an envelope field (known: ${[...FIELDS].join(", ")}); pass --raw to store the object itself as the payload`,
      );
    }
  }
  const str = (field: string): string | undefined => {
    const v = object[field];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "string") fail(`"${field}" must be a string`);
    return v as string;
  };
  const int = (field: string, min: number, max: number): number | undefined => {
    const v = object[field];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
      fail(`"${field}" must be a whole number in ${min}..${max}`);
    }
    return v as number;
  };

  let payload: Uint8Array = new Uint8Array();
  const rawPayload = object.payload;
  // A string is its text; any other JSON value is stored as its compact JSON.
  const text =
    rawPayload === undefined || rawPayload === null
      ? undefined
      : typeof rawPayload === "string"
        ? rawPayload
        : JSON.stringify(rawPayload);
  const base64 = str("payload_base64");
  if (text !== undefined && base64 !== undefined) fail('set "payload" or "payload_base64", not both');
  if (text !== undefined) payload = new TextEncoder().encode(text);
  if (base64 !== undefined) {
    if (!/^[A-Za-z0-9+/_-]*={0,2}$/.test(base64)) fail('"payload_base64" is not base64');
    payload = new Uint8Array(Buffer.from(base64, "base64"));
  }

  const headers: Record<string, string> = { ...(defaults.headers ?? {}) };
  const rawHeaders = object.headers;
  if (rawHeaders !== undefined && rawHeaders !== null) {
    if (typeof rawHeaders !== "object" || Array.isArray(rawHeaders))
      fail('"headers" must be an object of strings');
    for (const [name, value] of Object.entries(rawHeaders as Record<string, unknown>)) {
      if (typeof value !== "string") fail(`header "${name}" must be a string`);
      headers[name] = value as string;
    }
  }

  const message = create(NewMessageSchema, {
    payload,
    headers,
    key: str("key") ?? defaults.key ?? "",
    priority: int("priority", -1000, 1000) ?? defaults.priority ?? 0,
    dedupId: str("dedup_id") ?? defaults.dedupId ?? "",
    maxAttempts: int("max_attempts", 0, 1000) ?? defaults.maxAttempts ?? 0,
  });

  const delayMs = int("delay_ms", 0, 365 * 86_400_000);
  const runAt = str("run_at");
  if (delayMs !== undefined && runAt !== undefined) fail('set "delay_ms" or "run_at", not both');
  if (runAt !== undefined) {
    const date = new Date(runAt);
    if (Number.isNaN(date.getTime())) fail('"run_at" must be an RFC 3339 time, e.g. 2030-01-02T03:04:05Z');
    message.schedule = { case: "runAt", value: timestampFromDate(date) };
  } else if (delayMs !== undefined) {
    message.schedule = { case: "delay", value: durationFromMs(delayMs) };
  } else if (defaults.delayMs !== undefined) {
    message.schedule = { case: "delay", value: durationFromMs(defaults.delayMs) };
  }
  return message;
}
