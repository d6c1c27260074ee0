/**
 * One port, two serving stacks: gRPC clients (HTTP/2) are answered by
 * @grpc/grpc-js, Connect and gRPC-Web clients (HTTP/1.1) by connect-node,
 * over cleartext and over TLS (chosen by ALPN), and both answer an error
 * with the same status, trailer and detail bytes.
 *
 * grpc-js is recognised by the compression header it sends with every
 * answer (`grpc-accept-encoding: identity,deflate,gzip`).
 */
import { readFileSync } from "node:fs";
import http2 from "node:http2";
import https from "node:https";
import tls from "node:tls";
import { create, toBinary } from "@bufbuild/protobuf";
import { EnqueueRequestSchema, QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import { Health, HealthCheckResponse_ServingStatus } from "@casq/api/grpc/health/v1/health_pb.ts";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import { makeSelfSignedCert, type SelfSignedCert } from "../../server/testing/self-signed-cert.ts";
import { bytes, grpcClients, sharedStore, text, useTestServers } from "./support.ts";

const server = useTestServers();

/** What grpc-js answers every call with (connect-node never sends `deflate`). */
const GRPC_JS_ACCEPT_ENCODING = "identity,deflate,gzip";

function envelope(body: Uint8Array): Buffer {
  const out = Buffer.alloc(5 + body.length);
  out.writeUInt32BE(body.length, 1);
  out.set(body, 5);
  return out;
}

/** A gRPC call over raw HTTP/2; resolves with the response headers and trailers together. */
function rawGrpc(
  session: http2.ClientHttp2Session,
  path: string,
  body: Uint8Array,
): Promise<Record<string, string | string[] | undefined>> {
  return new Promise((resolve, reject) => {
    const req = session.request({
      ":method": "POST",
      ":path": path,
      "content-type": "application/grpc",
      te: "trailers",
    });
    const out: Record<string, string | string[] | undefined> = {};
    req.on("response", (headers) => Object.assign(out, headers));
    req.on("trailers", (trailers) => Object.assign(out, trailers));
    req.on("data", () => {});
    req.on("end", () => resolve(out));
    req.on("error", reject);
    req.end(envelope(body));
  });
}

/** A gRPC-Web call over HTTP/1.1; resolves with the fields of its trailer frame. */
async function rawGrpcWeb(address: string, path: string, body: Uint8Array): Promise<Record<string, string>> {
  const res = await fetch(`http://${address}${path}`, {
    method: "POST",
    headers: { "content-type": "application/grpc-web+proto", "x-grpc-web": "1" },
    body: envelope(body),
  });
  const data = Buffer.from(await res.arrayBuffer());
  const fields: Record<string, string> = {};
  for (let at = 0; at + 5 <= data.length; ) {
    const length = data.readUInt32BE(at + 1);
    if ((data[at] ?? 0) & 0x80)
      for (const line of data
        .subarray(at + 5, at + 5 + length)
        .toString("utf8")
        .split("\r\n")) {
        const colon = line.indexOf(":");
        if (colon > 0) fields[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
      }
    at += 5 + length;
  }
  return fields;
}

describe("one port, two stacks", () => {
  it("answers gRPC over h2c with grpc-js, and Connect JSON and gRPC-Web over HTTP/1.1 with connect", async () => {
    const s = await server();
    const session = http2.connect(`http://${s.address}`);
    try {
      const check = await rawGrpc(session, "/grpc.health.v1.Health/Check", new Uint8Array(0));
      expect(check["grpc-status"]).toBe("0");
      expect(check["grpc-accept-encoding"]).toBe(GRPC_JS_ACCEPT_ENCODING);
    } finally {
      session.close();
    }

    const json = await fetch(`http://${s.address}/grpc.health.v1.Health/Check`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    expect(json.status).toBe(200);
    expect(await json.json()).toEqual({ status: "SERVING" });

    const web = createClient(
      Health,
      createGrpcWebTransport({ baseUrl: `http://${s.address}`, httpVersion: "1.1" }),
    );
    expect((await web.check({})).status).toBe(HealthCheckResponse_ServingStatus.SERVING);
  });

  it("sends the same redirect status, trailer and detail bytes from grpc-js (gRPC) and connect (gRPC-Web)", async () => {
    const store = sharedStore(new MemoryStore());
    const a = await server({ store, brokerId: "broker-a" });
    const b = await server({ store, brokerId: "broker-b" });
    await grpcClients(a.address).queue.enqueue({ queue: "led", messages: [{ payload: bytes("1") }] });
    const request = toBinary(
      EnqueueRequestSchema,
      create(EnqueueRequestSchema, { queue: "led", messages: [{ payload: bytes("2") }] }),
    );
    const path = "/casq.v1.QueueService/Enqueue";

    const session = http2.connect(`http://${b.address}`);
    let viaGrpc: Record<string, string | string[] | undefined>;
    try {
      viaGrpc = await rawGrpc(session, path, request);
    } finally {
      session.close();
    }
    const viaWeb = await rawGrpcWeb(b.address, path, request);

    expect(viaGrpc["grpc-status"]).toBe("14");
    expect(viaWeb["grpc-status"]).toBe("14");
    expect(viaGrpc["casq-leader-address"]).toBe(a.advertisedAddress);
    expect(viaWeb["casq-leader-address"]).toBe(a.advertisedAddress);
    const details = (value: unknown) => Buffer.from(String(value), "base64");
    expect(details(viaGrpc["grpc-status-details-bin"]).length).toBeGreaterThan(0);
    expect(details(viaGrpc["grpc-status-details-bin"])).toEqual(details(viaWeb["grpc-status-details-bin"]));
    expect(decodeURIComponent(String(viaGrpc["grpc-message"]))).toBe(
      decodeURIComponent(viaWeb["grpc-message"] ?? ""),
    );
  });
});

describe("one port, two stacks, over TLS", () => {
  let cert: SelfSignedCert;
  beforeAll(() => {
    cert = makeSelfSignedCert();
  }, 30_000);
  afterAll(() => cert.remove());

  it("serves h2-only clients (gRPC) with grpc-js and HTTP/1.1 clients (Connect) with connect", async () => {
    const s = await server({ tls: cert });
    const ca = readFileSync(cert.certFile);
    const [host, port] = s.address.split(":");

    // A client offering both gets HTTP/1.1 (browsers, curl); one offering only h2 gets h2.
    const alpn = (offer: string[]) =>
      new Promise<string | false>((resolve, reject) => {
        const socket = tls.connect({ host, port: Number(port), ca, ALPNProtocols: offer }, () => {
          resolve(socket.alpnProtocol ?? false);
          socket.end();
        });
        socket.on("error", reject);
      });
    expect(await alpn(["h2", "http/1.1"])).toBe("http/1.1");
    expect(await alpn(["h2"])).toBe("h2");

    // connect-node's gRPC transport offers only h2: served by grpc-js.
    const queue = createClient(
      QueueService,
      createGrpcTransport({ baseUrl: `https://${s.address}`, nodeOptions: { ca } }),
    );
    await queue.enqueue({ queue: "tls", messages: [{ payload: bytes("secret") }] });
    const session = http2.connect(`https://${s.address}`, { ca });
    try {
      const check = await rawGrpc(session, "/grpc.health.v1.Health/Check", new Uint8Array(0));
      expect(check["grpc-status"]).toBe("0");
      expect(check["grpc-accept-encoding"]).toBe(GRPC_JS_ACCEPT_ENCODING);
    } finally {
      session.close();
    }

    // An HTTP/1.1 client over TLS speaks the Connect protocol to connect-node.
    const claimed = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = https.request(
        {
          host,
          port: Number(port),
          ca,
          method: "POST",
          path: "/casq.v1.QueueService/Claim",
          headers: { "content-type": "application/json" },
        },
        (res) => {
          let body = "";
          res.on("data", (d: Buffer) => {
            body += d.toString();
          });
          res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
        },
      );
      req.on("error", reject);
      req.end(JSON.stringify({ queue: "tls", workerId: "w" }));
    });
    expect(claimed.status).toBe(200);
    const message = (JSON.parse(claimed.body) as { messages: { message: { payload: string } }[] })
      .messages[0];
    expect(text(Buffer.from(message?.message.payload ?? "", "base64"))).toBe("secret");
  });
});
