import * as grpc from "@grpc/grpc-js";
import { afterEach, describe, expect, it } from "vitest";
import { batchStreamWrites } from "./grpc-js-batched-writes.ts";

const PATH = "/test.Burst/Send";
const identity = (bytes: Buffer): Buffer => bytes;

/** The message `i` of a burst: its index in 4 bytes, then `size - 4` filler bytes. */
function message(i: number, size = 64): Buffer {
  const bytes = Buffer.alloc(size, 97);
  bytes.writeUInt32BE(i, 0);
  return bytes;
}

interface Burst {
  /** How many messages to write in one go. */
  readonly count: number;
  /** Size of each message (default 64 bytes). */
  readonly size?: (i: number) => number;
}

interface Served {
  readonly address: string;
  /** What `batchStreamWrites` answered, per call. */
  readonly batched: boolean[];
  /** HTTP/2 writes of each call's messages. */
  readonly http2Writes: number[];
}

let servers: grpc.Server[] = [];
let clients: grpc.Client[] = [];

afterEach(() => {
  for (const client of clients) client.close();
  for (const server of servers) server.forceShutdown();
  servers = [];
  clients = [];
});

/**
 * A grpc-js server whose one server-streaming method writes a burst of
 * messages synchronously (as the Work stream does after a commit), then ends.
 */
async function serve(options: grpc.ServerOptions = {}): Promise<Served> {
  const server = new grpc.Server(options);
  servers.push(server);
  const batched: boolean[] = [];
  const http2Writes: number[] = [];
  const handler: grpc.handleServerStreamingCall<Buffer, Buffer> = (call) => {
    const burst = JSON.parse(call.request.toString()) as { count: number; big?: number };
    const index = http2Writes.push(0) - 1;
    batched.push(batchStreamWrites(call));
    // Count what goes to the HTTP/2 stream (the object under the call that the batching writes to).
    const stream = (call as unknown as { call?: { stream?: { write: (...args: unknown[]) => boolean } } })
      .call?.stream;
    if (stream) {
      const write = stream.write.bind(stream);
      stream.write = (...args: unknown[]) => {
        http2Writes[index] = (http2Writes[index] ?? 0) + 1;
        return write(...args);
      };
    }
    for (let i = 0; i < burst.count; i++) call.write(message(i, i === burst.big ? 4096 : 64));
    call.end();
  };
  server.register(PATH, handler as grpc.UntypedHandleCall, identity, identity, "serverStream");
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (error, p) =>
      error ? reject(error) : resolve(p),
    ),
  );
  return { address: `127.0.0.1:${port}`, batched, http2Writes };
}

/** Calls the burst method; resolves with the indexes of the messages received and the call's status. */
function call(
  address: string,
  burst: Burst & { big?: number },
): Promise<{ received: number[]; status: grpc.StatusObject }> {
  const client = new grpc.Client(address, grpc.credentials.createInsecure());
  clients.push(client);
  return new Promise((resolve) => {
    const received: number[] = [];
    const stream = client.makeServerStreamRequest(
      PATH,
      identity,
      identity,
      Buffer.from(JSON.stringify({ count: burst.count, big: burst.big })),
    );
    stream.on("data", (bytes: Buffer) => received.push(bytes.readUInt32BE(0)));
    stream.on("error", () => {});
    stream.on("status", (status: grpc.StatusObject) => resolve({ received, status }));
  });
}

describe("batched stream writes", () => {
  it("applies to a grpc-js call without server interceptors (the pinned grpc-js's shape)", async () => {
    const server = await serve();
    const { status } = await call(server.address, { count: 1 });
    expect(status.code).toBe(grpc.status.OK);
    expect(server.batched).toEqual([true]);
  });

  it("sends a burst in order and whole, in fewer HTTP/2 writes than messages, then the status", async () => {
    const server = await serve();
    const count = 200;
    const { received, status } = await call(server.address, { count });
    expect(status.code).toBe(grpc.status.OK);
    expect(received).toEqual(Array.from({ length: count }, (_, i) => i));
    // grpc-js alone makes one HTTP/2 write per message.
    expect(server.http2Writes[0]).toBeGreaterThan(0);
    expect(server.http2Writes[0]).toBeLessThan(count / 4);
  });

  it("refuses a burst holding a message over the send limit with RESOURCE_EXHAUSTED, as grpc-js does", async () => {
    const server = await serve({ "grpc.max_send_message_length": 1024 });
    // Message 0 goes alone through grpc-js's path; the big one is in the batch behind it.
    const { received, status } = await call(server.address, { count: 10, big: 5 });
    expect(status.code).toBe(grpc.status.RESOURCE_EXHAUSTED);
    expect(received).not.toContain(5);
    expect(received).toEqual(received.slice().sort((a, b) => a - b));
  });

  it("leaves a call behind a grpc-js server interceptor on grpc-js's own path", async () => {
    const passThrough: grpc.ServerInterceptor = (_method, call) => new grpc.ServerInterceptingCall(call);
    const server = await serve({ interceptors: [passThrough] });
    const count = 50;
    const { received, status } = await call(server.address, { count });
    expect(status.code).toBe(grpc.status.OK);
    expect(server.batched).toEqual([false]);
    expect(received).toEqual(Array.from({ length: count }, (_, i) => i));
  });
});
