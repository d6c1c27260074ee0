/**
 * Helpers for the model's tests (not a test file itself).
 */
import { expect } from "vitest";
import { type CasqErrorCode, isCasqError } from "../src/errors.ts";
import { applyOperation } from "../src/model/apply-operation.ts";
import type { ClaimedMessage, NewMessage, Operation, Receipt } from "../src/model/operations.ts";
import type { QueueConfigPatch } from "../src/model/queue-config.ts";
import { ShardState } from "../src/model/shard-state.ts";

/** A fixed start time for tests. */
export const T0 = 1_700_000_000_000;

const textEncoder = new TextEncoder();
const textDecoder = new TextDecoder();

/** A new shard "jobs"/0 created at T0. */
export function newShard(config?: QueueConfigPatch, now = T0): ShardState {
  return ShardState.create({ queue: "jobs", shard: 0, config, now });
}

/** A message with a text payload. */
export function msg(id: string, extra: Partial<NewMessage> = {}): NewMessage {
  return { id, payload: textEncoder.encode(`payload of ${id}`), ...extra };
}

/** Decodes a payload to text. */
export function text(payload: Uint8Array): string {
  return textDecoder.decode(payload);
}

/** Enqueues and returns the per-message results. */
export function enqueue(state: ShardState, now: number, ...messages: NewMessage[]) {
  return applyOperation(state, { kind: "enqueue", messages }, now).results;
}

/** Claims and returns the claimed messages. */
export function claim(
  state: ShardState,
  now: number,
  options: {
    subscription?: string;
    max?: number;
    workerId?: string;
    leaseTtlMs?: number;
    credited?: boolean;
  } = {},
): readonly ClaimedMessage[] {
  return applyOperation(
    state,
    {
      kind: "claim",
      subscription: options.subscription ?? "default",
      workerId: options.workerId ?? "worker-1",
      max: options.max ?? 100,
      leaseTtlMs: options.leaseTtlMs,
      ...(options.credited === undefined ? {} : { credited: options.credited }),
    },
    now,
  ).messages;
}

/** Acks receipts and returns the outcomes. */
export function ack(state: ShardState, now: number, receipts: Receipt[], subscription = "default") {
  return applyOperation(state, { kind: "ack", subscription, receipts }, now).results.map((r) => r.outcome);
}

/** Runs an expire sweep. */
export function expire(state: ShardState, now: number) {
  return applyOperation(state, { kind: "expire" }, now);
}

/** The encoded document as text. */
export function docText(state: ShardState): string {
  return textDecoder.decode(state.encode());
}

/** The encoded document parsed back to plain JSON. */
// biome-ignore lint/suspicious/noExplicitAny: tests poke at the raw document
export function docJson(state: ShardState): any {
  return JSON.parse(docText(state));
}

/** Bytes of a JSON value. */
export function jsonBytes(value: unknown): Uint8Array {
  return textEncoder.encode(JSON.stringify(value));
}

/** Ids of claimed messages. */
export function ids(messages: readonly { id: string }[]): string[] {
  return messages.map((m) => m.id);
}

/**
 * Asserts that `op` is rejected with `code` and leaves the state byte for byte
 * (and size estimate) unchanged. Returns the error message.
 */
export function expectRejected(state: ShardState, op: Operation, now: number, code: CasqErrorCode): string {
  const before = docText(state);
  const approx = state.approxBytes();
  let caught: unknown;
  try {
    applyOperation(state, op, now);
  } catch (error) {
    caught = error;
  }
  expect(isCasqError(caught), `expected a CasqError(${code}), got ${String(caught)}`).toBe(true);
  if (!isCasqError(caught)) throw new Error("unreachable");
  expect(caught.code, caught.message).toBe(code);
  expect(docText(state)).toBe(before);
  expect(state.approxBytes()).toBe(approx);
  return caught.message;
}

/** Asserts `fn` throws a CasqError with `code`; returns its message. */
export function expectCasqError(fn: () => unknown, code: CasqErrorCode): string {
  try {
    fn();
  } catch (error) {
    if (!isCasqError(error)) throw error;
    expect(error.code, error.message).toBe(code);
    return error.message;
  }
  throw new Error(`expected a CasqError(${code}), nothing was thrown`);
}
