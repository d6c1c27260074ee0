/**
 * The broker answers uncompressed even when the client accepts gzip (a
 * broker's CPU is worth more than the bytes between brokers and workers),
 * and still accepts gzip-compressed requests. Raw HTTP/2 gRPC, so the
 * envelope's compressed flag and the `grpc-encoding` header are seen as sent.
 */
import http2 from "node:http2";
import { gzipSync } from "node:zlib";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import {
  ClaimRequestSchema,
  ClaimResponseSchema,
  EnqueueRequestSchema,
  EnqueueResponseSchema,
} from "@casq/api/casq/v1/queue_service_pb.ts";
import { describe, expect, it } from "vitest";
import { useTestServers } from "./support.ts";

const server = useTestServers();

interface RawAnswer {
  readonly headers: http2.IncomingHttpHeaders;
  readonly trailers: http2.IncomingHttpHeaders;
  /** The first message's compressed flag and bytes (as sent). */
  readonly flag: number;
  readonly message: Uint8Array;
}

async function call(address: string, method: string, message: Uint8Array, gzip: boolean): Promise<RawAnswer> {
  const session = http2.connect(`http://${address}`);
  try {
    const body = gzip ? gzipSync(message) : message;
    const envelope = Buffer.alloc(5 + body.byteLength);
    envelope[0] = gzip ? 1 : 0;
    envelope.writeUInt32BE(body.byteLength, 1);
    envelope.set(body, 5);
    const stream = session.request({
      ":method": "POST",
      ":path": `/casq.v1.QueueService/${method}`,
      "content-type": "application/grpc",
      te: "trailers",
      "grpc-accept-encoding": "gzip",
      ...(gzip ? { "grpc-encoding": "gzip" } : {}),
    });
    stream.end(envelope);
    const chunks: Buffer[] = [];
    let headers: http2.IncomingHttpHeaders = {};
    let trailers: http2.IncomingHttpHeaders = {};
    stream.on("response", (h) => {
      headers = h;
    });
    stream.on("trailers", (t) => {
      trailers = t;
    });
    stream.on("data", (chunk: Buffer) => chunks.push(chunk));
    await new Promise<void>((resolve, reject) => {
      stream.on("end", () => resolve());
      stream.on("error", reject);
    });
    const data = Buffer.concat(chunks);
    const length = data.length >= 5 ? data.readUInt32BE(1) : 0;
    return { headers, trailers, flag: data[0] ?? -1, message: data.subarray(5, 5 + length) };
  } finally {
    session.close();
  }
}

describe("compression", () => {
  it("accepts a gzip request and answers uncompressed although the client accepts gzip", async () => {
    const s = await server();
    const payload = new Uint8Array(8 * 1024).fill(0x61); // compresses well: gzip would be chosen if allowed
    const enqueue = await call(
      s.address,
      "Enqueue",
      toBinary(EnqueueRequestSchema, create(EnqueueRequestSchema, { queue: "zip", messages: [{ payload }] })),
      true,
    );
    expect(enqueue.trailers["grpc-status"] ?? enqueue.headers["grpc-status"]).toBe("0");
    expect(fromBinary(EnqueueResponseSchema, enqueue.message).messages).toHaveLength(1);

    const claim = await call(
      s.address,
      "Claim",
      toBinary(ClaimRequestSchema, create(ClaimRequestSchema, { queue: "zip", workerId: "w" })),
      false,
    );
    expect(claim.trailers["grpc-status"] ?? claim.headers["grpc-status"]).toBe("0");
    // (connect still names gzip in grpc-encoding; each message's flag says whether it is compressed.)
    expect(claim.flag).toBe(0);
    const messages = fromBinary(ClaimResponseSchema, claim.message).messages;
    expect(Buffer.from(messages[0]?.message?.payload ?? []).equals(Buffer.from(payload))).toBe(true);
  });
});
