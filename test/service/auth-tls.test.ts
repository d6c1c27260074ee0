/**
 * Bearer-token authentication with per-RPC permissions, and TLS (server
 * certificates and mutual TLS) with certificates made by `openssl` for the
 * test, over real gRPC and Connect on loopback.
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import {
  Health,
  HealthCheckResponse_ServingStatus as ServingStatus,
} from "@casq/api/grpc/health/v1/health_pb.ts";
import { CasqError, Producer } from "@casq/sdk";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bearer, bytes, codeOf, grpcClients, startTestServer, text, useTestServers } from "./support.ts";

const server = useTestServers();

const dir = mkdtempSync(join(tmpdir(), "casq-auth-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("bearer tokens", () => {
  const tokensFile = join(dir, "tokens");
  beforeAll(() => {
    writeFileSync(
      tokensFile,
      [
        "# token                      permissions      name",
        "producer-token-0001          produce          billing-api",
        "worker-token-0000002         consume",
        "admin-token-00000003         admin            ops",
        "",
      ].join("\n"),
    );
  });

  it("requires a token, checks the permission per RPC, and leaves health and reflection open", async () => {
    const s = await server({ authTokensFile: tokensFile });
    const none = grpcClients(s.address);
    const wrong = grpcClients(s.address, [bearer("not-a-real-token")]);
    const producer = grpcClients(s.address, [bearer("producer-token-0001")]);
    const worker = grpcClients(s.address, [bearer("worker-token-0000002")]);
    const admin = grpcClients(s.address, [bearer("admin-token-00000003")]);

    const enqueue = (c: typeof none) =>
      c.queue.enqueue({ queue: "secure", messages: [{ payload: bytes("x") }] });
    expect(await codeOf(enqueue(none))).toBe("Unauthenticated");
    expect(await codeOf(enqueue(wrong))).toBe("Unauthenticated");
    expect(await codeOf(enqueue(worker))).toBe("PermissionDenied");
    expect(await codeOf(enqueue(producer))).toBe("OK");
    expect(await codeOf(enqueue(admin))).toBe("OK");
    // The SDK's producer sends its requests on an EnqueueStream, which needs the same permission.
    const streamed = new Producer({ brokers: [s.address], token: "producer-token-0001" });
    expect((await streamed.enqueue("secure", "y")).id).toMatch(/^[0-9A-Z]{26}$/);
    streamed.close();
    const refused = new Producer({ brokers: [s.address], token: "worker-token-0000002", maxAttempts: 1 });
    const error = await refused.enqueue("secure", "z").catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CasqError);
    expect((error as CasqError).code).toBe(Code.PermissionDenied);

    expect(await codeOf(producer.queue.claim({ queue: "secure", workerId: "w" }))).toBe("PermissionDenied");
    const claimed = await worker.queue.claim({ queue: "secure", workerId: "w" });
    expect(text(claimed.messages[0]?.message?.payload)).toBe("x");
    expect(await codeOf(worker.queue.lookupShards({ queue: "secure" }))).toBe("OK");
    expect(await codeOf(producer.queue.lookupShards({ queue: "secure" }))).toBe("OK");

    expect(await codeOf(worker.admin.getQueue({ queue: "secure" }))).toBe("PermissionDenied");
    expect(await codeOf(admin.admin.getQueue({ queue: "secure" }))).toBe("OK");

    const denied = await (async () => {
      try {
        await worker.admin.listQueues({});
      } catch (error) {
        return ConnectError.from(error).rawMessage;
      }
      return "";
    })();
    expect(denied).toMatch(/token token-[0-9a-f]{8} may not call casq.v1.AdminService\/ListQueues/);

    const health = createClient(Health, none.transport);
    expect((await health.check({ service: "" })).status).toBe(ServingStatus.SERVING);

    // Connect JSON over HTTP/1.1 is checked the same way.
    const res = await fetch(`http://${s.address}/casq.v1.QueueService/LookupShards`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ queue: "secure" }),
    });
    expect(res.status).toBe(401);
  });

  it("refuses to start with a malformed token file", async () => {
    const bad = join(dir, "bad-tokens");
    writeFileSync(bad, "short produce\n");
    await expect(startTestServer({ authTokensFile: bad })).rejects.toThrow(
      /line 1: the token is shorter than 8/,
    );
    writeFileSync(bad, "long-enough-token write\n");
    await expect(startTestServer({ authTokensFile: bad })).rejects.toThrow(/unknown permission "write"/);
  });
});

describe("TLS", () => {
  const pki = {
    ca: join(dir, "ca.pem"),
    caKey: join(dir, "ca-key.pem"),
    cert: join(dir, "server.pem"),
    key: join(dir, "server-key.pem"),
    clientCert: join(dir, "client.pem"),
    clientKey: join(dir, "client-key.pem"),
  };

  beforeAll(() => makePki(pki, dir), 30_000);

  it("serves gRPC and Connect over TLS", async () => {
    const s = await server({ tls: { certFile: pki.cert, keyFile: pki.key } });
    const ca = readFileSync(pki.ca);
    const grpc = createClient(
      QueueService,
      createGrpcTransport({ baseUrl: `https://${s.address}`, nodeOptions: { ca } }),
    );
    await grpc.enqueue({ queue: "tls", messages: [{ payload: bytes("secret") }] });
    const json = createClient(
      QueueService,
      createConnectTransport({ baseUrl: `https://${s.address}`, httpVersion: "1.1", nodeOptions: { ca } }),
    );
    const claimed = await json.claim({ queue: "tls", workerId: "w" });
    expect(text(claimed.messages[0]?.message?.payload)).toBe("secret");
    // A client that does not trust the certificate cannot connect.
    const untrusting = createClient(QueueService, createGrpcTransport({ baseUrl: `https://${s.address}` }));
    expect(await codeOf(untrusting.lookupShards({ queue: "tls" }))).not.toBe("OK");
  });

  it("requires a client certificate signed by the client CA (mutual TLS)", async () => {
    const s = await server({ tls: { certFile: pki.cert, keyFile: pki.key, clientCaFile: pki.ca } });
    const ca = readFileSync(pki.ca);
    const withCert = createClient(
      QueueService,
      createGrpcTransport({
        baseUrl: `https://${s.address}`,
        nodeOptions: { ca, cert: readFileSync(pki.clientCert), key: readFileSync(pki.clientKey) },
      }),
    );
    await withCert.enqueue({ queue: "mtls", messages: [{ payload: bytes("ok") }] });
    const withoutCert = createClient(
      QueueService,
      createGrpcTransport({ baseUrl: `https://${s.address}`, nodeOptions: { ca } }),
    );
    expect(await codeOf(withoutCert.lookupShards({ queue: "mtls" }))).not.toBe("OK");
  });
});

/** A CA, a server certificate for 127.0.0.1 and a client certificate signed by it, made with openssl. */
function makePki(pki: Record<string, string>, directory: string): void {
  const openssl = (...args: string[]) => execFileSync("openssl", args, { stdio: "pipe", cwd: directory });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  openssl(
    "req",
    "-x509",
    ...ec,
    "-days",
    "1",
    "-subj",
    "/CN=casq test CA",
    "-keyout",
    pki.caKey as string,
    "-out",
    pki.ca as string,
  );
  const sign = (name: string, key: string, cert: string, ext: string) => {
    const csr = join(directory, `${name}.csr`);
    const extFile = join(directory, `${name}.ext`);
    writeFileSync(extFile, ext);
    openssl("req", ...ec, "-subj", `/CN=${name}`, "-keyout", key, "-out", csr);
    openssl(
      "x509",
      "-req",
      "-in",
      csr,
      "-CA",
      pki.ca as string,
      "-CAkey",
      pki.caKey as string,
      "-CAcreateserial",
      "-days",
      "1",
      "-out",
      cert,
      "-extfile",
      extFile,
    );
  };
  sign("localhost", pki.key as string, pki.cert as string, "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
  sign("casq-client", pki.clientKey as string, pki.clientCert as string, "extendedKeyUsage=clientAuth\n");
}
