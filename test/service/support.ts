/**
 * Helpers for the service tests: in-process casq servers on loopback ports
 * (memory or shared stores), and real clients over HTTP/2 (gRPC) and
 * HTTP/1.1 (Connect JSON) from @connectrpc/connect-node.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { AdminService } from "@casq/api/casq/v1/admin_service_pb.ts";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import type { WorkOpenSchema, WorkRequestSchema, WorkResponse } from "@casq/api/casq/v1/work_pb.ts";
import { AsyncQueue } from "@casq/sdk/async-queue.ts";
import {
  type Client,
  Code,
  ConnectError,
  createClient,
  type Interceptor,
  type Transport,
} from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { pino } from "pino";
import { afterEach } from "vitest";
import {
  type CasqServerOptions,
  type RunningCasqServer,
  startCasqServer,
} from "../../server/src/service/casq-server.ts";
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import type { ObjectStore } from "../../server/src/store/object-store.ts";

/** A silent logger (set CASQ_TEST_LOG=debug to see the server's lines). */
export const quietLogger = pino({ level: process.env.CASQ_TEST_LOG ?? "silent" });

/** A store whose close() does nothing, so several servers (and restarts) can share it. */
export function sharedStore(inner: ObjectStore = new MemoryStore()): ObjectStore {
  return {
    description: inner.description,
    get: (key, options) => inner.get(key, options),
    put: (key, body, condition, options) => inner.put(key, body, condition, options),
    delete: (key, options) => inner.delete(key, options),
    list: (prefix, options) => inner.list(prefix, options),
    close: async () => {},
  };
}

/**
 * A memory store whose writes of shard heads (of `queues` only, when given)
 * wait while the gate is shut (a write that is slow or stuck); `waiting`
 * counts the writes held. Several gates may share one `inner` store.
 */
export function gatedStore(
  queues?: readonly string[],
  inner: ObjectStore = new MemoryStore(),
): { store: ObjectStore; shut(): void; open(): void; readonly waiting: number } {
  let gate: Promise<void> | undefined;
  let release = () => {};
  let waiting = 0;
  const base = sharedStore(inner);
  return {
    get waiting() {
      return waiting;
    },
    shut: () => {
      gate = new Promise((resolve) => {
        release = resolve;
      });
    },
    open: () => {
      gate = undefined;
      release();
    },
    store: {
      ...base,
      async put(key, body, condition, options) {
        const head = /^queues\/([^/]+)\/\d+\.json$/.exec(key);
        if (gate !== undefined && head && (queues === undefined || queues.includes(head[1] as string))) {
          waiting += 1;
          await gate;
          waiting -= 1;
        }
        return inner.put(key, body, condition, options);
      },
    },
  };
}

/** Starts a server on 127.0.0.1:0 with a fresh memory store unless told otherwise. */
export function startTestServer(options: Partial<CasqServerOptions> = {}): Promise<RunningCasqServer> {
  return startCasqServer({
    store: new MemoryStore(),
    listen: "127.0.0.1:0",
    logger: quietLogger,
    healthProbeIntervalMs: 200,
    ...options,
  });
}

/**
 * Registers an `afterEach` that closes every server the returned function
 * started during the test; call it once at the top of a test file.
 */
export function useTestServers(): (options?: Partial<CasqServerOptions>) => Promise<RunningCasqServer> {
  const servers: RunningCasqServer[] = [];
  afterEach(async () => {
    await Promise.all(servers.splice(0).map((s) => s.close({ graceful: false })));
  });
  return async (options = {}) => {
    const s = await startTestServer(options);
    servers.push(s);
    return s;
  };
}

/** The name of the gRPC code a call ends with (`"OK"` when it succeeds). */
export async function codeOf(call: Promise<unknown>): Promise<string> {
  try {
    await call;
    return "OK";
  } catch (error) {
    return Code[ConnectError.from(error).code];
  }
}

/** Clients of both services over one transport. */
export interface Clients {
  readonly queue: Client<typeof QueueService>;
  readonly admin: Client<typeof AdminService>;
  readonly transport: Transport;
}

/** gRPC over HTTP/2 (h2c) to `address`. */
export function grpcClients(address: string, interceptors: Interceptor[] = []): Clients {
  const transport = createGrpcTransport({ baseUrl: `http://${address}`, interceptors });
  return {
    queue: createClient(QueueService, transport),
    admin: createClient(AdminService, transport),
    transport,
  };
}

/** The Connect protocol with JSON over HTTP/1.1 to `address` (what curl speaks). */
export function connectJsonClients(address: string, interceptors: Interceptor[] = []): Clients {
  const transport = createConnectTransport({
    baseUrl: `http://${address}`,
    httpVersion: "1.1",
    useBinaryFormat: false,
    interceptors,
  });
  return {
    queue: createClient(QueueService, transport),
    admin: createClient(AdminService, transport),
    transport,
  };
}

/** An interceptor that adds `authorization: Bearer <token>`. */
export function bearer(token: string): Interceptor {
  return (next) => (req) => {
    req.header.set("authorization", `Bearer ${token}`);
    return next(req);
  };
}

/** UTF-8 bytes of a string. */
export function bytes(text: string): Uint8Array {
  return new TextEncoder().encode(text);
}

/** Text of UTF-8 bytes. */
export function text(data: Uint8Array | undefined): string {
  return new TextDecoder().decode(data);
}

/** Waits until `check` returns true (polling), or fails after `timeoutMs`. */
export async function eventually(check: () => boolean | Promise<boolean>, timeoutMs = 5_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return;
    if (Date.now() > until) throw new Error("condition not met in time");
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/**
 * Opens a Work stream with `open` (worker "worker-1" unless it says) and
 * waits for `opened`; the responses gather in `responses`, `requests` takes
 * what to send next, `reading` settles when the stream ends.
 */
export async function openWork(clients: Clients, open: MessageInitShape<typeof WorkOpenSchema>) {
  const requests = new AsyncQueue<MessageInitShape<typeof WorkRequestSchema>>();
  const responses: WorkResponse[] = [];
  const stream = clients.queue.work(requests);
  const reading = (async () => {
    for await (const r of stream) responses.push(r);
  })().catch(() => {});
  requests.push({ requestId: 1n, command: { case: "open", value: { workerId: "worker-1", ...open } } });
  await eventually(() => responses.some((r) => r.event.case === "opened"));
  return { requests, responses, reading };
}
