/**
 * The Work stream over real gRPC (HTTP/2 bidi) on loopback: open, credits,
 * jobs, replies by request id, leases lost, request failures that keep the
 * stream open, stream errors, half-close, and graceful shutdown.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs, durationMs } from "@bufbuild/protobuf/wkt";
import { AckOutcome, HeartbeatOutcome } from "@casq/api/casq/v1/message_pb.ts";
import type { WorkRequestSchema, WorkResponse } from "@casq/api/casq/v1/work_pb.ts";
import { AsyncQueue } from "@casq/sdk/async-queue.ts";
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { shardForKey } from "../../server/src/broker/shard-routing.ts";
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import type { CallOptions, ObjectStore, PutCondition } from "../../server/src/store/object-store.ts";
import {
  bytes,
  type Clients,
  eventually,
  grpcClients,
  startTestServer,
  text,
  useTestServers,
} from "./support.ts";

const server = useTestServers();

type Request = MessageInitShape<typeof WorkRequestSchema>;

/** A Work stream driven by a test: send requests, await responses one by one, see how it ended. */
class WorkClient {
  private readonly requests = new AsyncQueue<Request>();
  private readonly responses: WorkResponse[] = [];
  private waiters: (() => void)[] = [];
  ended: { error: ConnectError | undefined } | undefined;

  constructor(clients: Clients) {
    const stream = clients.queue.work(this.requests);
    (async () => {
      try {
        for await (const r of stream) {
          this.responses.push(r);
          this.wake();
        }
        this.ended = { error: undefined };
      } catch (error) {
        this.ended = { error: ConnectError.from(error) };
      }
      this.wake();
    })();
  }

  send(request: Request): void {
    this.requests.push(request);
  }

  halfClose(): void {
    this.requests.end();
  }

  /** The next response matching `pick` (responses are consumed in order; non-matching ones are skipped). */
  async next<C extends NonNullable<WorkResponse["event"]["case"]>>(
    kind: C,
    timeoutMs = 5_000,
  ): Promise<WorkResponse & { event: Extract<WorkResponse["event"], { case: C }> }> {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const index = this.responses.findIndex((r) => r.event.case === kind);
      if (index >= 0) {
        const [found] = this.responses.splice(index, 1);
        return found as WorkResponse & { event: Extract<WorkResponse["event"], { case: C }> };
      }
      if (this.ended) throw new Error(`stream ended (${this.ended.error?.message ?? "OK"}) before a ${kind}`);
      if (Date.now() > until) throw new Error(`no ${kind} within ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        this.waiters.push(resolve);
        setTimeout(resolve, 20);
      });
    }
  }

  /** Responses received and not consumed yet, of one kind. */
  pending(kind: WorkResponse["event"]["case"]): WorkResponse[] {
    return this.responses.filter((r) => r.event.case === kind);
  }

  async end(timeoutMs = 5_000): Promise<ConnectError | undefined> {
    await eventually(() => this.ended !== undefined, timeoutMs);
    return this.ended?.error;
  }

  private wake(): void {
    for (const w of this.waiters.splice(0)) w();
  }
}

function open(queue: string, credits: number): Request {
  return { requestId: 1n, command: { case: "open", value: { queue, workerId: "worker-1", credits } } };
}

describe("Work stream", () => {
  it("opens, delivers one job per credit, answers acks and heartbeats by request id", async () => {
    const s = await server();
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "jobs", shardCount: 2 });
    const work = new WorkClient(clients);
    work.send(open("jobs", 2));
    const opened = await work.next("opened");
    expect(opened.requestId).toBe(1n);
    expect(opened.event.value).toMatchObject({ queue: "jobs", subscription: "default", maxCredits: 10_000 });
    expect(durationMs(opened.event.value.leaseTtl ?? ({ seconds: 0n, nanos: 0 } as never))).toBe(60_000);
    expect(durationMs(opened.event.value.heartbeatInterval ?? ({ seconds: 0n, nanos: 0 } as never))).toBe(
      20_000,
    );
    expect(opened.event.value.routing?.servingShards).toEqual([0, 1]);
    expect(opened.event.value.routing?.shards.map((r) => r.leader?.address)).toEqual([
      s.advertisedAddress,
      s.advertisedAddress,
    ]);

    await clients.queue.enqueue({
      queue: "jobs",
      messages: [{ payload: bytes("a") }, { payload: bytes("b") }, { payload: bytes("c") }],
    });
    const first = await work.next("job");
    const second = await work.next("job");
    expect(first.requestId).toBe(0n);
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(work.pending("job")).toHaveLength(0); // no credit left

    work.send({ requestId: 7n, command: { case: "ack", value: { receipts: [first.event.value.receipt] } } });
    const acked = await work.next("acked");
    expect(acked.requestId).toBe(7n);
    expect(acked.event.value.results[0]).toMatchObject({
      receipt: first.event.value.receipt,
      outcome: AckOutcome.ACKED,
    });

    work.send({ requestId: 0n, command: { case: "credit", value: { credits: 1 } } });
    const third = await work.next("job");
    const payloads = [first, second, third].map((j) => text(j.event.value.message?.payload)).sort();
    expect(payloads).toEqual(["a", "b", "c"]);

    work.send({
      requestId: 8n,
      command: {
        case: "heartbeat",
        value: { receipts: [second.event.value.receipt, third.event.value.receipt] },
      },
    });
    const hb = await work.next("heartbeated");
    expect(hb.requestId).toBe(8n);
    expect(hb.event.value.results.map((r) => r.outcome)).toEqual([
      HeartbeatOutcome.EXTENDED,
      HeartbeatOutcome.EXTENDED,
    ]);
    expect(s.work.openStreams).toBe(1);
    expect(s.work.activeWorkers).toBe(1);

    // Half-close: outstanding requests answered, then OK.
    work.send({
      requestId: 9n,
      command: { case: "nack", value: { receipts: [second.event.value.receipt], delay: durationFromMs(0) } },
    });
    work.halfClose();
    await work.next("nacked");
    expect(await work.end()).toBeUndefined();
    await eventually(() => s.work.openStreams === 0);
  });

  it("lets a stream hold up to max_credits (10,000) of credit, past the queue's max_batch", async () => {
    // A slow store needs a window of thousands of jobs per stream (the bandwidth-delay product).
    const s = await server();
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "wide" });
    for (let i = 0; i < 3; i++)
      await clients.queue.enqueue({
        queue: "wide",
        messages: Array.from({ length: 1000 }, (_, j) => ({ payload: bytes(`${i}-${j}`) })),
      });
    const work = new WorkClient(clients);
    work.send(open("wide", 2500));
    expect((await work.next("opened")).event.value.maxCredits).toBe(10_000);
    for (let i = 0; i < 2500; i++) await work.next("job");
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(work.pending("job")).toHaveLength(0); // no credit left
    // A grant up to max_credits outstanding is accepted; the last 500 jobs come with it.
    work.send({ requestId: 0n, command: { case: "credit", value: { credits: 10_000 } } });
    for (let i = 0; i < 500; i++) await work.next("job");
    work.halfClose();
    expect(await work.end()).toBeUndefined();
  });

  it("waits with credit and sends a job as soon as one is enqueued", async () => {
    const s = await server();
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "later" });
    const work = new WorkClient(clients);
    work.send(open("later", 5));
    await work.next("opened");
    await new Promise((resolve) => setTimeout(resolve, 100));
    await clients.queue.enqueue({ queue: "later", messages: [{ payload: bytes("now") }] });
    const job = await work.next("job");
    expect(text(job.event.value.message?.payload)).toBe("now");
    work.halfClose();
    await work.end();
  });

  it("hands an enqueue to a waiting stream in the enqueue's own write (its claim rides in that commit)", async () => {
    const heads: unknown[] = [];
    const memory = new MemoryStore();
    const store: ObjectStore = Object.assign(Object.create(memory) as MemoryStore, {
      put: (key: string, body: Uint8Array, condition: PutCondition, options?: CallOptions) => {
        if (key === "queues/fused/0.json") heads.push(JSON.parse(new TextDecoder().decode(body)));
        return memory.put(key, body, condition, options);
      },
    });
    const s = await server({ store });
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "fused" });
    const work = new WorkClient(clients);
    work.send(open("fused", 5));
    await work.next("opened");
    await eventually(() => s.broker.leader("fused", 0).standingClaims > 0);
    const enqueued = await clients.queue.enqueue({ queue: "fused", messages: [{ payload: bytes("now") }] });
    const job = await work.next("job");
    expect(job.event.value.message?.id).toBe(enqueued.messages[0]?.id);
    type Head = {
      messages: { offset: number; id: string }[];
      subscriptions: { name: string; deliveries: { offset: number; lease?: { worker: string } }[] }[];
    };
    const first = (heads as Head[]).find((h) => h.messages.some((m) => m.id === job.event.value.message?.id));
    const offset = first?.messages.find((m) => m.id === job.event.value.message?.id)?.offset;
    const lease = first?.subscriptions
      .find((sub) => sub.name === "default")
      ?.deliveries.find((d) => d.offset === offset)?.lease;
    expect(lease?.worker).toBe("worker-1");
    work.halfClose();
    await work.end();
  });

  it("stands again after a standing claim was filled, without a claim of its own while nothing is runnable", async () => {
    // Each claim is a turn of the shard's commit loop: a stream that claimed after every job it
    // was handed (finding nothing) made the enqueues behind it wait, for nothing.
    const s = await server();
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "standing" });
    const work = new WorkClient(clients);
    work.send(open("standing", 5));
    await work.next("opened");
    const leader = s.broker.leader("standing", 0);
    await eventually(() => leader.standingClaims > 0);
    let commits = 0;
    const off = leader.onCommit(() => {
      commits += 1;
    });
    for (const payload of ["a", "b", "c"]) {
      await clients.queue.enqueue({ queue: "standing", messages: [{ payload: bytes(payload) }] });
      expect(text((await work.next("job")).event.value.message?.payload)).toBe(payload);
      await eventually(() => leader.standingClaims > 0);
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
    off();
    expect(commits).toBe(3); // the enqueues' own, each handing its job to the standing claim
    // With jobs runnable and no standing claim to take them (its credit ran out), credit still
    // claims them at once.
    await clients.queue.enqueue({
      queue: "standing",
      messages: ["d", "e", "f"].map((p) => ({ payload: bytes(p) })),
    });
    expect(text((await work.next("job")).event.value.message?.payload)).toBe("d");
    expect(text((await work.next("job")).event.value.message?.payload)).toBe("e");
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(work.pending("job")).toHaveLength(0);
    work.send({ requestId: 0n, command: { case: "credit", value: { credits: 1 } } });
    expect(text((await work.next("job")).event.value.message?.payload)).toBe("f");
    work.halfClose();
    expect(await work.end()).toBeUndefined();
  });

  it("with credit for one job at a time, takes the jobs of every shard as fast as credit comes", async () => {
    // A pass that stops when the credit runs out has not looked at the shards after it: the
    // stream must not take the shards it did serve for all it has (their emptiness for the
    // queue's) and stand on them alone until its next periodic pass, 5 s later.
    const s = await server();
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "spread", shardCount: 2 });
    const keyOn = (shard: number) => {
      for (let i = 0; ; i++) if (shardForKey(`k${i}`, 2) === shard) return `k${i}`;
    };
    const messages = [
      { key: keyOn(0), payload: bytes("a") },
      ...["b", "c", "d"].map((p) => ({ key: keyOn(1), payload: bytes(p) })),
    ];
    await clients.queue.enqueue({ queue: "spread", messages });
    const work = new WorkClient(clients);
    work.send(open("spread", 1));
    await work.next("opened");
    const got: string[] = [];
    for (let i = 0; i < messages.length; i++) {
      // Well short of the 5 s to the periodic pass a stream that stood on one shard would wait for.
      const job = await work.next("job", 3_500);
      got.push(text(job.event.value.message?.payload));
      work.send({
        requestId: BigInt(10 + i),
        command: { case: "ack", value: { receipts: [job.event.value.receipt] } },
      });
      work.send({ requestId: 0n, command: { case: "credit", value: { credits: 1 } } });
    }
    expect(got.sort()).toEqual(["a", "b", "c", "d"]);
    work.halfClose();
    expect(await work.end()).toBeUndefined();
  });

  it("reports a lease that expired (LeasesLost) and heartbeats of it as LOST", async () => {
    const s = await server();
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "slow" });
    const work = new WorkClient(clients);
    work.send({
      requestId: 1n,
      command: {
        case: "open",
        value: { queue: "slow", workerId: "w", credits: 1, leaseTtl: durationFromMs(200) },
      },
    });
    const opened = await work.next("opened");
    expect(durationMs(opened.event.value.leaseTtl ?? ({ seconds: 0n, nanos: 0 } as never))).toBe(200);
    await clients.queue.enqueue({ queue: "slow", messages: [{ payload: bytes("x") }] });
    const job = await work.next("job");
    const lost = await work.next("leasesLost", 15_000);
    expect(lost.event.value.receipts).toEqual([job.event.value.receipt]);
    expect(lost.event.value.reason).toMatch(/expired/);
    work.send({
      requestId: 3n,
      command: { case: "heartbeat", value: { receipts: [job.event.value.receipt] } },
    });
    const hb = await work.next("heartbeated");
    expect(hb.event.value.results[0]?.outcome).toBe(HeartbeatOutcome.LOST);
    work.halfClose();
    await work.end();
  });

  it("answers a failed request with request_failed and keeps the stream open", async () => {
    const s = await server();
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "oops" });
    const work = new WorkClient(clients);
    work.send(open("oops", 1));
    await work.next("opened");
    work.send({ requestId: 5n, command: { case: "ack", value: { receipts: ["not-a-receipt"] } } });
    const failed = await work.next("requestFailed");
    expect(failed.requestId).toBe(5n);
    expect(failed.event.value.status?.code).toBe(Code.InvalidArgument);
    expect(failed.event.value.status?.message).toMatch(/not a receipt/);
    await clients.queue.enqueue({ queue: "oops", messages: [{ payload: bytes("still open") }] });
    expect(text((await work.next("job")).event.value.message?.payload)).toBe("still open");
    work.halfClose();
    expect(await work.end()).toBeUndefined();
  });

  it("ends the stream with INVALID_ARGUMENT or NOT_FOUND for protocol errors", async () => {
    const s = await server();
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "strict" });

    const noOpen = new WorkClient(clients);
    noOpen.send({ requestId: 1n, command: { case: "credit", value: { credits: 1 } } });
    expect((await noOpen.end())?.code).toBe(Code.InvalidArgument);

    const tooMuch = new WorkClient(clients);
    tooMuch.send(open("strict", 10_000));
    await tooMuch.next("opened");
    tooMuch.send({ requestId: 0n, command: { case: "credit", value: { credits: 1 } } });
    const error = await tooMuch.end();
    expect(error?.code).toBe(Code.InvalidArgument);
    expect(error?.rawMessage).toMatch(/max_credits 10000/);

    const openedTooMuch = new WorkClient(clients);
    openedTooMuch.send(open("strict", 10_001));
    expect((await openedTooMuch.end())?.code).toBe(Code.InvalidArgument);

    const missing = new WorkClient(clients);
    missing.send(open("no-such-queue", 1));
    expect((await missing.end())?.code).toBe(Code.NotFound);

    const badSub = new WorkClient(clients);
    badSub.send({
      requestId: 1n,
      command: {
        case: "open",
        value: { queue: "strict", subscription: "nobody", workerId: "w", credits: 1 },
      },
    });
    expect((await badSub.end())?.code).toBe(Code.NotFound);

    const twice = new WorkClient(clients);
    twice.send(open("strict", 1));
    await twice.next("opened");
    twice.send(open("strict", 1));
    expect((await twice.end())?.code).toBe(Code.InvalidArgument);
  });

  it("sends draining and ends with UNAVAILABLE when the server shuts down gracefully", async () => {
    const s = await startTestServer();
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "bye" });
    await clients.queue.enqueue({ queue: "bye", messages: [{ payload: bytes("held") }] });
    const work = new WorkClient(clients);
    work.send(open("bye", 1));
    await work.next("opened");
    const job = await work.next("job");
    const closing = s.close({ graceful: true, timeoutMs: 4_000 });
    const draining = await work.next("draining");
    expect(durationMs(draining.event.value.grace ?? ({ seconds: 0n, nanos: 0 } as never))).toBeGreaterThan(0);
    // The worker finishes its job during the grace period; then the stream ends at once.
    work.send({ requestId: 2n, command: { case: "ack", value: { receipts: [job.event.value.receipt] } } });
    expect((await work.next("acked")).event.value.results[0]?.outcome).toBe(AckOutcome.ACKED);
    const error = await work.end();
    expect(error?.code).toBe(Code.Unavailable);
    expect(error?.rawMessage).toMatch(/broker shutting down/);
    await closing;
  });
});
