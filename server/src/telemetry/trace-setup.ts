/**
 * Tracing from the standard OpenTelemetry environment variables, for `casq serve`.
 *
 * - `OTEL_TRACES_EXPORTER`: `none` (default: no provider, no spans, no cost),
 *   `otlp` (batched), `console` (each span printed on stdout as it ends, for
 *   debugging); a comma list combines them.
 * - `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or `OTEL_EXPORTER_OTLP_PROTOCOL`:
 *   `http/protobuf` (default), `http/json` or `grpc`.
 * - `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is) or
 *   `OTEL_EXPORTER_OTLP_ENDPOINT` (+ `/v1/traces` over HTTP), default
 *   `http://localhost:4318/v1/traces` (HTTP) or `http://localhost:4317`
 *   (gRPC); `OTEL_EXPORTER_OTLP_HEADERS` etc. are read by the exporter itself.
 * - `OTEL_SERVICE_NAME`: the `service.name` resource attribute, default `casq`.
 * - `OTEL_RESOURCE_ATTRIBUTES`: more resource attributes (`key=value,...`),
 *   read from the process environment by the OpenTelemetry env detector.
 * - `OTEL_SDK_DISABLED=true` turns tracing off whatever the exporter says.
 *
 * The provider is private to the server (not registered globally).
 */
import type { TracerProvider } from "@opentelemetry/api";
import { OTLPTraceExporter as OtlpGrpcExporter } from "@opentelemetry/exporter-trace-otlp-grpc";
import { OTLPTraceExporter as OtlpJsonExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { OTLPTraceExporter as OtlpProtobufExporter } from "@opentelemetry/exporter-trace-otlp-proto";
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
  type SpanExporter,
  type SpanProcessor,
} from "@opentelemetry/sdk-trace-base";
import { ATTR_SERVICE_NAME } from "@opentelemetry/semantic-conventions";

/** The exporters `OTEL_TRACES_EXPORTER` may name. */
export const TRACE_EXPORTERS = ["none", "otlp", "console"] as const;

/** The OTLP transports `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` may name (the specification's values). */
export const OTLP_PROTOCOLS = ["http/protobuf", "http/json", "grpc"] as const;

/** One of {@link OTLP_PROTOCOLS}. */
export type OtlpProtocol = (typeof OTLP_PROTOCOLS)[number];

/** A tracer provider made from the environment, with what it takes to flush and stop it. */
export interface EnvTracing {
  readonly tracerProvider: TracerProvider;
  /** The exporters in use (for the startup line). */
  readonly exporters: readonly string[];
  /** The OTLP endpoint, when `otlp` is one of them. */
  readonly endpoint: string | undefined;
  /** The OTLP transport, when `otlp` is one of them. */
  readonly protocol: OtlpProtocol | undefined;
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
  let protocol: OtlpProtocol | undefined;
  for (const name of exporters) {
    if (name === "console") processors.push(new SimpleSpanProcessor(new ConsoleSpanExporter()));
    else if (name === "otlp") {
      protocol = otlpProtocol(env);
      endpoint = otlpTracesEndpoint(env, protocol);
      processors.push(new BatchSpanProcessor(otlpExporter(protocol, endpoint)));
    }
  }
  const provider = new BasicTracerProvider({
    resource: resourceFromEnv(env),
    spanProcessors: processors,
  });
  return { tracerProvider: provider, exporters, endpoint, protocol, shutdown: () => provider.shutdown() };
}

/** The OTLP transport the environment asks for (traces-specific variable first). */
export function otlpProtocol(env: NodeJS.ProcessEnv): OtlpProtocol {
  const raw = (env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL ?? env.OTEL_EXPORTER_OTLP_PROTOCOL ?? "").trim();
  if (raw === "") return "http/protobuf";
  if (!(OTLP_PROTOCOLS as readonly string[]).includes(raw))
    throw new TraceConfigError(
      `OTEL_EXPORTER_OTLP_PROTOCOL: unknown protocol ${JSON.stringify(raw)}; use ${OTLP_PROTOCOLS.join(", ")}`,
    );
  return raw as OtlpProtocol;
}

function otlpExporter(protocol: OtlpProtocol, url: string): SpanExporter {
  if (protocol === "grpc") return new OtlpGrpcExporter({ url });
  if (protocol === "http/json") return new OtlpJsonExporter({ url });
  return new OtlpProtobufExporter({ url });
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

/**
 * The OTLP traces URL the environment asks for (the specification's rules):
 * the traces variable as is; else the base URL, plus `/v1/traces` over HTTP;
 * else the default collector port of the protocol.
 */
export function otlpTracesEndpoint(env: NodeJS.ProcessEnv, protocol: OtlpProtocol = "http/protobuf"): string {
  const specific = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?.trim();
  if (specific) return specific;
  const base = env.OTEL_EXPORTER_OTLP_ENDPOINT?.trim();
  if (protocol === "grpc") return base || "http://localhost:4317";
  if (base) return `${base.replace(/\/+$/, "")}/v1/traces`;
  return "http://localhost:4318/v1/traces";
}
