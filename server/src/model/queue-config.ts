/**
 * Per-queue configuration, stored inside every shard document.
 *
 * The config travels with the data: a broker that takes a shard over reads
 * the lease TTL, retry policy and limits from the document itself, so two
 * brokers can never disagree about them. `updateConfig` changes it with an
 * ordinary CAS write like any other operation.
 *
 * Validation is strict and tells the user the accepted range; a rejected
 * patch changes nothing.
 */
import { CasqError } from "../errors.ts";

/** Exponential backoff for nacked messages: `initialMs * multiplier^(failures-1)`, capped, with jitter. */
export interface BackoffPolicy {
  /** Delay after the first failed attempt, in ms. */
  readonly initialMs: number;
  /** Growth factor per further failure (>= 1). */
  readonly multiplier: number;
  /** Upper bound of any delay, jitter included, in ms. */
  readonly maxMs: number;
  /** Relative jitter in [0, 1]: the delay is scaled by a factor in `[1 - jitter, 1 + jitter]`. */
  readonly jitter: number;
}

/** The settings of one queue (identical in every shard of it). */
export interface QueueConfig {
  /** Lease length of a claim when the claim does not ask for one, in ms. */
  readonly leaseTtlMs: number;
  /** Deliveries per message (per subscription) before it is dead-lettered; a message may override it. */
  readonly maxAttempts: number;
  /** Delay policy for nacked messages. */
  readonly backoff: BackoffPolicy;
  /** How long a dedup id is remembered after its enqueue, in ms (0 disables deduplication). */
  readonly dedupWindowMs: number;
  /** How long a message stays after its enqueue once every subscription settled it, in ms (0 = drop at once). */
  readonly retentionMs: number;
  /** Largest accepted payload, in bytes. */
  readonly maxPayloadBytes: number;
  /** Enqueues are refused once the document would grow beyond this many bytes (claims and acks keep working). */
  readonly maxDocumentBytes: number;
  /** Most messages in one enqueue, receipts in one ack/nack/heartbeat, and messages returned by one claim. */
  readonly maxBatch: number;
  /** Dead letters kept per subscription; the oldest is evicted (and counted) beyond it. */
  readonly deadLetterLimit: number;
  /** Most headers on one message. */
  readonly maxHeaders: number;
  /** Largest total size of one message's header names and values, in UTF-8 bytes. */
  readonly maxHeaderBytes: number;
  /** Most subscriptions on one queue. */
  readonly maxSubscriptions: number;
}

/** A partial config; `backoff` may itself be partial. `Partial<QueueConfig>` is assignable to it. */
export type QueueConfigPatch = Partial<Omit<QueueConfig, "backoff">> & { backoff?: Partial<BackoffPolicy> };

/** The defaults: 60 s leases, 5 attempts, 1 s..5 min backoff, 5 min dedup window like SQS. */
export const DEFAULT_QUEUE_CONFIG: QueueConfig = Object.freeze({
  leaseTtlMs: 60_000,
  maxAttempts: 5,
  backoff: Object.freeze({ initialMs: 1_000, multiplier: 2, maxMs: 300_000, jitter: 0.2 }),
  dedupWindowMs: 300_000,
  retentionMs: 0,
  maxPayloadBytes: 1024 * 1024,
  maxDocumentBytes: 64 * 1024 * 1024,
  maxBatch: 1_000,
  deadLetterLimit: 10_000,
  maxHeaders: 64,
  maxHeaderBytes: 16 * 1024,
  maxSubscriptions: 64,
});

const DAY_MS = 86_400_000;

/** Accepted ranges, inclusive. Integers unless `fractional`. */
const RANGES: Record<Exclude<keyof QueueConfig, "backoff">, { min: number; max: number; unit: string }> = {
  leaseTtlMs: { min: 100, max: DAY_MS, unit: "ms" },
  maxAttempts: { min: 1, max: 1_000, unit: "" },
  dedupWindowMs: { min: 0, max: 7 * DAY_MS, unit: "ms" },
  retentionMs: { min: 0, max: 30 * DAY_MS, unit: "ms" },
  maxPayloadBytes: { min: 1, max: 1024 * 1024 * 1024, unit: "bytes" },
  maxDocumentBytes: { min: 64 * 1024, max: 5 * 1024 * 1024 * 1024, unit: "bytes" },
  maxBatch: { min: 1, max: 100_000, unit: "" },
  deadLetterLimit: { min: 0, max: 1_000_000, unit: "" },
  maxHeaders: { min: 0, max: 1_024, unit: "" },
  maxHeaderBytes: { min: 0, max: 1024 * 1024, unit: "bytes" },
  maxSubscriptions: { min: 1, max: 1_000, unit: "" },
};

const BACKOFF_RANGES: Record<keyof BackoffPolicy, { min: number; max: number; integer: boolean }> = {
  initialMs: { min: 0, max: DAY_MS, integer: true },
  multiplier: { min: 1, max: 100, integer: false },
  maxMs: { min: 0, max: 7 * DAY_MS, integer: true },
  jitter: { min: 0, max: 1, integer: false },
};

/** Config field names in snake_case, for error messages that match the API and the document. */
export function snakeCase(name: string): string {
  return name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
}

function checkNumber(path: string, value: unknown, min: number, max: number, integer: boolean): void {
  if (typeof value !== "number" || !Number.isFinite(value) || (integer && !Number.isInteger(value))) {
    throw new CasqError(
      "invalid_argument",
      `config ${path} must be ${integer ? "an integer" : "a number"} between ${min} and ${max}, got ${String(value)}`,
    );
  }
  if (value < min || value > max) {
    throw new CasqError("invalid_argument", `config ${path} must be between ${min} and ${max}, got ${value}`);
  }
}

/**
 * Checks a config patch on its own: known fields only, right types, values in
 * range. Throws `CasqError("invalid_argument")` naming the field and the range.
 * Cross-field rules (e.g. payload limit below document limit) are checked by
 * {@link mergeConfig}, which knows the config the patch applies to.
 */
export function validateConfigPatch(patch: unknown): asserts patch is QueueConfigPatch {
  if (typeof patch !== "object" || patch === null || Array.isArray(patch)) {
    throw new CasqError("invalid_argument", "config patch must be an object of config fields");
  }
  for (const [key, value] of Object.entries(patch)) {
    if (value === undefined) continue;
    if (key === "backoff") {
      if (typeof value !== "object" || value === null || Array.isArray(value)) {
        throw new CasqError(
          "invalid_argument",
          "config backoff must be an object with initial_ms, multiplier, max_ms, jitter",
        );
      }
      for (const [bkey, bvalue] of Object.entries(value)) {
        if (bvalue === undefined) continue;
        const range = BACKOFF_RANGES[bkey as keyof BackoffPolicy];
        if (range === undefined || !Object.hasOwn(BACKOFF_RANGES, bkey)) {
          throw new CasqError(
            "invalid_argument",
            `unknown config field backoff.${snakeCase(bkey)}; known: initial_ms, multiplier, max_ms, jitter`,
          );
        }
        checkNumber(`backoff.${snakeCase(bkey)}`, bvalue, range.min, range.max, range.integer);
      }
      continue;
    }
    const range = RANGES[key as keyof typeof RANGES];
    if (range === undefined || !Object.hasOwn(RANGES, key)) {
      const known = ["backoff", ...Object.keys(RANGES)].map(snakeCase).join(", ");
      throw new CasqError("invalid_argument", `unknown config field ${snakeCase(key)}; known: ${known}`);
    }
    checkNumber(snakeCase(key), value, range.min, range.max, true);
  }
}

/** Cross-field rules of a complete config; throws `invalid_argument`. */
function checkConsistent(config: QueueConfig): void {
  if (config.maxPayloadBytes > config.maxDocumentBytes) {
    throw new CasqError(
      "invalid_argument",
      `config max_payload_bytes (${config.maxPayloadBytes}) must not exceed max_document_bytes (${config.maxDocumentBytes})`,
    );
  }
  if (config.backoff.initialMs > config.backoff.maxMs) {
    throw new CasqError(
      "invalid_argument",
      `config backoff.initial_ms (${config.backoff.initialMs}) must not exceed backoff.max_ms (${config.backoff.maxMs})`,
    );
  }
}

/**
 * Returns `base` with `patch` applied (a new frozen object; `base` is not
 * touched). Validates the patch and the result; throws `invalid_argument`.
 */
export function mergeConfig(base: QueueConfig, patch: QueueConfigPatch): QueueConfig {
  validateConfigPatch(patch);
  const defined = <T extends object>(o: T): Partial<T> =>
    Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
  const { backoff, ...rest } = patch;
  const merged: QueueConfig = Object.freeze({
    ...base,
    ...defined(rest),
    backoff: Object.freeze({ ...base.backoff, ...(backoff === undefined ? {} : defined(backoff)) }),
  });
  checkConsistent(merged);
  return merged;
}

/**
 * Validates a complete config as read from a document. Returns the problem
 * in words, or undefined when it is acceptable.
 */
export function configProblem(config: QueueConfig): string | undefined {
  try {
    validateConfigPatch(config);
    checkConsistent(config);
    return undefined;
  } catch (error) {
    return error instanceof Error ? error.message : String(error);
  }
}

/** True when two configs hold the same values. */
export function sameConfig(a: QueueConfig, b: QueueConfig): boolean {
  for (const key of Object.keys(RANGES) as (keyof typeof RANGES)[]) if (a[key] !== b[key]) return false;
  for (const key of Object.keys(BACKOFF_RANGES) as (keyof BackoffPolicy)[])
    if (a.backoff[key] !== b.backoff[key]) return false;
  return true;
}
