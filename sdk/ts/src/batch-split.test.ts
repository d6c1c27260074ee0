/**
 * Producer.enqueueBatch against stub brokers whose shards have different
 * leaders: a batch no single broker can store is answered with a
 * BatchRedirect, and the producer must split it by the routes, send the parts
 * to their leaders (following further redirects and splits when leadership
 * moved), and hand back one result per message in request order.
 *
 * The stubs are real gRPC servers (HTTP/2, connectNodeAdapter), so the status
 * details travel in `grpc-status-details-bin` exactly as from `casq serve`.
 */
import { create } from "@bufbuild/protobuf";
import { anyPack } from "@bufbuild/protobuf/wkt";
import { BatchRedirectSchema, LeaderRedirectSchema, RpcStatusSchema } from "@casq/api/casq/v1/errors_pb.ts";
import { type EnqueueRequest, QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import { Code, ConnectError, type HandlerContext } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { context, ROOT_CONTEXT, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { serveOnLoopback } from "../testing/loopback-server.ts";
import {
  BatchRedirectError,
  fromRpcStatus,
  LEADER_ADDRESS_TRAILER,
  NotFoundError,
  RedirectError,
  toCasqError,
} from "./errors.ts";
import { MAX_BATCH_SPLITS, Producer } from "./producer.ts";

/** What one stub broker saw of one Enqueue. */
interface Received {
  readonly keys: string[];
  readonly dedupIds: string[];
  readonly headers: Record<string, string>[];
  readonly traceparent: string | null;
}

/**
 * A stub broker. `route` decides, from the broker's own (possibly stale) view
 * of leadership, where each key goes: to this broker, or another address.
 */
interface Stub {
  address: string;
  received: Received[];
  /** Leader address of a key, as this broker sees it. */
  route: (key: string) => string;
  /** Replaces the normal answer, e.g. to fail or hang. */
  override?: (request: EnqueueRequest, ctx: HandlerContext) => Promise<never> | undefined;
  close: () => Promise<void>;
}

const stubs: Stub[] = [];

async function startStub(): Promise<Stub> {
  let offset = 0n;
  const stub: Stub = {
    address: "",
    received: [],
    route: () => stub.address,
    close: async () => {},
  };
  const handler = connectNodeAdapter({
    routes: (router) =>
      router.service(QueueService, {
        async enqueue(request, ctx) {
          stub.received.push({
            keys: request.messages.map((m) => m.key),
            dedupIds: request.messages.map((m) => m.dedupId),
            headers: request.messages.map((m) => ({ ...m.headers })),
            traceparent: ctx.requestHeader.get("traceparent"),
          });
          const overridden = stub.override?.(request, ctx);
          if (overridden) return overridden;
          const leaders = request.messages.map((m) => stub.route(m.key));
          const distinct = [...new Set(leaders)];
          if (distinct.length > 1 || (distinct.length === 1 && distinct[0] !== stub.address)) {
            if (distinct.length === 1) {
              const leaderAddress = distinct[0] as string;
              throw new ConnectError(
                "shard led elsewhere",
                Code.Unavailable,
                { [LEADER_ADDRESS_TRAILER]: leaderAddress },
                [{ desc: LeaderRedirectSchema, value: create(LeaderRedirectSchema, { leaderAddress }) }],
              );
            }
            const routes = distinct.map((leaderAddress) => ({
              leaderAddress,
              messageIndexes: leaders.flatMap((l, i) => (l === leaderAddress ? [i] : [])),
            }));
            throw new ConnectError("batch spans several leaders", Code.Unavailable, undefined, [
              {
                desc: BatchRedirectSchema,
                value: create(BatchRedirectSchema, { queue: request.queue, routes }),
              },
            ]);
          }
          return {
            messages: request.messages.map((m) => ({
              id: `${m.key}@${stub.address}`,
              shard: 0,
              offset: offset++,
              duplicate: false,
            })),
          };
        },
      }),
  });
  const server = await serveOnLoopback(handler);
  stub.address = server.address;
  stub.close = server.close;
  stubs.push(stub);
  return stub;
}

const manager = new AsyncLocalStorageContextManager();
beforeAll(() => {
  // The SDK's trace interceptor reads the active context; that needs a context manager.
  context.setGlobalContextManager(manager.enable());
});
afterAll(() => {
  context.disable();
});
afterEach(async () => {
  await Promise.all(stubs.splice(0).map((s) => s.close()));
});

const KEYS = ["a", "b", "c", "d", "e", "f"];
const batch = KEYS.map((key) => ({
  payload: `p-${key}`,
  key,
  dedupId: `d-${key}`,
  headers: { h: key },
}));

function producerFor(...addresses: string[]): Producer {
  return new Producer({ brokers: addresses, backoffInitialMs: 1, backoffMaxMs: 2, retryTimeoutMs: 10_000 });
}

describe("Producer.enqueueBatch across leaders", () => {
  it("splits a BatchRedirect by its routes and merges the results in request order", async () => {
    const [a, b] = [await startStub(), await startStub()];
    // Keys a, c, e on A; b, d, f on B, as both brokers see it.
    const route = (key: string) => ((KEYS.indexOf(key) % 2 === 0 ? a : b) as Stub).address;
    a.route = route;
    b.route = route;

    const span = trace.wrapSpanContext({
      traceId: "4bf92f3577b34da6a3ce929d0e0e4736",
      spanId: "00f067aa0ba902b7",
      traceFlags: 1,
    });
    const results = await context.with(trace.setSpan(ROOT_CONTEXT, span), () =>
      producerFor(a.address).enqueueBatch("q", batch),
    );

    expect(results.map((r) => r.id)).toEqual(KEYS.map((k) => `${k}@${route(k)}`));
    // A got the whole batch once (answered with the BatchRedirect), then its part.
    expect(a.received.map((r) => r.keys)).toEqual([KEYS, ["a", "c", "e"]]);
    expect(b.received.map((r) => r.keys)).toEqual([["b", "d", "f"]]);
    // Parts keep their messages' fields and the caller's trace context.
    expect(b.received[0]?.dedupIds).toEqual(["d-b", "d-d", "d-f"]);
    expect(b.received[0]?.headers).toEqual([{ h: "b" }, { h: "d" }, { h: "f" }]);
    for (const r of [...a.received, ...b.received]) {
      expect(r.traceparent).toBe("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    }
  });

  it("follows a redirect or a further split of a part when leadership moved meanwhile", async () => {
    const [a, b, c] = [await startStub(), await startStub(), await startStub()];
    // Truth: C took over a, b, c from A and e, f from B.
    const truth = (key: string) => (key === "d" ? b : c).address;
    // A answers the whole batch from a stale view (a, b, c its own; d, e, f on
    // B), and its part from the truth: a LeaderRedirect to C. B splits its part again.
    a.route = (key) =>
      a.received.length > 1 ? truth(key) : ["a", "b", "c"].includes(key) ? a.address : b.address;
    b.route = truth;
    c.route = truth;

    const results = await producerFor(a.address).enqueueBatch("q", batch);

    expect(results.map((r) => r.id)).toEqual(KEYS.map((k) => `${k}@${truth(k)}`));
    expect(a.received.map((r) => r.keys)).toEqual([KEYS, ["a", "b", "c"]]);
    expect(b.received.map((r) => r.keys)).toEqual([["d", "e", "f"], ["d"]]);
    expect(c.received.map((r) => r.keys).sort()).toEqual([
      ["a", "b", "c"],
      ["e", "f"],
    ]);
    expect(c.received.flatMap((r) => r.dedupIds).sort()).toEqual(["d-a", "d-b", "d-c", "d-e", "d-f"]);
  });

  it(`fails with a BatchRedirectError after ${MAX_BATCH_SPLITS} splits when leadership keeps moving`, async () => {
    const [a, b] = [await startStub(), await startStub()];
    // Each broker claims only the first message of whatever it is sent and routes the rest to the other.
    const bounce = (self: Stub, other: Stub) => (request: EnqueueRequest) => {
      const routes = [
        { leaderAddress: other.address, messageIndexes: [0] },
        {
          leaderAddress: self.address,
          messageIndexes: request.messages.slice(1).map((_, i) => i + 1),
        },
      ].filter((r) => r.messageIndexes.length > 0);
      return Promise.reject(
        new ConnectError("batch spans several leaders", Code.Unavailable, undefined, [
          { desc: BatchRedirectSchema, value: create(BatchRedirectSchema, { queue: "q", routes }) },
        ]),
      );
    };
    a.override = bounce(a, b);
    b.override = bounce(b, a);

    const error = await producerFor(a.address)
      .enqueueBatch("q", batch)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BatchRedirectError);
    expect((error as BatchRedirectError).message).toMatch(/after 3 splits/);
    expect((error as BatchRedirectError).cause).toBeInstanceOf(BatchRedirectError);
    // Bounded: the first call plus at most two parts per split level.
    expect(a.received.length + b.received.length).toBeLessThanOrEqual(1 + 2 + 4 + 8);
  });

  it("a failing part fails the call and aborts the other parts", async () => {
    const [a, b] = [await startStub(), await startStub()];
    a.route = (key) => ((KEYS.indexOf(key) % 2 === 0 ? a : b) as Stub).address;
    // A's part fails once B holds its part (so that there is a call to abort); B's part hangs.
    a.override = (request) =>
      request.messages.length === KEYS.length
        ? undefined
        : eventually(() => b.received.length === 1).then(() => {
            throw new ConnectError("no such queue", Code.NotFound);
          });
    let bAborted = false;
    b.override = (_request, ctx) => hangUntilAborted(ctx, () => (bAborted = true));

    const error = await producerFor(a.address)
      .enqueueBatch("q", batch)
      .catch((e: unknown) => e);

    expect(error).toBeInstanceOf(NotFoundError);
    await eventually(() => bAborted);
  });

  it("the caller's abort signal ends every part", async () => {
    const [a, b] = [await startStub(), await startStub()];
    const route = (key: string) => ((KEYS.indexOf(key) % 2 === 0 ? a : b) as Stub).address;
    a.route = route;
    let bAborted = false;
    b.override = (_request, ctx) => hangUntilAborted(ctx, () => (bAborted = true));
    const controller = new AbortController();
    const failing = producerFor(a.address).enqueueBatch("q", batch, { signal: controller.signal });
    await eventually(() => b.received.length === 1);
    controller.abort();
    const error = await failing.catch((e: unknown) => e);
    expect(error).toMatchObject({ code: Code.Canceled });
    await eventually(() => bAborted);
  });

  it("the caller's deadline covers the parts", async () => {
    const [a, b] = [await startStub(), await startStub()];
    a.route = (key) => ((KEYS.indexOf(key) % 2 === 0 ? a : b) as Stub).address;
    let bAborted = false;
    b.override = (_request, ctx) => hangUntilAborted(ctx, () => (bAborted = true));
    const error = await producerFor(a.address)
      .enqueueBatch("q", batch, { timeoutMs: 500 })
      .catch((e: unknown) => e);
    expect(error).toMatchObject({ code: Code.DeadlineExceeded });
    await eventually(() => bAborted);
  });
});

describe("BatchRedirect detail", () => {
  const detail = create(BatchRedirectSchema, {
    queue: "q",
    routes: [
      { leaderAddress: "10.0.0.1:50051", messageIndexes: [0, 2] },
      { leaderAddress: "10.0.0.2:50051", messageIndexes: [1] },
    ],
  });

  it("becomes a BatchRedirectError, even next to a casq-leader-address trailer", () => {
    const error = toCasqError(
      new ConnectError("split", Code.Unavailable, { [LEADER_ADDRESS_TRAILER]: "10.0.0.1:50051" }, [
        { desc: BatchRedirectSchema, value: detail },
      ]),
    );
    expect(error).toBeInstanceOf(BatchRedirectError);
    expect(error).not.toBeInstanceOf(RedirectError);
    expect((error as BatchRedirectError).queue).toBe("q");
    expect((error as BatchRedirectError).routes).toEqual([
      { leaderAddress: "10.0.0.1:50051", messageIndexes: [0, 2] },
      { leaderAddress: "10.0.0.2:50051", messageIndexes: [1] },
    ]);
  });

  it("is read from a Work stream status too", () => {
    const error = fromRpcStatus(
      create(RpcStatusSchema, {
        code: Code.Unavailable,
        message: "split",
        details: [anyPack(BatchRedirectSchema, detail)],
      }),
    );
    expect(error).toBeInstanceOf(BatchRedirectError);
  });
});

/** A handler that answers only when the client gives the call up; `onAbort` records that it did. */
function hangUntilAborted(ctx: HandlerContext, onAbort: () => void): Promise<never> {
  return new Promise<never>((_, reject) => {
    ctx.signal.addEventListener("abort", () => {
      onAbort();
      reject(new ConnectError("aborted", Code.Canceled));
    });
  });
}

async function eventually(check: () => boolean, timeoutMs = 10_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > until) throw new Error("condition not met in time");
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}
