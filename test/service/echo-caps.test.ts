/**
 * Invalid values are echoed into error messages only in part: a huge queue
 * name, subscription name or other field must come back as
 * INVALID_ARGUMENT with a short message, never as an INTERNAL error because
 * the `grpc-message` trailer outgrew the HTTP/2 frame (issue 10, item 4).
 */

import { Health } from "@casq/api/grpc/health/v1/health_pb.ts";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { bytes, connectJsonClients, grpcClients, useTestServers } from "./support.ts";

const server = useTestServers();

const HUGE = "X".repeat(70_000);

async function failure(call: Promise<unknown>): Promise<ConnectError> {
  try {
    await call;
  } catch (error) {
    return ConnectError.from(error);
  }
  throw new Error("the call succeeded");
}

describe("echoed values are capped", () => {
  it("answers INVALID_ARGUMENT with a short message for a 70,000-character name, on every RPC", async () => {
    const s = await server();
    for (const clients of [grpcClients(s.address), connectJsonClients(s.address)]) {
      const { queue, admin } = clients;
      await admin.createQueue({ queue: "q" }).catch(() => {});
      const calls: [string, () => Promise<unknown>][] = [
        ["Enqueue", () => queue.enqueue({ queue: HUGE, messages: [{ payload: bytes("x") }] })],
        ["Claim", () => queue.claim({ queue: HUGE, workerId: "w" })],
        ["Claim subscription", () => queue.claim({ queue: "q", subscription: HUGE, workerId: "w" })],
        ["Heartbeat", () => queue.heartbeat({ queue: HUGE, workerId: "w", receipts: ["0.0.1"] })],
        ["Ack", () => queue.ack({ queue: HUGE, receipts: ["0.0.1"] })],
        ["Ack subscription", () => queue.ack({ queue: "q", subscription: HUGE, receipts: ["0.0.1"] })],
        ["Ack receipt", () => queue.ack({ queue: "q", receipts: [HUGE] })],
        ["Nack", () => queue.nack({ queue: HUGE, receipts: ["0.0.1"] })],
        ["LookupShards", () => queue.lookupShards({ queue: HUGE })],
        ["GetQueue", () => admin.getQueue({ queue: HUGE })],
        ["CreateQueue", () => admin.createQueue({ queue: HUGE })],
        ["UpdateQueue", () => admin.updateQueue({ queue: HUGE })],
        ["DeleteQueue", () => admin.deleteQueue({ queue: HUGE })],
        ["CreateSubscription", () => admin.createSubscription({ queue: "q", subscription: HUGE })],
        ["DeleteSubscription", () => admin.deleteSubscription({ queue: "q", subscription: HUGE })],
        ["PurgeQueue", () => admin.purgeQueue({ queue: HUGE, allSubscriptions: true })],
        ["ListDeadLetters", () => admin.listDeadLetters({ queue: HUGE })],
        ["ListQueues token", () => admin.listQueues({ pageToken: HUGE })],
        ["RedriveDeadLetters", () => admin.redriveDeadLetters({ queue: HUGE, all: true })],
      ];
      for (const [name, call] of calls) {
        const error = await failure(call());
        expect(Code[error.code], `${name}: ${error.rawMessage.slice(0, 200)}`).toBe("InvalidArgument");
        expect(error.rawMessage.length, name).toBeLessThan(1024);
      }
      const doc = admin.getDocument({ queue: HUGE });
      const error = await failure(
        (async () => {
          for await (const _ of doc);
        })(),
      );
      expect(Code[error.code]).toBe("InvalidArgument");
    }
  });

  it("caps a long value in the Work stream's open error", async () => {
    const s = await server();
    const { queue } = grpcClients(s.address);
    async function* requests() {
      yield { command: { case: "open" as const, value: { queue: HUGE, workerId: "w", credits: 1 } } };
    }
    const error = await failure(
      (async () => {
        for await (const _ of queue.work(requests()));
      })(),
    );
    expect(Code[error.code]).toBe("InvalidArgument");
    expect(error.rawMessage).toMatch(/open\.queue "X+"\.\.\. \(70000 characters\) is not a valid queue name/);
    expect(error.rawMessage.length).toBeLessThan(1024);
  });

  it("cuts any status message to a size the trailer can carry (here: the health service's own echo)", async () => {
    const s = await server();
    const health = createClient(Health, createGrpcTransport({ baseUrl: `http://${s.address}` }));
    for (const service of [HUGE, "é".repeat(40_000), "😀".repeat(30_000)]) {
      const error = await failure(health.check({ service }));
      expect(Code[error.code]).toBe("NotFound");
      expect(error.rawMessage).toMatch(/^unknown service .*message cut/);
      expect(Buffer.byteLength(error.rawMessage)).toBeLessThanOrEqual(2048);
    }
  });
});
