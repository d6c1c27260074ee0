/**
 * `casq enqueue` when the leader it was redirected to stops answering in
 * the middle of a request (stored it, then froze): the CLI goes back to the
 * redirecting broker, which later takes the shard over and stores what it
 * is sent again. The resend must carry the same dedup ids as the first
 * attempt (generated ones when the input has none), and a failure after
 * such an attempt must say the input may be partly stored, never that it
 * was not enqueued.
 *
 * Stub brokers are real gRPC servers (HTTP/2, connectNodeAdapter) in this
 * process; the CLI is a child process.
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { create } from "@bufbuild/protobuf";
import { LeaderRedirectSchema } from "@casq/api/casq/v1/errors_pb.ts";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import { Code, ConnectError } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { afterAll, describe, expect, it } from "vitest";
import { LEADER_ADDRESS_TRAILER } from "../../sdk/ts/src/errors.ts";
import { casq } from "./support/processes.ts";

interface Stub {
  address: string;
  /** Dedup ids of every Enqueue this stub received, one array per request. */
  received: string[][];
  close: () => Promise<void>;
}

const stubs: Stub[] = [];
afterAll(async () => {
  await Promise.all(stubs.map((s) => s.close()));
});

/**
 * A stub broker. `answer` decides each Enqueue: "store" (OK), "hang" (never
 * answer), or the address of a leader to redirect to.
 */
async function startStub(answer: () => string): Promise<Stub> {
  const stub: Stub = { address: "", received: [], close: async () => {} };
  let offset = 0n;
  const handler = connectNodeAdapter({
    routes: (router) =>
      router.service(QueueService, {
        async enqueue(request, ctx) {
          stub.received.push(request.messages.map((m) => m.dedupId));
          const what = answer();
          if (what === "hang") {
            await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
            // The call's deadline (its grpc-timeout) may end it here a moment before the client's own
            // timer: answer as a server does then (DEADLINE_EXCEEDED), never as if the client had
            // cancelled, which it did not.
            throw ConnectError.from(ctx.signal.reason ?? new ConnectError("client gave up", Code.Canceled));
          }
          if (what !== "store") {
            throw new ConnectError(
              "shard led elsewhere",
              Code.Unavailable,
              { [LEADER_ADDRESS_TRAILER]: what },
              [
                {
                  desc: LeaderRedirectSchema,
                  value: create(LeaderRedirectSchema, {
                    leaderAddress: what,
                    queue: request.queue,
                    shard: 0,
                  }),
                },
              ],
            );
          }
          return {
            messages: request.messages.map((m) => ({ id: `id-${m.dedupId}`, shard: 0, offset: offset++ })),
          };
        },
      }),
  });
  const server = http2.createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  stub.address = `127.0.0.1:${(server.address() as AddressInfo).port}`;
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (session) => {
    sessions.add(session);
    session.on("close", () => sessions.delete(session));
  });
  stub.close = () =>
    new Promise<void>((resolve) => {
      server.close(() => resolve());
      for (const session of sessions) session.destroy();
    });
  stubs.push(stub);
  return stub;
}

/**
 * A frozen leader (stores, never answers) and the broker that redirects to
 * it `redirects` times, then stores (it took the shard over).
 */
async function frozenLeader(redirects: number) {
  const frozen = await startStub(() => "hang");
  let left = redirects;
  const survivor = await startStub(() => (left-- > 0 ? frozen.address : "store"));
  return { frozen, survivor };
}

// The per-attempt timeout is what ends the frozen leader's attempt; generous so that a loaded machine does not time out the healthy stub.
const TIMEOUT = ["--timeout", "3s"];

describe("casq enqueue resent after an attempt at a frozen leader", () => {
  it("resends the same generated dedup ids, so the survivor cannot store a message twice", async () => {
    const { frozen, survivor } = await frozenLeader(2);
    const r = await casq(
      ["enqueue", "q", ...TIMEOUT, "--retry-timeout", "30s", "--server", survivor.address],
      {
        input: 'one\n{"payload": "two", "dedup_id": "mine"}\n',
      },
    );
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain("enqueued 2 messages");
    expect(r.stdout).not.toContain("duplicate");
    const [sent] = frozen.received;
    expect(sent).toHaveLength(2);
    expect(sent?.[0]).toMatch(/^[0-9a-f-]{36}$/);
    expect(sent?.[1]).toBe("mine");
    // Every request, the survivor's final store included, carries those ids.
    expect(survivor.received.length).toBeGreaterThanOrEqual(2);
    for (const ids of survivor.received) expect(ids).toEqual(sent);
  });

  it("--dedup-id wins over a generated id", async () => {
    const { frozen, survivor } = await frozenLeader(1);
    const r = await casq([
      "enqueue",
      "q",
      "x",
      "--dedup-id",
      "order-42",
      ...TIMEOUT,
      "--server",
      survivor.address,
    ]);
    expect(r.code, r.stderr).toBe(0);
    expect(frozen.received).toEqual([["order-42"]]);
  });

  it("says the batch may be partly stored (exit 1) when the survivor still redirects at --retry-timeout", async () => {
    const { frozen, survivor } = await frozenLeader(Number.POSITIVE_INFINITY);
    const r = await casq(
      ["enqueue", "q", ...TIMEOUT, "--retry-timeout", "5s", "--server", survivor.address],
      {
        input: "one\ntwo\n",
      },
    );
    expect(r.code, r.stderr).toBe(1);
    expect(frozen.received).toHaveLength(1);
    expect(r.stderr).toContain("may have been applied");
    expect(r.stderr).toContain("lines 1..2 (this batch) may be partly stored");
    expect(r.stderr).not.toMatch(/lines from \d+ on were not/);
  });

  it("--no-dedup sends no dedup id and does not resend after the frozen leader's attempt", async () => {
    const { frozen, survivor } = await frozenLeader(1);
    const r = await casq(["enqueue", "q", "x", "--no-dedup", ...TIMEOUT, "--server", survivor.address]);
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr).toContain("may or may not have been applied");
    expect(frozen.received).toEqual([[""]]);
    // The first request only: it was redirected, nothing was resent.
    expect(survivor.received).toEqual([[""]]);
  });
});
