/**
 * Admin calls resent after an attempt that may have been applied: a stub
 * broker applies the request to the shared state and then hangs, so the
 * attempt runs into its own timeout and the call moves to a second stub that
 * sees the state the first attempt left. Creates and deletes must report the
 * success the first attempt had (not ALREADY_EXISTS / NOT_FOUND), and a
 * purge must not be sent twice.
 *
 * The stubs are real gRPC servers (HTTP/2, connectNodeAdapter).
 */
import { AdminService } from "@casq/api/casq/v1/admin_service_pb.ts";
import { Code, ConnectError } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { afterAll, describe, expect, it } from "vitest";
import { serveOnLoopback } from "../testing/loopback-server.ts";
import { Admin } from "./admin.ts";
import { AlreadyExistsError } from "./errors.ts";

/** What both stubs share: the "store". */
interface State {
  queues: Map<string, number>;
  subscriptions: Set<string>;
  purges: string[];
  /** Shard count another client created the queue with while the first attempt hung. */
  createdMeanwhile?: number;
}

interface Stub {
  address: string;
  /** Apply, then never answer. */
  hangAfterApply: boolean;
  close: () => Promise<void>;
}

const stubs: Stub[] = [];
afterAll(async () => {
  await Promise.all(stubs.map((s) => s.close()));
});

async function startStub(state: State, hangAfterApply: boolean): Promise<Stub> {
  const stub: Stub = { address: "", hangAfterApply, close: async () => {} };
  // Answers after applying: OK, or (hung) only when the client gives up.
  const answer = async <T>(value: T, signal: AbortSignal): Promise<T> => {
    if (!stub.hangAfterApply) return value;
    await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
    throw new ConnectError("hung", Code.Unavailable);
  };
  const handler = connectNodeAdapter({
    routes: (router) =>
      router.service(AdminService, {
        async createQueue(request, ctx) {
          const existing = state.queues.get(request.queue);
          if (existing !== undefined) {
            if (!request.ifNotExists) throw new ConnectError("queue exists", Code.AlreadyExists);
            return { queue: request.queue, shardCount: existing, created: false };
          }
          const shardCount =
            (stub.hangAfterApply ? state.createdMeanwhile : undefined) ?? Math.max(1, request.shardCount);
          state.queues.set(request.queue, shardCount);
          return answer({ queue: request.queue, shardCount, created: true }, ctx.signal);
        },
        async deleteQueue(request, ctx) {
          if (!state.queues.delete(request.queue)) throw new ConnectError("no queue", Code.NotFound);
          return answer({}, ctx.signal);
        },
        async createSubscription(request, ctx) {
          const key = `${request.queue}/${request.subscription}`;
          if (state.subscriptions.has(key)) throw new ConnectError("exists", Code.AlreadyExists);
          state.subscriptions.add(key);
          return answer({ subscription: request.subscription, start: request.start }, ctx.signal);
        },
        async deleteSubscription(request, ctx) {
          if (!state.subscriptions.delete(`${request.queue}/${request.subscription}`)) {
            throw new ConnectError("no subscription", Code.NotFound);
          }
          return answer({}, ctx.signal);
        },
        async purgeQueue(request, ctx) {
          state.purges.push(request.queue);
          return answer({}, ctx.signal);
        },
      }),
  });
  const server = await serveOnLoopback(handler);
  stub.address = server.address;
  stub.close = server.close;
  stubs.push(stub);
  return stub;
}

/** A hung broker first in the list, a healthy one second, over one state. */
async function cluster() {
  const state: State = { queues: new Map(), subscriptions: new Set(), purges: [] };
  const hung = await startStub(state, true);
  const healthy = await startStub(state, false);
  // A per-attempt timeout well above a loaded machine's stalls; the retry budget far above it.
  const admin = new Admin({
    brokers: [hung.address, healthy.address],
    timeoutMs: 1_500,
    retryTimeoutMs: 30_000,
    backoffInitialMs: 1,
    backoffMaxMs: 5,
  });
  return { state, admin };
}

describe("Admin calls resent after an attempt that may have been applied", () => {
  it("createQueue: the queue the hung attempt created counts as success", async () => {
    const { state, admin } = await cluster();
    const response = await admin.createQueue("q", { shardCount: 2 });
    expect(response.shardCount).toBe(2);
    expect(state.queues.get("q")).toBe(2);
  });

  it("createQueue: a queue found with another shard count is still an AlreadyExistsError", async () => {
    const { state, admin } = await cluster();
    state.createdMeanwhile = 3;
    await expect(admin.createQueue("q", { shardCount: 2 })).rejects.toBeInstanceOf(AlreadyExistsError);
  });

  it("createSubscription and deleteSubscription: the hung attempt's change counts as success", async () => {
    const { state, admin } = await cluster();
    const created = await admin.createSubscription("q", "audit");
    expect(created.subscription).toBe("audit");
    expect(state.subscriptions.has("q/audit")).toBe(true);
    await admin.deleteSubscription("q", "audit");
    expect(state.subscriptions.has("q/audit")).toBe(false);
  });

  it("deleteQueue: the queue the hung attempt deleted counts as success", async () => {
    const { state, admin } = await cluster();
    state.queues.set("q", 1);
    await admin.deleteQueue("q");
    expect(state.queues.has("q")).toBe(false);
  });

  it("purge is not sent again after an attempt that may have been applied", async () => {
    const { state, admin } = await cluster();
    await expect(admin.purge("q")).rejects.toMatchObject({ code: Code.DeadlineExceeded });
    expect(state.purges).toEqual(["q"]);
  });
});
