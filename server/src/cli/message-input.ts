/**
 * What `casq enqueue` reads from stdin: one message per line (NDJSON).
 *
 * A line is one of
 * - a JSON object `{"payload": "text", "key": "k", "priority": 5,
 *   "delay_ms": 1000, "headers": {"h": "v"}, "dedup_id": "d",
 *   "max_attempts": 3}`; every field is optional, `payload_base64` carries
 *   binary payloads instead of `payload`, `run_at` (RFC 3339) schedules at an
 *   absolute time instead of `delay_ms`;
 * - a JSON string `"text"`: the payload;
 * - anything else: the line itself (without its line break) is the payload,
 *   so `seq 1 1000 | casq enqueue q` enqueues "1" to "1000".
 * Empty lines are skipped. A line that starts with `{` or `"` must be valid
 * JSON of that kind: a truncated object is an error, never a payload.
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

/** A line that cannot become a message; `line` is 1-based. */
export class MessageLineError extends Error {
  /** 1-based line number. */
  readonly line: number;

  constructor(line: number, problem: string) {
    super(`stdin line ${line}: ${problem}`);
    this.name = "MessageLineError";
    this.line = line;
  }
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
 * Parses one stdin line into a message, or returns undefined for an empty
 * line. Throws {@link MessageLineError} naming the line and the problem.
 */
export function parseMessageLine(
  text: string,
  lineNumber: number,
  defaults: MessageDefaults,
): NewMessage | undefined {
  const line = text.endsWith("\r") ? text.slice(0, -1) : text;
  if (line.trim() === "") return undefined;
  const trimmed = line.trimStart();
  if (trimmed.startsWith('"')) {
    const value = parseJson(trimmed, lineNumber);
    if (typeof value !== "string") throw new MessageLineError(lineNumber, "expected a JSON string");
    return messageFromPayload(new TextEncoder().encode(value), defaults);
  }
  if (!trimmed.startsWith("{")) {
    return messageFromPayload(new TextEncoder().encode(line), defaults);
  }
  const value = parseJson(trimmed, lineNumber);
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new MessageLineError(lineNumber, "expected a JSON object");
  }
  return messageFromObject(value as Record<string, unknown>, lineNumber, defaults);
}

function parseJson(text: string, lineNumber: number): unknown {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new MessageLineError(lineNumber, `not valid JSON (${(error as Error).message})`);
  }
}

function messageFromObject(
  object: Record<string, unknown>,
  lineNumber: number,
  defaults: MessageDefaults,
): NewMessage {
  const fail = (problem: string): never => {
    throw new MessageLineError(lineNumber, problem);
  };
  for (const field of Object.keys(object)) {
    if (!FIELDS.has(field)) {
      fail(`unknown field "${field}" (known: ${[...FIELDS].join(", ")})`);
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
  const text = str("payload");
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
