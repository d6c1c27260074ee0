/**
 * Tracing for tests: a tracer provider that keeps every finished span in
 * memory (exported so tests outside `server/` need not resolve the SDK).
 */
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
} from "@opentelemetry/sdk-trace-base";

export type { ReadableSpan };

/** A provider whose finished spans land in `exporter.getFinishedSpans()`. */
export function inMemoryTracing(): { provider: BasicTracerProvider; exporter: InMemorySpanExporter } {
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  return { provider, exporter };
}
