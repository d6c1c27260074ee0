/**
 * Retry delays for nacked messages: exponential, capped, with jitter.
 *
 * The model uses no randomness, so the jitter is derived from a hash of
 * (message id, delivery attempt): the same nack on the same state always
 * yields the same delay (replayable simulation, identical results on a
 * broker that re-applies a batch), while different messages still spread
 * out instead of retrying in lock-step.
 */
import type { BackoffPolicy } from "./queue-config.ts";

/** 32-bit FNV-1a of a string's UTF-16 code units, mixed with a final avalanche step. */
export function hash32(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  // murmur3 finalizer: spreads the low-entropy tail of similar ids over all bits
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** A deterministic number in [0, 1) for one delivery of one message. */
export function jitterUnit(messageId: string, attempt: number): number {
  return hash32(`${messageId}\u0000${attempt}`) / 4294967296;
}

/**
 * The delay before a message may run again after its `failures`-th failed
 * attempt (failures >= 1): `min(maxMs, initialMs * multiplier^(failures-1))`,
 * scaled by `1 + jitter * (2u - 1)` with `u = jitterUnit(messageId, attempt)`,
 * rounded, and never above `maxMs` nor below 0.
 */
export function backoffDelayMs(
  policy: BackoffPolicy,
  failures: number,
  messageId: string,
  attempt: number,
): number {
  const exponent = Math.max(0, failures - 1);
  const raw = Math.min(policy.maxMs, policy.initialMs * policy.multiplier ** exponent);
  const factor = 1 + policy.jitter * (2 * jitterUnit(messageId, attempt) - 1);
  return Math.min(policy.maxMs, Math.max(0, Math.round(raw * factor)));
}
