import { afterEach, describe, expect, it, vi } from "vitest";
import {
  otlpProtocol,
  otlpTracesEndpoint,
  resourceFromEnv,
  TraceConfigError,
  tracingFromEnv,
} from "./trace-setup.ts";

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

describe("resourceFromEnv", () => {
  afterEach(() => vi.unstubAllEnvs());

  it("names the service casq by default", () => {
    vi.stubEnv("OTEL_SERVICE_NAME", "");
    vi.stubEnv("OTEL_RESOURCE_ATTRIBUTES", "");
    expect(resourceFromEnv({}).attributes["service.name"]).toBe("casq");
  });

  it("adds OTEL_RESOURCE_ATTRIBUTES and lets OTEL_SERVICE_NAME win", () => {
    vi.stubEnv(
      "OTEL_RESOURCE_ATTRIBUTES",
      "deployment.environment=staging,service.name=from-attributes,team=queues",
    );
    vi.stubEnv("OTEL_SERVICE_NAME", "");
    const fromAttributes = resourceFromEnv({});
    expect(fromAttributes.attributes).toMatchObject({
      "deployment.environment": "staging",
      team: "queues",
      "service.name": "from-attributes",
    });
    const named = resourceFromEnv({ OTEL_SERVICE_NAME: "casq-eu-1" });
    expect(named.attributes).toMatchObject({ "service.name": "casq-eu-1", team: "queues" });
  });
});

describe("OTLP protocol", () => {
  it("is http/protobuf unless the traces or the general variable says otherwise", () => {
    expect(otlpProtocol({})).toBe("http/protobuf");
    expect(otlpProtocol({ OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" })).toBe("grpc");
    expect(
      otlpProtocol({ OTEL_EXPORTER_OTLP_PROTOCOL: "grpc", OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "http/json" }),
    ).toBe("http/json");
    expect(() => otlpProtocol({ OTEL_EXPORTER_OTLP_PROTOCOL: "thrift" })).toThrow(TraceConfigError);
  });

  it("gRPC uses the base endpoint as is and defaults to port 4317", () => {
    expect(otlpTracesEndpoint({}, "grpc")).toBe("http://localhost:4317");
    expect(otlpTracesEndpoint({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4317" }, "grpc")).toBe(
      "http://collector:4317",
    );
    expect(otlpTracesEndpoint({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318" }, "http/json")).toBe(
      "http://collector:4318/v1/traces",
    );
  });

  it("builds an exporter for each protocol", async () => {
    for (const protocol of ["http/protobuf", "http/json", "grpc"]) {
      const t = tracingFromEnv({ OTEL_TRACES_EXPORTER: "otlp", OTEL_EXPORTER_OTLP_PROTOCOL: protocol });
      expect(t?.protocol).toBe(protocol);
      await t?.shutdown();
    }
  });
});
