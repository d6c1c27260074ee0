/**
 * Validation and normalisation of operation inputs (messages, receipts, ids).
 *
 * Everything a client controls is checked here, before the shard is
 * touched, so a rejected operation changes nothing. Limits that depend on the
 * queue (payload size, header count and size) come from its config and are
 * reported as `resource_exhausted` with the limit and the config field to
 * raise; malformed values are `invalid_argument`.
 */
import { CasqError } from "../errors.ts";
import { utf8Bytes } from "./approx-size.ts";
import type { NewMessage, Receipt } from "./operations.ts";
import { type QueueConfig, snakeCase } from "./queue-config.ts";
import { sortedStringMap } from "./shard-mechanics.ts";
import type { MessageRecord } from "./shard-records.ts";

/** Lowest accepted priority. */
export const PRIORITY_MIN = -1000;
/** Highest accepted priority (claimed first). */
export const PRIORITY_MAX = 1000;
/** Longest message id, dedup id, worker id, in UTF-8 bytes. */
export const MAX_ID_BYTES = 256;
/** Longest message key, in UTF-8 bytes. */
export const MAX_KEY_BYTES = 1024;
/** Largest trace context (names + values), in UTF-8 bytes. */
export const MAX_TRACE_CONTEXT_BYTES = 4096;
/** Longest delay / furthest `run_at` ahead of now: 365 days. */
export const MAX_DELAY_MS = 365 * 86_400_000;
/** Highest per-message max attempts. */
export const MAX_MESSAGE_ATTEMPTS = 1000;

function invalid(message: string): never {
  throw new CasqError("invalid_argument", message);
}

/** Throws `invalid_argument` unless `value` is a non-empty string of at most `maxBytes` UTF-8 bytes. */
export function checkId(what: string, value: unknown, maxBytes = MAX_ID_BYTES): asserts value is string {
  if (typeof value !== "string" || value === "") invalid(`${what} must be a non-empty string`);
  if (utf8Bytes(value) > maxBytes) invalid(`${what} is longer than ${maxBytes} bytes`);
}

/** True when {@link checkId} would accept `value` (so the hot path builds no label). */
function isId(value: unknown, maxBytes = MAX_ID_BYTES): value is string {
  return typeof value === "string" && value !== "" && utf8Bytes(value) <= maxBytes;
}

/** Throws `invalid_argument` unless `value` is an integer in [min, max]. */
export function checkInteger(
  what: string,
  value: unknown,
  min: number,
  max: number,
): asserts value is number {
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < min || value > max) {
    invalid(`${what} must be an integer between ${min} and ${max}, got ${String(value)}`);
  }
}

function stringMapBytes(
  what: string,
  value: unknown,
): { map: Record<string, string>; count: number; bytes: number } {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    invalid(`${what} must be an object of string values`);
  }
  let bytes = 0;
  let count = 0;
  for (const [name, v] of Object.entries(value)) {
    if (name === "") invalid(`${what} names must not be empty`);
    if (typeof v !== "string") invalid(`${what} ${JSON.stringify(name)} must be a string`);
    bytes += utf8Bytes(name) + utf8Bytes(v);
    count += 1;
  }
  return { map: sortedStringMap(value as Record<string, string>), count, bytes };
}

function limit(what: string, actual: number, max: number, field: keyof QueueConfig): never {
  throw new CasqError(
    "resource_exhausted",
    `${what} (${actual}) exceeds the queue's limit of ${max}; make it smaller or raise ${snakeCase(field)}`,
  );
}

/** Throws `resource_exhausted` when an enqueue request of `size` messages is over the queue's `max_batch`. */
export function checkRequestSize(size: number, config: QueueConfig): void {
  if (size > config.maxBatch) {
    throw new CasqError(
      "resource_exhausted",
      `batch of ${size} messages exceeds the queue's max_batch of ${config.maxBatch}; split it into smaller batches`,
    );
  }
}

/** What {@link checkNewMessage} found valid, in stored form. */
export interface CheckedNewMessage {
  readonly headers: Record<string, string>;
  readonly traceContext: Record<string, string> | undefined;
  readonly runAt: number;
}

/**
 * Checks one message of an enqueue against the queue's `config` (fields and
 * limits; nothing that depends on the shard's state) and returns its maps
 * sorted and its `runAt` resolved against `now`. Error messages name it by
 * `index` ("message 3"). Throws `CasqError`; never mutates.
 */
export function checkNewMessage(
  input: NewMessage,
  config: QueueConfig,
  now: number,
  index: number,
): CheckedNewMessage {
  // Labels are built only on the way to an error, not once per message enqueued.
  if (typeof input !== "object" || input === null) invalid(`message ${index} must be an object`);
  if (!isId(input.id)) checkId(`message ${index}: id`, input.id);
  if (!(input.payload instanceof Uint8Array)) invalid(`message ${index}: payload must be bytes`);
  if (input.payload.byteLength > config.maxPayloadBytes) {
    limit(
      `message ${index}: payload size in bytes`,
      input.payload.byteLength,
      config.maxPayloadBytes,
      "maxPayloadBytes",
    );
  }
  let headers = sortedStringMap({});
  if (input.headers !== undefined) {
    const h = stringMapBytes(`message ${index}: header`, input.headers);
    if (h.count > config.maxHeaders)
      limit(`message ${index}: header count`, h.count, config.maxHeaders, "maxHeaders");
    if (h.bytes > config.maxHeaderBytes) {
      limit(`message ${index}: header size in bytes`, h.bytes, config.maxHeaderBytes, "maxHeaderBytes");
    }
    headers = h.map;
  }
  let traceContext: Record<string, string> | undefined;
  if (input.traceContext !== undefined) {
    const t = stringMapBytes(`message ${index}: trace context`, input.traceContext);
    if (t.bytes > MAX_TRACE_CONTEXT_BYTES) {
      invalid(`message ${index}: trace context is larger than ${MAX_TRACE_CONTEXT_BYTES} bytes`);
    }
    traceContext = t.map;
  }
  if (input.key !== undefined) {
    if (typeof input.key !== "string") invalid(`message ${index}: key must be a string`);
    if (utf8Bytes(input.key) > MAX_KEY_BYTES)
      invalid(`message ${index}: key is longer than ${MAX_KEY_BYTES} bytes`);
  }
  if (input.priority !== undefined)
    checkInteger(`message ${index}: priority`, input.priority, PRIORITY_MIN, PRIORITY_MAX);
  if (input.maxAttempts !== undefined) {
    checkInteger(`message ${index}: max_attempts`, input.maxAttempts, 1, MAX_MESSAGE_ATTEMPTS);
  }
  if (input.dedupId !== undefined && !isId(input.dedupId))
    checkId(`message ${index}: dedup_id`, input.dedupId);
  let runAt = now;
  if (input.runAt !== undefined && input.delayMs !== undefined) {
    invalid(`message ${index}: set run_at or delay_ms, not both`);
  }
  if (input.delayMs !== undefined) {
    checkInteger(`message ${index}: delay_ms`, input.delayMs, 0, MAX_DELAY_MS);
    runAt = now + input.delayMs;
  }
  if (input.runAt !== undefined) {
    checkInteger(`message ${index}: run_at`, input.runAt, 0, now + MAX_DELAY_MS);
    runAt = Math.max(now, input.runAt);
  }
  return { headers, traceContext, runAt };
}

/**
 * Checks one message of an enqueue ({@link checkNewMessage}) and returns its
 * stored form at `offset` (payload copied). Throws `CasqError`; never mutates.
 */
export function normalizeNewMessage(
  input: NewMessage,
  offset: number,
  config: QueueConfig,
  now: number,
  index: number,
): MessageRecord {
  const { headers, traceContext, runAt } = checkNewMessage(input, config, now, index);
  return {
    id: input.id,
    offset,
    payload: new Uint8Array(input.payload),
    headers,
    key: input.key,
    priority: input.priority ?? 0,
    runAt,
    maxAttempts: input.maxAttempts,
    dedupId: input.dedupId,
    enqueuedAt: now,
    traceContext,
  };
}

/**
 * Checks the receipts of a heartbeat / ack / nack: an array of at most
 * `maxBatch` `{ offset, attempt }` with integer offset >= 0 and attempt >= 1.
 */
export function checkReceipts(
  receipts: unknown,
  config: QueueConfig,
): asserts receipts is readonly Receipt[] {
  if (!Array.isArray(receipts)) invalid("receipts must be an array of { offset, attempt }");
  if (receipts.length > config.maxBatch) {
    limit("number of receipts", receipts.length, config.maxBatch, "maxBatch");
  }
  receipts.forEach((r: unknown, i) => {
    if (typeof r !== "object" || r === null) invalid(`receipt ${i} must be an object { offset, attempt }`);
    const { offset, attempt } = r as Record<string, unknown>;
    checkInteger(`receipt ${i}: offset`, offset, 0, Number.MAX_SAFE_INTEGER);
    checkInteger(`receipt ${i}: attempt`, attempt, 1, Number.MAX_SAFE_INTEGER);
  });
}

/** Throws `invalid_argument` unless `value` is a usable lease TTL in ms (100 ms .. 24 h). */
export function checkLeaseTtl(what: string, value: unknown): asserts value is number {
  checkInteger(what, value, 100, 86_400_000);
}
