/**
 * Interop with a standard gRPC stack: a plain @grpc/grpc-js client that loads
 * the .proto files from proto/ with @grpc/proto-loader (no casq code, no
 * generated code) against a real `casq serve` process: unary Enqueue / Claim
 * / Ack, error status codes, and a bidirectional Work stream exchange (open,
 * jobs by credit, heartbeat, ack, half-close, status OK).
 */
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type CasqServerProcess, PROTO_DIR, startServer, tempDir } from "./support/processes.ts";

type Json = Record<string, unknown>;
type UnaryFn = (request: Json, callback: (error: grpc.ServiceError | null, response: Json) => void) => void;
type ServiceClient = grpc.Client & Record<string, UnaryFn>;
type ServiceClientConstructor = new (address: string, credentials: grpc.ChannelCredentials) => ServiceClient;

let server: CasqServerProcess;
let store: { path: string; remove: () => void };
let queueClient: ServiceClient;
let adminClient: ServiceClient;

function loadServices(): { QueueService: ServiceClientConstructor; AdminService: ServiceClientConstructor } {
  const definition = protoLoader.loadSync(["casq/v1/queue_service.proto", "casq/v1/admin_service.proto"], {
    includeDirs: [PROTO_DIR],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const root = grpc.loadPackageDefinition(definition) as unknown as {
    casq: { v1: { QueueService: ServiceClientConstructor; AdminService: ServiceClientConstructor } };
  };
  return root.casq.v1;
}

function unary(client: ServiceClient, method: string, request: Json): Promise<Json> {
  return new Promise((resolve, reject) => {
    const fn = client[method];
    if (fn === undefined) throw new Error(`no method ${method}`);
    fn.call(client, request, (error, response) => (error ? reject(error) : resolve(response)));
  });
}

beforeAll(async () => {
  store = tempDir("grpc-js");
  server = await startServer({ store: `file:${store.path}` });
  const { QueueService, AdminService } = loadServices();
  queueClient = new QueueService(server.address, grpc.credentials.createInsecure());
  adminClient = new AdminService(server.address, grpc.credentials.createInsecure());
});

afterAll(async () => {
  queueClient?.close();
  adminClient?.close();
  await server?.stop();
  store?.remove();
});

describe("a plain @grpc/grpc-js client", () => {
  it("creates a queue, enqueues, claims and acks", async () => {
    const created = await unary(adminClient, "CreateQueue", { queue: "interop", shard_count: 1 });
    expect(created.queue).toBe("interop");
    expect(created.shard_count).toBe(1);

    const enqueued = await unary(queueClient, "Enqueue", {
      queue: "interop",
      messages: [{ payload: Buffer.from("one") }, { payload: Buffer.from("two"), priority: 5 }],
    });
    const ids = (enqueued.messages as Json[]).map((m) => m.id);
    expect(ids).toHaveLength(2);

    const claimed = await unary(queueClient, "Claim", {
      queue: "interop",
      worker_id: "grpc-js",
      max_messages: 2,
    });
    const jobs = claimed.messages as {
      receipt: string;
      attempt: number;
      message: { id: string; payload: Buffer };
    }[];
    expect(jobs.map((j) => j.message.id)).toEqual([ids[1], ids[0]]); // higher priority first
    expect(jobs.map((j) => Buffer.from(j.message.payload).toString())).toEqual(["two", "one"]);
    expect(jobs.map((j) => j.attempt)).toEqual([1, 1]);

    const receipts = jobs.map((j) => j.receipt);
    const acked = await unary(queueClient, "Ack", { queue: "interop", receipts });
    expect(acked.results).toEqual(receipts.map((receipt) => ({ receipt, outcome: "ACK_OUTCOME_ACKED" })));
  });

  it("gets standard status codes for errors", async () => {
    const error = await unary(adminClient, "GetQueue", { queue: "missing-queue" }).catch(
      (e: grpc.ServiceError) => e,
    );
    expect((error as grpc.ServiceError).code).toBe(grpc.status.NOT_FOUND);
    const invalid = await unary(queueClient, "Enqueue", { queue: "Bad Name!", messages: [{}] }).catch(
      (e: grpc.ServiceError) => e,
    );
    expect((invalid as grpc.ServiceError).code).toBe(grpc.status.INVALID_ARGUMENT);
  });

  it("works jobs over the bidirectional Work stream", async () => {
    await unary(queueClient, "Enqueue", {
      queue: "interop",
      messages: [{ payload: Buffer.from("three") }, { payload: Buffer.from("four") }],
    });
    const workFn = (queueClient as unknown as { Work: () => grpc.ClientDuplexStream<Json, Json> }).Work;
    const call = workFn.call(queueClient);
    const events: Json[] = [];
    const waiters: (() => void)[] = [];
    call.on("data", (response: Json) => {
      events.push(response);
      for (const wake of waiters.splice(0)) wake();
    });
    const status = new Promise<grpc.StatusObject>((resolve) => call.on("status", resolve));
    call.on("error", () => {}); // the status event carries the outcome
    const next = async (event: string, timeoutMs = 15_000): Promise<Json> => {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const index = events.findIndex((e) => e.event === event);
        if (index >= 0) return events.splice(index, 1)[0] as Json;
        if (Date.now() > deadline)
          throw new Error(`no ${event} within ${timeoutMs} ms; got ${JSON.stringify(events)}`);
        await new Promise<void>((resolve) => {
          waiters.push(resolve);
          setTimeout(resolve, 100);
        });
      }
    };

    call.write({ request_id: 0, open: { queue: "interop", worker_id: "grpc-js-worker", credits: 2 } });
    const opened = (await next("opened")).opened as Json;
    expect(opened.queue).toBe("interop");
    expect(opened.subscription).toBe("default");
    expect(opened.heartbeat_interval).toBeTruthy();
    expect(opened.max_credits).toBe(10_000);

    const jobs = [(await next("job")).job, (await next("job")).job] as { receipt: string; message: Json }[];
    const payloads = jobs.map((j) => Buffer.from(j.message.payload as Buffer).toString()).sort();
    expect(payloads).toEqual(["four", "three"]);
    const receipts = jobs.map((j) => j.receipt);

    call.write({ request_id: 6, heartbeat: { receipts } });
    const heartbeated = await next("heartbeated");
    expect(heartbeated.request_id).toBe("6");
    expect((heartbeated.heartbeated as { results: Json[] }).results.map((r) => r.outcome)).toEqual([
      "HEARTBEAT_OUTCOME_EXTENDED",
      "HEARTBEAT_OUTCOME_EXTENDED",
    ]);

    call.write({ request_id: 7, ack: { receipts } });
    const acked = await next("acked");
    expect(acked.request_id).toBe("7");
    expect((acked.acked as { results: Json[] }).results.map((r) => r.outcome)).toEqual([
      "ACK_OUTCOME_ACKED",
      "ACK_OUTCOME_ACKED",
    ]);

    call.end(); // half-close: the broker answers what is open and ends the stream with OK
    const final = await status;
    expect(final.code).toBe(grpc.status.OK);

    const stats = await unary(adminClient, "GetQueue", { queue: "interop" });
    expect((stats.totals as Json).depth).toBe("0");
  });
});
