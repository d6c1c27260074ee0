/**
 * Tracing from the standard OpenTelemetry environment variables, for `casq serve`.
 *
 * - `OTEL_TRACES_EXPORTER`: `none` (default: no provider, no spans, no cost),
 *   `otlp` (OTLP/HTTP protobuf, batched), `console` (each span printed on
 *   stdout as it ends, for debugging); a comma list combines them.
 * - `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is) or
 *   `OTEL_EXPORTER_OTLP_ENDPOINT` (+ `/v1/traces`), default
 *   `http://localhost:4318/v1/traces`; `OTEL_EXPORTER_OTLP_HEADERS` etc. are
 *   read by the exporter itself.
 * - `OTEL_SERVICE_NAME`: the `service.name` resource attribute, default `casq`.
 * - `OTEL_RESOURCE_ATTRIBUTES`: more resource attributes (`key=value,...`),
 *   read from the process environment by the OpenTelemetry env detector.
 * - `OTEL_SDK_DISABLED=true` turns tracing off whatever the exporter says.
 *
 * The provider is private to the server (not registered globally).
 */
import type { TracerProvider } from "@opentelemetry/api";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import {
  detectResources,
  envDetector,
  type Resource,
  resourceFromAttributes,
} from "@opentelemetry/resources";
import {
  BasicTracerProvider,
  BatchSpanProcessor,
  ConsoleSpanExporter,
  SimpleSpanProcessor,
  type SpanProcessor,
} from "@opentelemetry/sdk-trace-base";
import { ATTR_SERVICE_NAME } from "@opentelemetry/semantic-conventions";

/** The exporters `OTEL_TRACES_EXPORTER` may name. */
export const TRACE_EXPORTERS = ["none", "otlp", "console"] as const;

/** A tracer provider made from the environment, with what it takes to flush and stop it. */
export interface EnvTracing {
  readonly tracerProvider: TracerProvider;
  /** The exporters in use (for the startup line). */
  readonly exporters: readonly string[];
  /** The OTLP endpoint, when `otlp` is one of them. */
  readonly endpoint: string | undefined;
  /** Flushes buffered spans and stops exporting. */
  shutdown(): Promise<void>;
}

/** Raised for a value the environment variables cannot have. */
export class TraceConfigError extends Error {}

/** Reads the `OTEL_*` variables of `env`; undefined when tracing is off. */
export function tracingFromEnv(env: NodeJS.ProcessEnv = process.env): EnvTracing | undefined {
  if ((env.OTEL_SDK_DISABLED ?? "").trim().toLowerCase() === "true") return undefined;
  const names = (env.OTEL_TRACES_EXPORTER ?? "none")
    .split(",")
    .map((n) => n.trim().toLowerCase())
    .filter((n) => n !== "");
  for (const name of names)
    if (!(TRACE_EXPORTERS as readonly string[]).includes(name))
      throw new TraceConfigError(
        `OTEL_TRACES_EXPORTER: unknown exporter ${JSON.stringify(name)}; use ${TRACE_EXPORTERS.join(", ")}`,
      );
  const exporters = [...new Set(names.filter((n) => n !== "none"))];
  if (exporters.length === 0) return undefined;

  const processors: SpanProcessor[] = [];
  let endpoint: string | undefined;
  for (const name of exporters) {
    if (name === "console") processors.push(new SimpleSpanProcessor(new ConsoleSpanExporter()));
    else if (name === "otlp") {
      endpoint = otlpTracesEndpoint(env);
      processors.push(new BatchSpanProcessor(new OTLPTraceExporter({ url: endpoint })));
    }
  }
  const provider = new BasicTracerProvider({
    resource: resourceFromEnv(env),
    spanProcessors: processors,
  });
  return { tracerProvider: provider, exporters, endpoint, shutdown: () => provider.shutdown() };
}

/**
 * The resource spans are reported with: `service.name` `casq` unless
 * `OTEL_SERVICE_NAME` says otherwise, plus `OTEL_RESOURCE_ATTRIBUTES`.
 */
export function resourceFromEnv(env: NodeJS.ProcessEnv): Resource {
  const serviceName = env.OTEL_SERVICE_NAME?.trim();
  return resourceFromAttributes({ [ATTR_SERVICE_NAME]: "casq" })
    .merge(detectResources({ detectors: [envDetector] }))
    .merge(serviceName ? resourceFromAttributes({ [ATTR_SERVICE_NAME]: serviceName }) : null);
}

/** The OTLP/HTTP traces URL the environment asks for (the specification's rules). */
export function otlpTracesEndpoint(env: NodeJS.ProcessEnv): string {
  const specific = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?.trim();
  if (specific) return specific;
  const base = env.OTEL_EXPORTER_OTLP_ENDPOINT?.trim();
  if (base) return `${base.replace(/\/+$/, "")}/v1/traces`;
  return "http://localhost:4318/v1/traces";
}
