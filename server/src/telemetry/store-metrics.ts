/**
 * Store metrics: a {@link StoreObserver} that counts every object-store call
 * an `InstrumentedStore` reports into `casq_store_operations_total`,
 * `casq_store_operation_duration_seconds` and `casq_store_bytes_total`.
 *
 * Placed inside the `RetryingStore` (as `casq serve` does), it sees every
 * attempt, i.e. every request the store bills: `put` calls per job is the
 * cost metric, `precondition_failed` puts are lost CAS races, and
 * `unavailable` / `ambiguous` outcomes are the store misbehaving. The key is
 * never a label.
 */
import type { StoreObserver } from "../store/instrumented-store.ts";
import type { CasqMetrics } from "./metrics.ts";

/** A StoreObserver that updates the store families of `metrics`. */
export function storeMetricsObserver(metrics: CasqMetrics): StoreObserver {
  return {
    onEnd(end) {
      metrics.storeOperations.inc({ op: end.op, outcome: end.outcome });
      metrics.storeOperationDuration.observe({ op: end.op }, Math.max(0, end.durationMs) / 1000);
      if (end.bytesOut > 0) metrics.storeBytes.inc({ op: end.op, direction: "out" }, end.bytesOut);
      if (end.bytesIn > 0) metrics.storeBytes.inc({ op: end.op, direction: "in" }, end.bytesIn);
    },
  };
}
