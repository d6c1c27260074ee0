/**
 * Graceful shutdown of a real `casq serve` process: SIGTERM while a worker's
 * Work stream is open (holding a job) must end that stream with UNAVAILABLE
 * (after a Draining notice), let the process exit 0, and release the shard
 * leases so that a second broker on the same store serves the queue at once
 * instead of redirecting to the dead one until its lease runs out. The held
 * job's lease survives the stream (receipts stay valid), so the new broker
 * accepts its ack.
 *
 * Also: `casq work` (the CLI worker) stops cleanly when its broker goes away
 * under it and it is then told to stop.
 */
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FileStore } from "../../server/src/store/file-store.ts";
import {
  type CasqServerProcess,
  casq,
  PROTO_DIR,
  spawnCasq,
  startServer,
  tempDir,
  waitFor,
} from "./support/processes.ts";

type Json = Record<string, unknown>;
type QueueClient = grpc.Client & {
  Work(): grpc.ClientDuplexStream<Json, Json>;
  Enqueue(request: Json, callback: (error: grpc.ServiceError | null, response: Json) => void): void;
  Ack(request: Json, callback: (error: grpc.ServiceError | null, response: Json) => void): void;
};
type QueueClientConstructor = new (address: string, credentials: grpc.ChannelCredentials) => QueueClient;

let store: { path: string; remove: () => void };
const servers: CasqServerProcess[] = [];
let QueueService: QueueClientConstructor;

beforeAll(() => {
  store = tempDir("shutdown");
  const definition = protoLoader.loadSync(["casq/v1/queue_service.proto"], {
    includeDirs: [PROTO_DIR],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const root = grpc.loadPackageDefinition(definition) as unknown as {
    casq: { v1: { QueueService: QueueClientConstructor } };
  };
  QueueService = root.casq.v1.QueueService;
});

afterAll(async () => {
  await Promise.all(servers.map((s) => s.stop("SIGKILL")));
  store?.remove();
});

async function start(): Promise<CasqServerProcess> {
  const server = await startServer({ store: `file:${store.path}`, args: ["--shutdown-timeout", "10s"] });
  servers.push(server);
  return server;
}

/** The broker record of shard 0 of `queue` as the store holds it (read through a file store of its own). */
async function storedBroker(queue: string): Promise<Json> {
  const reader = new FileStore({ root: store.path });
  try {
    const head = await reader.get(`queues/${queue}/0.json`);
    const document = JSON.parse(new TextDecoder().decode(head?.body)) as { broker: Json };
    return document.broker;
  } finally {
    await reader.close();
  }
}

function unary(
  method: (request: Json, callback: (e: grpc.ServiceError | null, r: Json) => void) => void,
  request: Json,
) {
  return new Promise<Json>((resolve, reject) =>
    method(request, (error, response) => (error ? reject(error) : resolve(response))),
  );
}

describe("graceful shutdown of casq serve", () => {
  it("ends open Work streams with UNAVAILABLE, exits 0, and a second broker takes over at once", async () => {
    const first = await start();
    const created = await casq([
      "queue",
      "create",
      "handover",
      "--lease-ttl",
      "60s",
      "--server",
      first.address,
    ]);
    expect(created.code, created.stderr).toBe(0);
    const enqueued = await casq(["enqueue", "handover", "held job", "--server", first.address]);
    expect(enqueued.code, enqueued.stderr).toBe(0);

    const client = new QueueService(first.address, grpc.credentials.createInsecure());
    const call = client.Work();
    const events: Json[] = [];
    call.on("data", (event: Json) => events.push(event));
    call.on("error", () => {});
    const status = new Promise<grpc.StatusObject>((resolve) => call.on("status", resolve));
    call.write({ request_id: 0, open: { queue: "handover", worker_id: "held-worker", credits: 1 } });
    await waitFor("the held job", () => events.some((e) => e.event === "job"), 15_000, 50);
    const job = events.find((e) => e.event === "job")?.job as { receipt: string };

    const exit = await first.stop("SIGTERM");
    expect(exit.code, first.output()).toBe(0);
    const final = await status;
    expect(final.code).toBe(grpc.status.UNAVAILABLE);
    expect(events.some((e) => e.event === "draining")).toBe(true);
    client.close();
    // The lease was handed back in the store: lease_until 0, so nobody has to wait for it to run out.
    expect(await storedBroker("handover")).toMatchObject({ lease_until: 0 });

    // A second broker on the same store: no redirect to the dead broker, no waiting for its lease to expire.
    const second = await start();
    const secondClient = new QueueService(second.address, grpc.credentials.createInsecure());
    const response = await unary(secondClient.Enqueue.bind(secondClient), {
      queue: "handover",
      messages: [{ payload: Buffer.from("after takeover") }],
    });
    expect((response.messages as Json[]).length).toBe(1);
    expect(await storedBroker("handover")).toMatchObject({ epoch: 2 });

    // The job held across the shutdown is still leased to its worker: the new broker accepts its ack.
    const acked = await unary(secondClient.Ack.bind(secondClient), {
      queue: "handover",
      receipts: [job.receipt],
    });
    expect((acked.results as Json[])[0]?.outcome).toBe("ACK_OUTCOME_ACKED");
    secondClient.close();

    const exitSecond = await second.stop("SIGTERM");
    expect(exitSecond.code).toBe(0);
  });

  it("lets `casq work` stop cleanly after its broker went away", async () => {
    const server = await start();
    const worker = spawnCasq([
      "work",
      "handover",
      "--server",
      server.address,
      "--",
      "sh",
      "-c",
      "cat > /dev/null",
    ]);
    await waitFor(
      "the worker to connect",
      () => worker.stderr().includes("working on handover/default"),
      30_000,
    );
    await waitFor(
      "the message enqueued after the takeover to be worked",
      async () => {
        const stats = await casq(["stats", "handover", "--json", "--server", server.address]);
        return (
          stats.code === 0 && (JSON.parse(stats.stdout) as { totals: { depth: number } }).totals.depth === 0
        );
      },
      30_000,
    );
    expect((await server.stop("SIGTERM")).code).toBe(0);
    await waitFor("the worker to notice", () => /reconnecting|shutting down/.test(worker.stderr()), 15_000);
    worker.child.kill("SIGTERM");
    const exit = await worker.exited;
    expect(exit.code, worker.stderr()).toBe(0);
    expect(worker.stderr()).toContain("stopped after 1 job(s): 1 acked");
  });
  it("exits at once on a second signal while a graceful shutdown is still draining", async () => {
    const server = await start();
    expect((await casq(["enqueue", "stubborn", "held", "--server", server.address])).code).toBe(0);
    const client = new QueueService(server.address, grpc.credentials.createInsecure());
    const call = client.Work();
    const events: Json[] = [];
    call.on("data", (event: Json) => events.push(event));
    call.on("error", () => {});
    call.write({ request_id: 0, open: { queue: "stubborn", worker_id: "stubborn-worker", credits: 1 } });
    await waitFor("the held job", () => events.some((e) => e.event === "job"), 15_000, 50);

    // The worker holds its job and never answers: the first SIGTERM starts a drain that waits for it.
    server.child.kill("SIGTERM");
    await waitFor("the draining notice", () => events.some((e) => e.event === "draining"), 15_000, 20);
    expect(server.child.exitCode).toBeNull();
    server.child.kill("SIGTERM");
    const exit = await server.exited;
    expect(exit.code, server.output()).toBe(143);
    expect(server.output()).toMatch(/again: exiting now/);
    client.close();
  });
});
