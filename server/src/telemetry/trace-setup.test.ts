import { describe, expect, it } from "vitest";
import { otlpTracesEndpoint, TraceConfigError, tracingFromEnv } from "./trace-setup.ts";

describe("tracingFromEnv", () => {
  it("is off by default, with none, and when the SDK is disabled", () => {
    expect(tracingFromEnv({})).toBeUndefined();
    expect(tracingFromEnv({ OTEL_TRACES_EXPORTER: "none" })).toBeUndefined();
    expect(tracingFromEnv({ OTEL_TRACES_EXPORTER: "console", OTEL_SDK_DISABLED: "true" })).toBeUndefined();
  });

  it("builds console and otlp exporters", async () => {
    const t = tracingFromEnv({
      OTEL_TRACES_EXPORTER: "console, otlp",
      OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318/",
    });
    expect(t?.exporters).toEqual(["console", "otlp"]);
    expect(t?.endpoint).toBe("http://collector:4318/v1/traces");
    await t?.shutdown();
  });

  it("rejects an unknown exporter", () => {
    expect(() => tracingFromEnv({ OTEL_TRACES_EXPORTER: "zipkin" })).toThrow(TraceConfigError);
  });

  it("prefers the traces endpoint", () => {
    expect(
      otlpTracesEndpoint({
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://a:1/x",
        OTEL_EXPORTER_OTLP_ENDPOINT: "http://b:2",
      }),
    ).toBe("http://a:1/x");
    expect(otlpTracesEndpoint({})).toBe("http://localhost:4318/v1/traces");
  });
});
