/**
 * Server reflection (v1 and v1alpha) and health checking, over real gRPC on
 * loopback with connect clients, the way grpcurl and health probes use them.
 */
import { create, createFileRegistry, fromBinary } from "@bufbuild/protobuf";
import {
  type FileDescriptorProto,
  FileDescriptorProtoSchema,
  FileDescriptorSetSchema,
} from "@bufbuild/protobuf/wkt";
import {
  Health,
  HealthCheckResponse_ServingStatus as ServingStatus,
} from "@casq/api/grpc/health/v1/health_pb.ts";
import { ServerReflection as ServerReflectionV1 } from "@casq/api/grpc/reflection/v1/reflection_pb.ts";
import { ServerReflection as ServerReflectionV1alpha } from "@casq/api/grpc/reflection/v1alpha/reflection_pb.ts";
import { AsyncQueue } from "@casq/sdk/async-queue.ts";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import { UnavailableError } from "../../server/src/store/store-errors.ts";
import { eventually, sharedStore, startTestServer, useTestServers } from "./support.ts";

/** Orders files so that every file comes after the files it imports (all must be present). */
function dependenciesFirst(files: FileDescriptorProto[]): FileDescriptorProto[] {
  const out: FileDescriptorProto[] = [];
  const visit = (name: string) => {
    if (out.some((f) => f.name === name)) return;
    const file = files.find((f) => f.name === name);
    if (!file) throw new Error(`the answer lacks ${name}`);
    for (const dep of file.dependency) visit(dep);
    out.push(file);
  };
  for (const f of files) visit(f.name);
  return out;
}

const server = useTestServers();

describe("server reflection", () => {
  it("lists services and returns complete file descriptors (v1)", async () => {
    const s = await server();
    const transport = createGrpcTransport({ baseUrl: `http://${s.address}` });
    const reflection = createClient(ServerReflectionV1, transport);
    const requests = new AsyncQueue<
      Parameters<typeof reflection.serverReflectionInfo>[0] extends AsyncIterable<infer R> ? R : never
    >();
    const responses = reflection.serverReflectionInfo(requests)[Symbol.asyncIterator]();
    const ask = async (messageRequest: { case: string; value: unknown }) => {
      requests.push({ host: "", messageRequest } as never);
      const next = await responses.next();
      if (next.done) throw new Error("reflection stream ended");
      return next.value;
    };

    const listed = await ask({ case: "listServices", value: "*" });
    expect(listed.messageResponse.case).toBe("listServicesResponse");
    const names =
      listed.messageResponse.case === "listServicesResponse"
        ? listed.messageResponse.value.service.map((x) => x.name)
        : [];
    expect(names).toEqual([
      "casq.v1.AdminService",
      "casq.v1.QueueService",
      "grpc.health.v1.Health",
      "grpc.reflection.v1.ServerReflection",
      "grpc.reflection.v1alpha.ServerReflection",
    ]);

    const bySymbol = await ask({ case: "fileContainingSymbol", value: "casq.v1.QueueService" });
    if (bySymbol.messageResponse.case !== "fileDescriptorResponse") throw new Error("no descriptors");
    const files = bySymbol.messageResponse.value.fileDescriptorProto.map((b) =>
      fromBinary(FileDescriptorProtoSchema, b),
    );
    expect(files[0]?.name).toBe("casq/v1/queue_service.proto");
    expect(files.map((f) => f.name)).toEqual(
      expect.arrayContaining([
        "casq/v1/work.proto",
        "casq/v1/message.proto",
        "google/protobuf/duration.proto",
      ]),
    );
    // What grpcurl does: build a registry from the answer; every type must resolve.
    const registry = createFileRegistry(create(FileDescriptorSetSchema, { file: dependenciesFirst(files) }));
    const service = registry.getService("casq.v1.QueueService");
    expect(service?.methods.map((m) => m.name)).toContain("Work");
    expect(registry.getMessage("casq.v1.ClaimedMessage")?.fields.map((f) => f.name)).toContain("receipt");

    const byMethod = await ask({ case: "fileContainingSymbol", value: "casq.v1.AdminService.GetQueue" });
    expect(byMethod.messageResponse.case).toBe("fileDescriptorResponse");
    const byFile = await ask({ case: "fileByFilename", value: "grpc/health/v1/health.proto" });
    if (byFile.messageResponse.case !== "fileDescriptorResponse") throw new Error("no health descriptor");
    const health = fromBinary(
      FileDescriptorProtoSchema,
      byFile.messageResponse.value.fileDescriptorProto[0] ?? new Uint8Array(),
    );
    expect(health.service[0]?.method.map((m) => m.name)).toEqual(["Check", "Watch"]);

    const unknown = await ask({ case: "fileContainingSymbol", value: "no.such.Thing" });
    expect(unknown.messageResponse).toMatchObject({
      case: "errorResponse",
      value: { errorCode: Code.NotFound },
    });
    const ext = await ask({ case: "allExtensionNumbersOfType", value: "casq.v1.Message" });
    expect(ext.messageResponse).toMatchObject({
      case: "allExtensionNumbersResponse",
      value: { extensionNumber: [] },
    });
    requests.end();
  });

  it("answers the v1alpha service too", async () => {
    const s = await server();
    const reflection = createClient(
      ServerReflectionV1alpha,
      createGrpcTransport({ baseUrl: `http://${s.address}` }),
    );
    async function* one() {
      yield { host: "", messageRequest: { case: "listServices" as const, value: "" } };
    }
    for await (const response of reflection.serverReflectionInfo(one() as never)) {
      expect(response.messageResponse.case).toBe("listServicesResponse");
    }
  });
});

describe("health", () => {
  it("is SERVING while the store answers, NOT_SERVING when it fails and while shutting down", async () => {
    const inner = new MemoryStore();
    let failing = false;
    const store = sharedStore(inner);
    const flaky = {
      ...store,
      get: async (key: string) => {
        if (failing) throw new UnavailableError(key, "injected outage");
        return inner.get(key);
      },
    };
    const s = await startTestServer({ store: flaky, healthProbeIntervalMs: 50 });
    const health = createClient(Health, createGrpcTransport({ baseUrl: `http://${s.address}` }));
    expect((await health.check({ service: "" })).status).toBe(ServingStatus.SERVING);
    expect((await health.check({ service: "casq.v1.QueueService" })).status).toBe(ServingStatus.SERVING);
    await expect(health.check({ service: "nope.Service" })).rejects.toMatchObject({ code: Code.NotFound });

    const seen: ServingStatus[] = [];
    const abort = new AbortController();
    const watching = (async () => {
      try {
        for await (const r of health.watch({ service: "" }, { signal: abort.signal })) seen.push(r.status);
      } catch (error) {
        if (ConnectError.from(error).code !== Code.Canceled) throw error;
      }
    })();
    await eventually(() => seen.length === 1);
    failing = true;
    await eventually(() => seen.includes(ServingStatus.NOT_SERVING));
    failing = false;
    await eventually(() => seen.at(-1) === ServingStatus.SERVING);
    const closing = s.close({ graceful: true, timeoutMs: 2_000 });
    await eventually(() => seen.at(-1) === ServingStatus.NOT_SERVING);
    abort.abort();
    await watching;
    await closing;
    expect(seen).toEqual([
      ServingStatus.SERVING,
      ServingStatus.NOT_SERVING,
      ServingStatus.SERVING,
      ServingStatus.NOT_SERVING,
    ]);
  });
});
