/**
 * A queue without any subscription, over real gRPC on loopback: with no
 * retention nothing would keep a message, so Enqueue is FAILED_PRECONDITION
 * and stores nothing (never an OK for dropped data); with a retention, or
 * once a subscription exists again, enqueues are kept.
 */
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { SubscriptionStart } from "@casq/api/casq/v1/admin_service_pb.ts";
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { bytes, grpcClients, text, useTestServers } from "./support.ts";

const server = useTestServers();

async function failure(call: Promise<unknown>): Promise<ConnectError> {
  try {
    await call;
  } catch (error) {
    return ConnectError.from(error);
  }
  throw new Error("the call succeeded");
}

describe("a queue without subscriptions", () => {
  it("refuses Enqueue with FAILED_PRECONDITION once its last subscription is deleted, and stores nothing", async () => {
    const s = await server();
    const { admin, queue } = grpcClients(s.address);
    await admin.createQueue({ queue: "orphan", shardCount: 2 });
    await admin.deleteSubscription({ queue: "orphan", subscription: "default" });

    const refused = await failure(
      queue.enqueue({
        queue: "orphan",
        messages: [{ payload: bytes("a") }, { payload: bytes("b"), key: "k" }],
      }),
    );
    expect(Code[refused.code]).toBe("FailedPrecondition");
    expect(refused.rawMessage).toMatch(/no subscription and no retention.*nothing was stored/);
    const info = await admin.getQueue({ queue: "orphan" });
    expect(info.totals?.enqueued).toBe(0n);
    expect(info.totals?.messages).toBe(0n);

    await admin.createSubscription({ queue: "orphan", subscription: "default" });
    const ok = await queue.enqueue({ queue: "orphan", messages: [{ payload: bytes("c") }] });
    expect(ok.messages).toHaveLength(1);
    const claimed = await queue.claim({ queue: "orphan", workerId: "w", maxMessages: 10 });
    expect(claimed.messages.map((m) => text(m.message?.payload))).toEqual(["c"]);
  });

  it("keeps enqueued messages by retention while no subscription exists", async () => {
    const s = await server();
    const { admin, queue } = grpcClients(s.address);
    await admin.createQueue({ queue: "log", config: { retention: durationFromMs(3_600_000) } });
    await admin.deleteSubscription({ queue: "log", subscription: "default" });
    await queue.enqueue({ queue: "log", messages: [{ payload: bytes("kept") }] });
    expect((await admin.getQueue({ queue: "log" })).totals?.messages).toBe(1n);
    await admin.createSubscription({
      queue: "log",
      subscription: "replay",
      start: SubscriptionStart.EARLIEST,
    });
    const claimed = await queue.claim({ queue: "log", subscription: "replay", workerId: "w" });
    expect(claimed.messages.map((m) => text(m.message?.payload))).toEqual(["kept"]);
  });
});
