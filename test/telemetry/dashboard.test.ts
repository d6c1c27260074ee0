/**
 * docs/grafana-dashboard.json stays importable and in step with the code:
 * it parses, has a Prometheus data source variable, and every casq_ metric
 * its queries use is registered by a broker.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Registry } from "prom-client";
import { describe, expect, it } from "vitest";
import { CasqMetrics } from "../../server/src/telemetry/metrics.ts";
import { ROOT } from "../e2e/support/processes.ts";

interface Target {
  readonly expr?: string;
}
interface Panel {
  readonly id: number;
  readonly type: string;
  readonly title: string;
  readonly targets?: readonly Target[];
  readonly panels?: readonly Panel[];
}

const dashboard = JSON.parse(readFileSync(join(ROOT, "docs", "grafana-dashboard.json"), "utf8")) as {
  schemaVersion: number;
  title: string;
  uid: string;
  panels: Panel[];
  templating: { list: { name: string; type: string; query: unknown; definition?: string }[] };
};

function allPanels(panels: readonly Panel[]): Panel[] {
  return panels.flatMap((p) => [p, ...allPanels(p.panels ?? [])]);
}

/** Metric family names a PromQL text refers to (histogram series mapped to their family). */
function metricNames(expr: string): string[] {
  return [...expr.matchAll(/\bcasq_[a-z0-9_]+/g)].map((m) => m[0].replace(/_(bucket|sum|count)$/, ""));
}

describe("docs/grafana-dashboard.json", () => {
  it("is a Grafana dashboard with a Prometheus data source variable", () => {
    expect(dashboard.schemaVersion).toBeGreaterThanOrEqual(36);
    expect(dashboard.title).toBe("casq");
    expect(dashboard.uid).toBeTruthy();
    const ds = dashboard.templating.list.find((v) => v.type === "datasource");
    expect(ds?.query).toBe("prometheus");
    const panels = allPanels(dashboard.panels);
    const ids = panels.map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    expect(panels.filter((p) => p.type !== "row").length).toBeGreaterThanOrEqual(20);
  });

  it("only queries metrics a broker registers", () => {
    const registered = new Set(
      new CasqMetrics({ registry: new Registry() }).registry.getMetricsAsArray().map((m) => m.name),
    );
    const exprs = [
      ...allPanels(dashboard.panels).flatMap((p) => (p.targets ?? []).map((t) => t.expr ?? "")),
      ...dashboard.templating.list.map((v) => v.definition ?? ""),
    ];
    const used = new Set(exprs.flatMap(metricNames));
    expect(used.size).toBeGreaterThan(20);
    const missing = [...used].filter((name) => !registered.has(name));
    expect(missing).toEqual([]);
    // And the families an operator alerts on are all on the dashboard.
    for (const name of [
      "casq_store_operations_total",
      "casq_store_operation_duration_seconds",
      "casq_commit_duration_seconds",
      "casq_cas_conflicts_total",
      "casq_pending_operations",
      "casq_rpc_duration_seconds",
      "casq_queue_depth",
      "casq_queue_in_flight",
      "casq_queue_dead",
      "casq_queue_oldest_message_age_seconds",
      "casq_shard_leader",
      "casq_shard_epoch",
      "casq_consumer_lag_messages",
      "casq_lease_expiries_total",
      "casq_nacks_total",
      "casq_repeat_deliveries_total",
      "casq_claim_to_ack_seconds",
    ])
      expect(used.has(name), name).toBe(true);
  });
});
