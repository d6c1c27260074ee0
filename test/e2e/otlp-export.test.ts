/**
 * `casq serve` exports its spans over each OTLP transport the specification
 * names, chosen only by the standard `OTEL_*` variables: http/protobuf,
 * http/json and grpc, each to a receiver in this test. A CLI enqueue must
 * show up as the Enqueue RPC span with the configured service name and
 * resource attributes.
 */
import { afterEach, describe, expect, it } from "vitest";
import { type OtlpReceiver, startOtlpGrpcReceiver, startOtlpReceiver } from "../support/otlp-receiver.ts";
import { casq, startServer, waitFor } from "./support/processes.ts";

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

const receivers: Record<string, () => Promise<OtlpReceiver>> = {
  "http/protobuf": startOtlpReceiver,
  "http/json": startOtlpReceiver,
  grpc: startOtlpGrpcReceiver,
};

describe("OTLP export from casq serve", () => {
  for (const [protocol, start] of Object.entries(receivers)) {
    it(`sends spans over ${protocol}`, async () => {
      const receiver = await start();
      cleanups.push(() => receiver.close());
      const server = await startServer({
        store: "memory:",
        env: {
          OTEL_TRACES_EXPORTER: "otlp",
          OTEL_EXPORTER_OTLP_PROTOCOL: protocol,
          OTEL_EXPORTER_OTLP_ENDPOINT: receiver.endpoint.replace(/\/v1\/traces$/, ""),
          OTEL_BSP_SCHEDULE_DELAY: "100",
          OTEL_SERVICE_NAME: "casq-otlp-test",
          OTEL_RESOURCE_ATTRIBUTES: "deployment.environment=otlp-test",
        },
      });
      cleanups.push(() => server.stop());
      // Over HTTP the base endpoint gets /v1/traces appended; over gRPC it is used as is.
      await waitFor("the tracing line", () =>
        server.output().includes(`otlp (${protocol} ${receiver.endpoint})`),
      );

      const enq = await casq(["enqueue", "traced", "hello", "--server", server.address]);
      expect(enq.code, enq.stderr).toBe(0);
      await waitFor(`an Enqueue span over ${protocol}`, () =>
        receiver.spans().some((s) => s.name === "casq.v1.QueueService/Enqueue"),
      );
      const span = receiver.spans().find((s) => s.name === "casq.v1.QueueService/Enqueue");
      expect(span?.service).toBe("casq-otlp-test");
      expect(span?.resource["deployment.environment"]).toBe("otlp-test");
      expect(span?.kind).toBe(2); // SERVER
      expect(span?.traceId).toMatch(/^[0-9a-f]{32}$/);
      expect(span?.attributes).toMatchObject({ "rpc.system": "grpc", "rpc.method": "Enqueue" });
    });
  }
});
