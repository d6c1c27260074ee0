/**
 * Input validation of the wire requests, before anything reaches the broker.
 *
 * Every field a client controls is checked here against the ranges the
 * protos document, so that a malformed request is INVALID_ARGUMENT with a
 * message naming the field, and nothing at all is applied: a batch that
 * spans several shards is checked as a whole before any shard sees it.
 * Limits that depend on a queue's config (payload and header sizes, batch
 * size) are checked by the engine with the config in force and come back as
 * RESOURCE_EXHAUSTED naming the limit to raise.
 */
import type { Duration } from "@bufbuild/protobuf/wkt";
import type { NewMessage } from "@casq/api/casq/v1/message_pb.ts";
import type { EnqueueInput } from "../broker/broker.ts";
import { CasqError, quoteValue } from "../errors.ts";
import { utf8Bytes } from "../model/approx-size.ts";
import {
  MAX_DELAY_MS,
  MAX_ID_BYTES,
  MAX_KEY_BYTES,
  MAX_MESSAGE_ATTEMPTS,
  MAX_TRACE_CONTEXT_BYTES,
  PRIORITY_MAX,
  PRIORITY_MIN,
} from "../model/input-validation.ts";
import { DEFAULT_SUBSCRIPTION, NAME_PATTERN } from "../model/shard-state.ts";
import { durationToMs, formatMs, timestampToMs, traceContextFromProto } from "./conversions.ts";

/** Most messages in one Enqueue, and most messages one Claim returns. */
export const MAX_ITEMS_PER_CALL = 1000;
/** Longest long-poll wait of a Claim. */
export const MAX_CLAIM_WAIT_MS = 20_000;
/** Lease TTL bounds of a claim or a Work session. */
export const MIN_LEASE_TTL_MS = 100;
/** Longest lease TTL. */
export const MAX_LEASE_TTL_MS = 86_400_000;
/** Nack reasons are cut to this many characters. */
export const MAX_REASON_CHARS = 2048;

function invalid(message: string): never {
  throw new CasqError("invalid_argument", message);
}

/** A queue name from field `field`; throws `invalid_argument` naming the field and the pattern. */
export function checkQueueName(value: string, field = "queue"): string {
  if (value === "") invalid(`${field} is required: name the queue`);
  if (!NAME_PATTERN.test(value))
    invalid(
      `${field} ${quoteValue(value)} is not a valid queue name: use 1-128 characters of a-z 0-9 . _ - starting with a letter or digit`,
    );
  return value;
}

/** A subscription name; empty means "default" unless `required`. */
export function checkSubscriptionName(value: string, field = "subscription", required = false): string {
  if (value === "") {
    if (required) invalid(`${field} is required`);
    return DEFAULT_SUBSCRIPTION;
  }
  if (!NAME_PATTERN.test(value))
    invalid(
      `${field} ${quoteValue(value)} is not a valid subscription name: use 1-128 characters of a-z 0-9 . _ - starting with a letter or digit`,
    );
  return value;
}

/** A worker id: required, at most 256 UTF-8 bytes. */
export function checkWorkerId(value: string, field = "worker_id"): string {
  if (value === "") invalid(`${field} is required: identify the worker, e.g. "host-1/pid-4242"`);
  if (utf8Bytes(value) > MAX_ID_BYTES) invalid(`${field} is longer than ${MAX_ID_BYTES} bytes`);
  return value;
}

/** A lease TTL (100 ms..24 h), or undefined when unset. */
export function checkLeaseTtl(value: Duration | undefined, field = "lease_ttl"): number | undefined {
  return value === undefined ? undefined : durationToMs(value, field, MIN_LEASE_TTL_MS, MAX_LEASE_TTL_MS);
}

/** A claim's max_messages: 0 means 1, at most 1000. */
export function checkMaxMessages(value: number, field = "max_messages"): number {
  if (value > MAX_ITEMS_PER_CALL)
    invalid(`${field} must be between 1 and ${MAX_ITEMS_PER_CALL} (0 means 1), got ${value}`);
  return value === 0 ? 1 : value;
}

/** A claim's long-poll wait (0..20 s); unset means 0. */
export function checkClaimWait(value: Duration | undefined): number {
  return value === undefined ? 0 : durationToMs(value, "wait", 0, MAX_CLAIM_WAIT_MS);
}

/** A nack delay (0..365 days), or undefined when unset (the queue's backoff applies). */
export function checkNackDelay(value: Duration | undefined, field = "delay"): number | undefined {
  return value === undefined ? undefined : durationToMs(value, field, 0, MAX_DELAY_MS);
}

/** Longest `timeout` of an EnqueueStream request. */
export const MAX_REQUEST_TIMEOUT_MS = 24 * 60 * 60 * 1000;

/** The `timeout` of an EnqueueStream request (0..24 h), or undefined when unset (no bound). */
export function checkRequestTimeout(value: Duration | undefined): number | undefined {
  return value === undefined ? undefined : durationToMs(value, "timeout", 0, MAX_REQUEST_TIMEOUT_MS);
}

/** A nack reason, cut to 2048 characters; undefined when empty. */
export function nackReason(value: string): string | undefined {
  if (value === "") return undefined;
  return value.length > MAX_REASON_CHARS ? value.slice(0, MAX_REASON_CHARS) : value;
}

/** A page size: 0 means 100, at most 1000. */
export function checkPageSize(value: number, field = "page_size"): number {
  if (value > MAX_ITEMS_PER_CALL) invalid(`${field} must be at most ${MAX_ITEMS_PER_CALL}, got ${value}`);
  return value === 0 ? 100 : value;
}

/** Trace context found in the call's metadata (`traceparent`, `tracestate`), if any. */
export function traceContextFromHeaders(headers: Headers): Record<string, string> | undefined {
  const traceparent = headers.get("traceparent");
  if (!traceparent) return undefined;
  const tracestate = headers.get("tracestate");
  return tracestate ? { traceparent, tracestate } : { traceparent };
}

/**
 * Checks the messages of an Enqueue and turns them into broker inputs.
 * `now` bounds `run_at` (at most 365 days ahead); `callTrace` is the trace
 * context of the call's metadata, used for messages that carry none.
 */
export function checkNewMessages(
  messages: readonly NewMessage[],
  now: number,
  callTrace: Record<string, string> | undefined,
): EnqueueInput[] {
  if (messages.length === 0) invalid("messages is empty: enqueue at least one message");
  if (messages.length > MAX_ITEMS_PER_CALL)
    invalid(
      `messages has ${messages.length} entries; at most ${MAX_ITEMS_PER_CALL} per call: split the batch`,
    );
  return messages.map((m, i) => checkNewMessage(m, i, now, callTrace));
}

/** How errors name message `index` of an Enqueue (built only for an error). */
const at = (index: number) => `messages[${index}]`;

/** The fields of an {@link EnqueueInput}, writable while one is built. */
type Writable<T> = { -readonly [K in keyof T]: T[K] };

function checkNewMessage(
  m: NewMessage,
  index: number,
  now: number,
  callTrace: Record<string, string> | undefined,
): EnqueueInput {
  if (m.priority < PRIORITY_MIN || m.priority > PRIORITY_MAX)
    invalid(`${at(index)}.priority must be between ${PRIORITY_MIN} and ${PRIORITY_MAX}, got ${m.priority}`);
  if (m.maxAttempts > MAX_MESSAGE_ATTEMPTS)
    invalid(
      `${at(index)}.max_attempts must be between 1 and ${MAX_MESSAGE_ATTEMPTS} (0 means the queue's), got ${m.maxAttempts}`,
    );
  if (utf8Bytes(m.key) > MAX_KEY_BYTES) invalid(`${at(index)}.key is longer than ${MAX_KEY_BYTES} bytes`);
  if (utf8Bytes(m.dedupId) > MAX_ID_BYTES)
    invalid(`${at(index)}.dedup_id is longer than ${MAX_ID_BYTES} bytes`);
  let hasHeaders = false;
  for (const name in m.headers) {
    hasHeaders = true;
    if (name === "") invalid(`${at(index)}.headers: a header name is empty`);
  }
  const own = traceContextFromProto(m.traceContext);
  const trace = own ?? callTrace;
  if (trace !== undefined) {
    const bytes = Object.entries(trace).reduce((n, [k, v]) => n + utf8Bytes(k) + utf8Bytes(v), 0);
    if (bytes > MAX_TRACE_CONTEXT_BYTES)
      invalid(
        own !== undefined
          ? `${at(index)}.trace_context is larger than ${MAX_TRACE_CONTEXT_BYTES} bytes`
          : `the call's traceparent / tracestate metadata (the trace context of ${at(index)}, which has none of its own) is larger than ${MAX_TRACE_CONTEXT_BYTES} bytes`,
      );
  }
  let runAt: number | undefined;
  let delayMs: number | undefined;
  if (m.schedule.case === "delay") {
    delayMs = durationToMs(m.schedule.value, `${at(index)}.delay`, 0, MAX_DELAY_MS);
  } else if (m.schedule.case === "runAt") {
    runAt = timestampToMs(m.schedule.value, `${at(index)}.run_at`);
    if (runAt > now + MAX_DELAY_MS)
      invalid(
        `${at(index)}.run_at is more than ${formatMs(MAX_DELAY_MS)} ahead; schedule at most 365 days ahead`,
      );
    // A time in the past means "now"; the model refuses negative times.
    if (runAt < now) runAt = undefined;
  }
  const input: Writable<EnqueueInput> = { payload: m.payload };
  if (hasHeaders) input.headers = m.headers;
  if (m.key !== "") input.key = m.key;
  if (m.priority !== 0) input.priority = m.priority;
  if (runAt !== undefined) input.runAt = runAt;
  if (delayMs !== undefined && delayMs > 0) input.delayMs = delayMs;
  if (m.maxAttempts !== 0) input.maxAttempts = m.maxAttempts;
  if (m.dedupId !== "") input.dedupId = m.dedupId;
  if (trace !== undefined) input.traceContext = trace;
  return input;
}
