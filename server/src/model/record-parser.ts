/**
 * Strict readers of the records a shard head, a v1 document and a segment
 * object share: a message, a dead letter and a dedup entry, the inverse of
 * `record-encoder.ts`. Each refuses a missing or unknown field and a value of
 * the wrong type or range with `Corrupt` (see `strict-json.ts`).
 */
import { PRIORITY_MAX, PRIORITY_MIN } from "./input-validation.ts";
import { sortedStringMap } from "./shard-mechanics.ts";
import type { DeadLetterRecord, DedupEntry, MessageRecord } from "./shard-records.ts";
import { array, fail, integer, object, optional, stringRecord, text } from "./strict-json.ts";

/** Headers and trace context: string values, kept in sorted key order. */
function stringMap(value: unknown, path: string): Record<string, string> {
  return sortedStringMap(stringRecord(value, path));
}

/** A payload: canonical standard padded base64. */
function payload(value: unknown, path: string): Uint8Array {
  const s = text(value, path);
  const bytes = Buffer.from(s, "base64");
  // Node's decoder skips characters outside the alphabet and takes the URL-safe one too, so
  // only canonical standard padded base64 encodes back to the same text: that one comparison
  // is the whole check (a regex scan before it cost more than the decode, per segment read).
  if (bytes.toString("base64") !== s) fail(path, "expected canonical standard padded base64");
  // A copy of exactly the payload's size: a small decoded Buffer is a slice of a shared pool.
  return new Uint8Array(bytes);
}

const MESSAGE_REQUIRED = ["offset", "id", "enqueued_at", "payload"] as const;
const MESSAGE_OPTIONAL = [
  "run_at",
  "priority",
  "key",
  "max_attempts",
  "dedup_id",
  "headers",
  "trace_context",
] as const;

/**
 * A message (`targets` allowed only where a redriven message may sit: v1
 * documents and the v2 head's tail).
 */
export function message(
  value: unknown,
  path: string,
  allowTargets: boolean,
): { msg: MessageRecord; targets: string[] | undefined } {
  const o = object(
    value,
    path,
    MESSAGE_REQUIRED,
    allowTargets ? [...MESSAGE_OPTIONAL, "targets"] : MESSAGE_OPTIONAL,
  );
  const enqueuedAt = integer(o.enqueued_at, `${path}.enqueued_at`);
  const runAt = optional(o, "run_at", integer, path) ?? enqueuedAt;
  if (runAt < enqueuedAt) fail(`${path}.run_at`, "must not be before enqueued_at");
  const msg: MessageRecord = {
    id: text(o.id, `${path}.id`, true),
    offset: integer(o.offset, `${path}.offset`),
    payload: payload(o.payload, `${path}.payload`),
    headers: optional(o, "headers", stringMap, path) ?? sortedStringMap({}),
    key: optional(o, "key", text, path),
    priority: optional(o, "priority", (v, p) => integer(v, p, PRIORITY_MIN, PRIORITY_MAX), path) ?? 0,
    runAt,
    maxAttempts: optional(o, "max_attempts", (v, p) => integer(v, p, 1, 1_000), path),
    dedupId: optional(o, "dedup_id", (v, p) => text(v, p, true), path),
    enqueuedAt,
    traceContext: optional(o, "trace_context", stringMap, path),
  };
  const targets = optional(
    o,
    "targets",
    (v, p) => array(v, p).map((t, i) => text(t, `${p}[${i}]`, true)),
    path,
  );
  return { msg, targets };
}

/** A dead letter: when and why it died, and its message. */
export function deadLetter(v: unknown, p: string): DeadLetterRecord {
  const d = object(v, p, ["dead_at", "attempts", "reason", "message"]);
  return {
    deadAt: integer(d.dead_at, `${p}.dead_at`),
    attempts: integer(d.attempts, `${p}.attempts`),
    reason: text(d.reason, `${p}.reason`),
    message: message(d.message, `${p}.message`, false).msg,
  };
}

/** A remembered dedup id. */
export function dedupEntry(v: unknown, p: string): DedupEntry {
  const e = object(v, p, ["dedup_id", "id", "offset", "expires_at"]);
  return {
    dedupId: text(e.dedup_id, `${p}.dedup_id`, true),
    id: text(e.id, `${p}.id`, true),
    offset: integer(e.offset, `${p}.offset`),
    expiresAt: integer(e.expires_at, `${p}.expires_at`),
  };
}
