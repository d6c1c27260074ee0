/**
 * Whether an applied operation needs a write. Every model result carries
 * `changed`; operations that changed nothing (a heartbeat inside the persisted
 * lease, an empty claim, an idempotent re-ack) are answered without a PUT.
 */
import type { OperationResult } from "../model/operations.ts";

/** True when the operation modified the document, so the batch must be written. */
export function operationChangesState(result: OperationResult): boolean {
  return result.changed;
}
