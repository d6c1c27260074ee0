/**
 * A request body that is not a valid message is the client's fault: every
 * protocol on the port (gRPC, gRPC-Web, Connect binary and JSON; unary and
 * streaming RPCs) answers INVALID_ARGUMENT, and the server logs at most a
 * rate-limited warning, never an error with a stack trace (issue 10, item 5).
 */
import http2 from "node:http2";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { bytes, grpcClients, useTestServers } from "./support.ts";

const server = useTestServers();

/** Bytes that are no protobuf message: field 536870911 with wire type 7. */
const GARBAGE = Buffer.from([0xff, 0xff, 0xff, 0xff, 0x0f]);

function envelope(body: Buffer, flags = 0): Buffer {
  const out = Buffer.alloc(5 + body.length);
  out[0] = flags;
  out.writeUInt32BE(body.length, 1);
  body.copy(out, 5);
  return out;
}

/** A gRPC call over raw HTTP/2 with `body` as its one request message; resolves with the response headers and trailers. */
function rawGrpc(address: string, path: string, body: Buffer): Promise<Record<string, unknown>> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(`http://${address}`);
    session.on("error", reject);
    const req = session.request({
      ":method": "POST",
      ":path": path,
      "content-type": "application/grpc",
      te: "trailers",
    });
    const out: Record<string, unknown> = {};
    req.on("response", (headers) => Object.assign(out, headers));
    req.on("trailers", (trailers) => Object.assign(out, trailers));
    req.on("data", () => {});
    req.on("end", () => {
      session.close();
      resolve(out);
    });
    req.on("error", reject);
    req.end(envelope(body));
  });
}

/** The grpc-status inside a gRPC-Web response body (its trailer frame). */
function grpcWebStatus(body: Buffer): string | undefined {
  for (let at = 0; at + 5 <= body.length; ) {
    const length = body.readUInt32BE(at + 1);
    if ((body[at] ?? 0) & 0x80) {
      const text = body.subarray(at + 5, at + 5 + length).toString("utf8");
      return /grpc-status:\s*(\d+)/i.exec(text)?.[1];
    }
    at += 5 + length;
  }
  return undefined;
}

function captureLogs() {
  const lines: { level: number; msg: string }[] = [];
  const logger = pino({ level: "debug" }, { write: (line: string) => lines.push(JSON.parse(line)) });
  return { logger, lines };
}

describe("a request body that is not a valid message", () => {
  it("is INVALID_ARGUMENT over gRPC for unary, server-streaming and bidi RPCs", async () => {
    const { logger, lines } = captureLogs();
    const s = await server({ logger });
    for (const path of [
      "/casq.v1.QueueService/Enqueue",
      "/casq.v1.QueueService/Ack",
      "/casq.v1.AdminService/CreateQueue",
      "/casq.v1.AdminService/GetDocument",
      "/casq.v1.QueueService/Work",
    ]) {
      const answer = await rawGrpc(s.address, path, GARBAGE);
      expect(answer["grpc-status"], `${path}: ${answer["grpc-message"]}`).toBe("3");
      expect(decodeURIComponent(String(answer["grpc-message"]))).toMatch(/not a valid/);
    }
    // Many more: still answered, logged as a few warnings at most, never as errors.
    for (let i = 0; i < 30; i++)
      expect((await rawGrpc(s.address, "/casq.v1.QueueService/Enqueue", GARBAGE))["grpc-status"]).toBe("3");
    expect(lines.filter((l) => l.level >= 50)).toEqual([]);
    const warnings = lines.filter((l) => l.level === 40);
    expect(warnings.length).toBeGreaterThan(0);
    expect(warnings.length).toBeLessThan(5);
    // The server still works.
    const { queue } = grpcClients(s.address);
    await queue.enqueue({ queue: "q", messages: [{ payload: bytes("fine") }] });
  });

  it("is INVALID_ARGUMENT over gRPC-Web and the Connect protocol (binary and JSON)", async () => {
    const { logger, lines } = captureLogs();
    const s = await server({ logger });
    const url = (path: string) => `http://${s.address}${path}`;

    const web = await fetch(url("/casq.v1.QueueService/Enqueue"), {
      method: "POST",
      headers: { "content-type": "application/grpc-web+proto" },
      body: envelope(GARBAGE),
    });
    expect(grpcWebStatus(Buffer.from(await web.arrayBuffer()))).toBe("3");

    const connectCases: [string, string, Uint8Array | string][] = [
      ["/casq.v1.QueueService/Enqueue", "application/proto", GARBAGE],
      ["/casq.v1.AdminService/ListQueues", "application/proto", GARBAGE],
      ["/casq.v1.QueueService/Enqueue", "application/json", "{not json"],
      ["/casq.v1.QueueService/Enqueue", "application/json", '{"queue": 5}'],
      ["/casq.v1.QueueService/Enqueue", "application/json", '{"messages": [{"priority": "high"}]}'],
    ];
    for (const [path, type, body] of connectCases) {
      const res = await fetch(url(path), { method: "POST", headers: { "content-type": type }, body });
      const answer = (await res.json()) as { code: string; message: string };
      expect(answer.code, `${path} ${type} ${String(body)}: ${answer.message}`).toBe("invalid_argument");
      expect(res.status).toBe(400);
    }

    // Connect streaming (GetDocument; bidi Work needs HTTP/2) with a garbage message.
    const stream = await fetch(url("/casq.v1.AdminService/GetDocument"), {
      method: "POST",
      headers: { "content-type": "application/connect+proto" },
      body: envelope(GARBAGE),
    });
    const frames = Buffer.from(await stream.arrayBuffer());
    const end = frames.subarray(5).toString("utf8");
    expect(JSON.parse(end).error.code).toBe("invalid_argument");
    expect(lines.filter((l) => l.level >= 50)).toEqual([]);
  });
});
