/**
 * Whether an applied operation needs a write. Every model result carries
 * `changed`; operations that changed nothing (a heartbeat inside the persisted
 * lease, an empty claim, an idempotent re-ack) are answered without a PUT.
 */
import { CasqError } from "../errors.ts";
import type { OperationResult } from "../model/operations.ts";

/** True when the operation modified the document, so the batch must be written. */
export function operationChangesState(result: OperationResult): boolean {
  return result.changed;
}

/** Narrows an operation result to the expected kind. */
export function expectKind<K extends OperationResult["kind"]>(
  result: OperationResult,
  kind: K,
): Extract<OperationResult, { kind: K }> {
  if (result.kind !== kind) throw new CasqError("internal", `expected a ${kind} result, got ${result.kind}`);
  return result as Extract<OperationResult, { kind: K }>;
}
