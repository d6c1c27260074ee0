/**
 * The EnqueueStream over real gRPC (HTTP/2 bidi) on loopback: answers by
 * request id, failed requests that keep the stream open, stream errors, a
 * request's own timeout, half-close, graceful shutdown, and the per-request
 * metrics and spans.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { anyUnpack, durationFromMs } from "@bufbuild/protobuf/wkt";
import { LeaderRedirectSchema } from "@casq/api/casq/v1/errors_pb.ts";
import { TraceContextSchema } from "@casq/api/casq/v1/message_pb.ts";
import type {
  EnqueueStreamRequestSchema,
  EnqueueStreamResponse,
} from "@casq/api/casq/v1/queue_service_pb.ts";
import { AsyncQueue } from "@casq/sdk/async-queue.ts";
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { MAX_REQUESTS_IN_FLIGHT } from "../../server/src/service/enqueue-stream.ts";
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import { inMemoryTracing } from "../../server/testing/trace-testing.ts";
import { parseExposition, sampleValue } from "../telemetry/exposition.ts";
import {
  bytes,
  type Clients,
  eventually,
  gatedStore,
  grpcClients,
  sharedStore,
  text,
  useTestServers,
} from "./support.ts";

const server = useTestServers();

type Request = MessageInitShape<typeof EnqueueStreamRequestSchema>;

/** An EnqueueStream driven by a test: send requests, await answers by request id, see how it ended. */
class EnqueueClient {
  private readonly requests = new AsyncQueue<Request>();
  readonly answers = new Map<bigint, EnqueueStreamResponse>();
  ended: { error: ConnectError | undefined } | undefined;

  constructor(clients: Clients) {
    const stream = clients.queue.enqueueStream(this.requests);
    (async () => {
      try {
        for await (const answer of stream) this.answers.set(answer.requestId, answer);
        this.ended = { error: undefined };
      } catch (error) {
        this.ended = { error: ConnectError.from(error) };
      }
    })();
  }

  send(request: Request): void {
    this.requests.push(request);
  }

  halfClose(): void {
    this.requests.end();
  }

  async answer(requestId: bigint): Promise<EnqueueStreamResponse> {
    await eventually(() => this.answers.has(requestId) || this.ended !== undefined);
    const answer = this.answers.get(requestId);
    if (answer === undefined) throw new Error(`stream ended (${this.ended?.error?.message ?? "OK"}) first`);
    return answer;
  }

  async end(): Promise<ConnectError | undefined> {
    await eventually(() => this.ended !== undefined);
    return this.ended?.error;
  }
}

function enqueue(requestId: bigint, queue: string, ...payloads: string[]): Request {
  return { requestId, enqueue: { queue, messages: payloads.map((p) => ({ payload: bytes(p) })) } };
}

/** A server whose head writes are held (the gate shut), with queue "mail" and a stream to it. */
async function stuckServer() {
  const gated = gatedStore();
  const s = await server({ store: gated.store });
  const clients = grpcClients(s.address);
  await clients.admin.createQueue({ queue: "mail" });
  gated.shut();
  return { gated, s, clients, stream: new EnqueueClient(clients) };
}

describe("EnqueueStream", () => {
  it("answers each request by its id once durable, with what Enqueue answers", async () => {
    const s = await server();
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "mail" });
    const stream = new EnqueueClient(clients);
    for (let i = 1n; i <= 20n; i++) stream.send(enqueue(i * 7n, "mail", `m${i}-a`, `m${i}-b`));
    const answers = await Promise.all(
      Array.from({ length: 20 }, (_, i) => stream.answer(BigInt(i + 1) * 7n)),
    );
    const offsets = answers.flatMap((a) => {
      expect(a.result.case).toBe("enqueued");
      const value = a.result.value as { messages: { offset: bigint; id: string; duplicate: boolean }[] };
      expect(value.messages).toHaveLength(2);
      return value.messages.map((m) => m.offset);
    });
    expect(new Set(offsets).size).toBe(40);

    // Stored as the unary call stores them: all 40 are claimable.
    const claimed = await clients.queue.claim({ queue: "mail", workerId: "w", maxMessages: 100 });
    expect(claimed.messages.map((m) => text(m.message?.payload)).sort()).toEqual(
      Array.from({ length: 20 }, (_, i) => [`m${i + 1}-a`, `m${i + 1}-b`])
        .flat()
        .sort(),
    );

    // Half-close: the stream ends with OK.
    stream.halfClose();
    expect(await stream.end()).toBeUndefined();
    await eventually(() => s.enqueueStreams.openStreams === 0);
  });

  it("answers a failed request with the unary call's status and goes on", async () => {
    const s = await server({ autoCreateQueues: false });
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "mail" });
    const stream = new EnqueueClient(clients);
    stream.send(enqueue(1n, "Bad Name", "x"));
    stream.send(enqueue(2n, "missing", "x"));
    stream.send({ requestId: 3n });
    stream.send({ requestId: 4n, enqueue: { queue: "mail", messages: [] } });
    stream.send(enqueue(5n, "mail", "fine"));
    const status = async (id: bigint) => {
      const answer = await stream.answer(id);
      expect(answer.result.case).toBe("error");
      return answer.result.value as { code: number; message: string };
    };
    expect((await status(1n)).code).toBe(Code.InvalidArgument);
    expect((await status(2n)).code).toBe(Code.NotFound);
    expect(await status(3n)).toMatchObject({
      code: Code.InvalidArgument,
      message: expect.stringMatching(/enqueue/),
    });
    expect((await status(4n)).code).toBe(Code.InvalidArgument);
    expect((await stream.answer(5n)).result.case).toBe("enqueued");
    // Nothing of the failed requests was stored; the good one was.
    const claimed = await clients.queue.claim({ queue: "mail", workerId: "w", maxMessages: 10 });
    expect(claimed.messages.map((m) => text(m.message?.payload))).toEqual(["fine"]);
    expect(stream.ended).toBeUndefined();
  });

  it("answers a request for a shard led elsewhere with the LeaderRedirect detail", async () => {
    const store = new MemoryStore();
    const leader = await server({ store: sharedStore(store) });
    const other = await server({ store: sharedStore(store) });
    const clients = grpcClients(leader.address);
    await clients.admin.createQueue({ queue: "mail" });
    await clients.queue.enqueue({ queue: "mail", messages: [{ payload: bytes("lead") }] });
    const stream = new EnqueueClient(grpcClients(other.address));
    stream.send(enqueue(1n, "mail", "x"));
    const answer = await stream.answer(1n);
    expect(answer.result.case).toBe("error");
    const failed = answer.result.value as { code: number; details: Parameters<typeof anyUnpack>[0][] };
    expect(failed.code).toBe(Code.Unavailable);
    const redirect = failed.details.map((d) => anyUnpack(d, LeaderRedirectSchema)).find((r) => r);
    expect(redirect?.leaderAddress).toBe(leader.address);
  });

  it("ends the stream with INVALID_ARGUMENT for a request_id of 0 or one already in flight", async () => {
    const s = await server();
    const clients = grpcClients(s.address);
    const zero = new EnqueueClient(clients);
    zero.send(enqueue(0n, "mail", "x"));
    const error = await zero.end();
    expect(error?.code).toBe(Code.InvalidArgument);
    expect(error?.rawMessage).toMatch(/request_id/);

    const gated = gatedStore();
    const slow = await server({ store: gated.store });
    const slowClients = grpcClients(slow.address);
    await slowClients.admin.createQueue({ queue: "mail" });
    gated.shut();
    const twice = new EnqueueClient(slowClients);
    twice.send(enqueue(9n, "mail", "first"));
    twice.send(enqueue(9n, "mail", "second"));
    const twiceError = await twice.end();
    gated.open();
    expect(twiceError?.code).toBe(Code.InvalidArgument);
    expect(twiceError?.rawMessage).toMatch(/already in flight/);
  });

  it("fails a request DEADLINE_EXCEEDED once its own timeout passed, and the stream goes on", async () => {
    const { gated, stream } = await stuckServer();
    stream.send({ ...enqueue(1n, "mail", "late"), timeout: durationFromMs(100) });
    const answer = await stream.answer(1n);
    expect(answer.result.case).toBe("error");
    expect((answer.result.value as { code: number }).code).toBe(Code.DeadlineExceeded);
    gated.open();
    stream.send({ ...enqueue(2n, "mail", "on time"), timeout: durationFromMs(5_000) });
    expect((await stream.answer(2n)).result.case).toBe("enqueued");
  });

  it("holds at most 1000 requests of a stream and reads the rest as answers go out", async () => {
    const { gated, stream } = await stuckServer();
    const count = MAX_REQUESTS_IN_FLIGHT + 50;
    for (let i = 1; i <= count; i++) stream.send(enqueue(BigInt(i), "mail", `m${i}`));
    await eventually(() => gated.waiting > 0);
    gated.open();
    await eventually(() => stream.answers.size === count, 20_000);
    expect([...stream.answers.values()].every((a) => a.result.case === "enqueued")).toBe(true);
    expect(stream.ended).toBeUndefined();
  });

  it("on graceful shutdown answers what it holds, refuses new requests as not applied, then ends UNAVAILABLE", async () => {
    const gated = gatedStore();
    const s = await server({ store: gated.store });
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "mail" });
    const stream = new EnqueueClient(clients);
    stream.send(enqueue(1n, "mail", "before"));
    expect((await stream.answer(1n)).result.case).toBe("enqueued");
    gated.shut();
    stream.send(enqueue(2n, "mail", "held"));
    await eventually(() => gated.waiting > 0);
    const closing = s.close({ graceful: true, timeoutMs: 4_000 });
    await eventually(() => s.enqueueStreams.draining);
    stream.send(enqueue(3n, "mail", "too late"));
    const refused = await stream.answer(3n);
    expect(refused.result.case).toBe("error");
    expect(refused.result.value).toMatchObject({
      code: Code.Unavailable,
      message: expect.stringMatching(/not applied/),
    });
    expect(stream.answers.has(2n)).toBe(false);
    gated.open();
    expect((await stream.answer(2n)).result.case).toBe("enqueued");
    const error = await stream.end();
    expect(error?.code).toBe(Code.Unavailable);
    expect(error?.rawMessage).toMatch(/broker shutting down/);
    // Every request it read was answered: what a client still waits for never reached it.
    expect(error?.metadata.get("casq-not-applied")).toBe("true");
    await closing;
  });

  it("counts and times each request as method EnqueueStream, and traces each in a span of its own", async () => {
    const { provider, exporter } = inMemoryTracing();
    const s = await server({ metricsListen: "127.0.0.1:0", tracing: { tracerProvider: provider } });
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "mail" });
    const stream = new EnqueueClient(clients);
    const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
    stream.send({
      ...enqueue(1n, "mail", "traced"),
      traceContext: create(TraceContextSchema, { traceparent: `00-${traceId}-00f067aa0ba902b7-01` }),
    });
    stream.send(enqueue(2n, "Bad Name", "x"));
    await stream.answer(1n);
    await stream.answer(2n);

    const res = await fetch(`http://${s.metricsAddress}/metrics`);
    const metrics = parseExposition(await res.text());
    expect(sampleValue(metrics, "casq_rpc_requests_total", { method: "EnqueueStream", code: "ok" })).toBe(1);
    expect(
      sampleValue(metrics, "casq_rpc_requests_total", { method: "EnqueueStream", code: "invalid_argument" }),
    ).toBe(1);
    expect(sampleValue(metrics, "casq_rpc_duration_seconds_count", { method: "EnqueueStream" })).toBe(2);

    const spans = exporter
      .getFinishedSpans()
      .filter((x) => x.name === "casq.v1.QueueService/EnqueueStream request");
    expect(spans).toHaveLength(2);
    const traced = spans.find((x) => x.spanContext().traceId === traceId);
    expect(traced?.parentSpanContext?.spanId).toBe("00f067aa0ba902b7");
    // The message carries the request's span as its trace context, as a unary call's carries the RPC span.
    const claimed = await clients.queue.claim({ queue: "mail", workerId: "w", maxMessages: 1 });
    expect(claimed.messages[0]?.message?.traceContext?.traceparent).toBe(
      `00-${traceId}-${traced?.spanContext().spanId}-01`,
    );
  });
});
