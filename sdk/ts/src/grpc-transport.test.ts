/**
 * The SDK's gRPC framing against a bare node:http2 server that writes each
 * answer exactly as a test says: messages split over many DATA frames or
 * packed into one, a compressed message, a body cut inside a message, two
 * messages for a unary call, an error in a trailers-only answer; and the
 * request's headers.
 */
import { once } from "node:events";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { promisify } from "node:util";
import { gzip } from "node:zlib";
import { create, toBinary } from "@bufbuild/protobuf";
import {
  Health,
  HealthCheckResponseSchema,
  HealthCheckResponse_ServingStatus as ServingStatus,
} from "@casq/api/grpc/health/v1/health_pb.ts";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { afterEach, describe, expect, it } from "vitest";
import { createGrpcTransport } from "./grpc-transport.ts";

type Answer = (stream: http2.ServerHttp2Stream, request: Buffer) => Promise<void> | void;

const servers: http2.Http2Server[] = [];
afterEach(async () => {
  for (const server of servers.splice(0)) {
    server.close();
    await once(server, "close").catch(() => {});
  }
});

/** A server answering every call with `answer` once the request body is in. */
async function serve(answer: Answer): Promise<string> {
  const server = http2.createServer();
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (session) => {
    sessions.add(session);
    session.on("close", () => sessions.delete(session));
  });
  server.on("stream", (stream) => {
    const chunks: Buffer[] = [];
    stream.on("data", (chunk: Buffer) => chunks.push(chunk));
    stream.on("end", () => void answer(stream, Buffer.concat(chunks)));
    stream.on("error", () => {});
  });
  const close = server.close.bind(server);
  server.close = (callback?: (err?: Error) => void) => {
    for (const session of sessions) session.destroy();
    return close(callback);
  };
  servers.push(server);
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

function envelope(data: Uint8Array, flags = 0): Buffer {
  const out = Buffer.alloc(5 + data.byteLength);
  out.writeUInt8(flags, 0);
  out.writeUInt32BE(data.byteLength, 1);
  out.set(data, 5);
  return out;
}

function status(value: ServingStatus): Uint8Array {
  return toBinary(HealthCheckResponseSchema, create(HealthCheckResponseSchema, { status: value }));
}

/** Writes `bytes` as separate DATA frames of at most `size` bytes, one per event-loop turn. */
async function writeInPieces(stream: http2.ServerHttp2Stream, bytes: Buffer, size: number): Promise<void> {
  for (let at = 0; at < bytes.length; at += size) {
    stream.write(bytes.subarray(at, at + size));
    await new Promise((resolve) => setImmediate(resolve));
  }
}

const OK_HEADERS = { ":status": 200, "content-type": "application/grpc+proto" };

function end(stream: http2.ServerHttp2Stream, code = 0): void {
  stream.once("wantTrailers", () => stream.sendTrailers({ "grpc-status": String(code) }));
  stream.end();
}

function client(baseUrl: string) {
  return createClient(Health, createGrpcTransport({ baseUrl }));
}

describe("the SDK's gRPC transport", () => {
  it("reads a unary answer split into one-byte DATA frames, and sends the request enveloped", async () => {
    let request: Buffer | undefined;
    const url = await serve(async (stream, body) => {
      request = body;
      stream.respond(OK_HEADERS, { waitForTrailers: true });
      await writeInPieces(stream, envelope(status(ServingStatus.SERVING)), 1);
      end(stream);
    });
    const answer = await client(url).check({ service: "casq.v1.QueueService" });
    expect(answer.status).toBe(ServingStatus.SERVING);
    expect(request?.readUInt8(0)).toBe(0);
    expect(request?.readUInt32BE(1)).toBe((request?.length ?? 0) - 5);
  });

  it("reads stream messages packed into one DATA frame and split across frames", async () => {
    const url = await serve(async (stream) => {
      stream.respond(OK_HEADERS, { waitForTrailers: true });
      const three = Buffer.concat([
        envelope(status(ServingStatus.SERVING)),
        envelope(status(ServingStatus.NOT_SERVING)),
        envelope(status(ServingStatus.SERVICE_UNKNOWN)),
      ]);
      stream.write(three);
      // The fourth arrives in pieces of 3 bytes, the first starting inside the prefix.
      await writeInPieces(stream, envelope(status(ServingStatus.SERVING)), 3);
      end(stream);
    });
    const seen: ServingStatus[] = [];
    for await (const m of client(url).watch({})) seen.push(m.status);
    expect(seen).toEqual([
      ServingStatus.SERVING,
      ServingStatus.NOT_SERVING,
      ServingStatus.SERVICE_UNKNOWN,
      ServingStatus.SERVING,
    ]);
  });

  it("decompresses a gzip message", async () => {
    const packed = await promisify(gzip)(status(ServingStatus.NOT_SERVING));
    const url = await serve((stream) => {
      stream.respond({ ...OK_HEADERS, "grpc-encoding": "gzip" }, { waitForTrailers: true });
      stream.write(envelope(packed, 1));
      end(stream);
    });
    expect((await client(url).check({})).status).toBe(ServingStatus.NOT_SERVING);
  });

  it("fails a body that ends inside a message, and a unary answer with two messages", async () => {
    const cut = await serve((stream) => {
      stream.respond(OK_HEADERS, { waitForTrailers: true });
      stream.write(envelope(status(ServingStatus.SERVING)).subarray(0, 4));
      end(stream);
    });
    await expect(client(cut).check({})).rejects.toMatchObject({
      code: Code.InvalidArgument,
      rawMessage: "protocol error: incomplete envelope",
    });
    const two = await serve((stream) => {
      stream.respond(OK_HEADERS, { waitForTrailers: true });
      stream.write(Buffer.concat([envelope(status(1)), envelope(status(2))]));
      end(stream);
    });
    await expect(client(two).check({})).rejects.toMatchObject({ code: Code.Unimplemented });
  });

  it("turns a trailers-only error into its code and message, with its metadata", async () => {
    const url = await serve((stream) => {
      stream.respond(
        {
          ...OK_HEADERS,
          "grpc-status": String(Code.FailedPrecondition),
          "grpc-message": "queue%20paused",
          "x-casq-why": "test",
        },
        { endStream: true },
      );
    });
    const error = await client(url)
      .check({})
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(error).toBeInstanceOf(ConnectError);
    expect(error).toMatchObject({ code: Code.FailedPrecondition, rawMessage: "queue paused" });
    expect((error as ConnectError).metadata.get("x-casq-why")).toBe("test");
  });

  it("sends the grpc-timeout of a call's timeout and the accepted encodings", async () => {
    let headers: http2.IncomingHttpHeaders | undefined;
    const url = await serve((stream) => {
      stream.respond(OK_HEADERS, { waitForTrailers: true });
      stream.write(envelope(status(ServingStatus.SERVING)));
      end(stream);
    });
    const server = servers[servers.length - 1] as http2.Http2Server;
    server.prependListener("stream", (_stream, h) => {
      headers = h;
    });
    await client(url).check({}, { timeoutMs: 5_000 });
    expect(headers?.["content-type"]).toBe("application/grpc+proto");
    expect(headers?.te).toBe("trailers");
    expect(headers?.["grpc-timeout"]).toMatch(/^\d+m$/);
    expect(headers?.["grpc-accept-encoding"]).toBe("gzip,br");
  });
});
