/**
 * QueueService over real gRPC (HTTP/2) and Connect JSON (HTTP/1.1) on
 * loopback: round trips, long polls, per-receipt results, LookupShards.
 */
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { AckOutcome, HeartbeatOutcome, NackOutcome } from "@casq/api/casq/v1/message_pb.ts";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import { createClient } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { bytes, connectJsonClients, grpcClients, text, useTestServers } from "./support.ts";

const server = useTestServers();

describe("QueueService", () => {
  it("enqueues, claims and acks over gRPC (HTTP/2), auto-creating the queue", async () => {
    const s = await server();
    const { queue } = grpcClients(s.address);
    const enq = await queue.enqueue({
      queue: "mail",
      messages: [{ payload: bytes("hello"), headers: { to: "ann" }, key: "k1", priority: 5 }],
    });
    expect(enq.messages).toHaveLength(1);
    expect(enq.messages[0]?.id).toMatch(/^[0-9A-Z]{26}$/);
    expect(enq.messages[0]?.offset).toBe(0n);

    const claimed = await queue.claim({ queue: "mail", workerId: "w1", maxMessages: 10 });
    expect(claimed.messages).toHaveLength(1);
    const job = claimed.messages[0];
    expect(text(job?.message?.payload)).toBe("hello");
    expect(job?.message?.headers).toEqual({ to: "ann" });
    expect(job?.message?.key).toBe("k1");
    expect(job?.message?.priority).toBe(5);
    expect(job?.subscription).toBe("default");
    expect(job?.attempt).toBe(1);
    expect(job?.receipt).toBe("0.0.1");
    expect(job?.leaseDeadline).toBeDefined();

    const acked = await queue.ack({ queue: "mail", receipts: [job?.receipt ?? ""] });
    expect(acked.results).toEqual([expect.objectContaining({ receipt: "0.0.1", outcome: AckOutcome.ACKED })]);
    const again = await queue.ack({ queue: "mail", receipts: [job?.receipt ?? ""] });
    expect(again.results[0]?.outcome).toBe(AckOutcome.ALREADY_ACKED);
    expect((await queue.claim({ queue: "mail", workerId: "w1" })).messages).toEqual([]);
  });

  it("serves the Connect protocol with JSON over HTTP/1.1 on the same port", async () => {
    const s = await server();
    const { queue } = connectJsonClients(s.address);
    await queue.enqueue({ queue: "json", messages: [{ payload: bytes("over http/1.1") }] });
    const claimed = await queue.claim({ queue: "json", workerId: "curl" });
    expect(text(claimed.messages[0]?.message?.payload)).toBe("over http/1.1");
    const res = await fetch(`http://${s.address}/casq.v1.QueueService/LookupShards`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ queue: "json" }),
    });
    expect(res.status).toBe(200);
    const body = (await res.json()) as { shards: { shard?: number; leader?: { address: string } }[] };
    expect(body.shards).toHaveLength(1);
    expect(body.shards[0]?.leader?.address).toBe(s.advertisedAddress);
  });

  it("serves gRPC-Web over HTTP/1.1 as well", async () => {
    const s = await server();
    const transport = createGrpcWebTransport({ baseUrl: `http://${s.address}`, httpVersion: "1.1" });
    const queue = createClient(QueueService, transport);
    await queue.enqueue({ queue: "web", messages: [{ payload: bytes("from a browser") }] });
    const claimed = await queue.claim({ queue: "web", workerId: "tab-1" });
    expect(text(claimed.messages[0]?.message?.payload)).toBe("from a browser");
  });

  it("long-polls a claim until a message is enqueued", async () => {
    const s = await server();
    const { queue } = grpcClients(s.address);
    await queue.enqueue({ queue: "poll", messages: [{ payload: bytes("warm-up") }] });
    await queue.claim({ queue: "poll", workerId: "w" });
    const waiting = queue.claim({ queue: "poll", workerId: "w", wait: durationFromMs(10_000) });
    await new Promise((resolve) => setTimeout(resolve, 100));
    await queue.enqueue({ queue: "poll", messages: [{ payload: bytes("late") }] });
    const got = await waiting;
    // The claim was parked (the queue was empty) and woke with the late message, not with an empty answer.
    expect(text(got.messages[0]?.message?.payload)).toBe("late");
  });

  it("returns an empty long-poll answer when the wait runs out, before the call's deadline", async () => {
    const s = await server();
    const { queue } = grpcClients(s.address);
    await queue.enqueue({ queue: "idle", messages: [{ payload: bytes("x") }] });
    await queue.claim({ queue: "idle", workerId: "w" });
    const started = Date.now();
    const empty = await queue.claim({ queue: "idle", workerId: "w", wait: durationFromMs(300) });
    expect(empty.messages).toEqual([]);
    expect(Date.now() - started).toBeGreaterThanOrEqual(250);
    const capped = await queue.claim(
      { queue: "idle", workerId: "w", wait: durationFromMs(20_000) },
      { timeoutMs: 400 },
    );
    expect(capped.messages).toEqual([]);
  });

  it("heartbeats and nacks per receipt, in request order, across shards", async () => {
    const s = await server();
    const { queue, admin } = grpcClients(s.address);
    await admin.createQueue({ queue: "multi", shardCount: 3 });
    // Each request's messages without key or dedup id share a shard; requests go round-robin.
    for (let r = 0; r < 3; r++) {
      await queue.enqueue({
        queue: "multi",
        messages: Array.from({ length: 2 }, (_, i) => ({ payload: bytes(`m${r}.${i}`) })),
      });
    }
    const claimed = await queue.claim({
      queue: "multi",
      workerId: "w",
      maxMessages: 6,
      leaseTtl: durationFromMs(30_000),
    });
    expect(claimed.messages).toHaveLength(6);
    expect(new Set(claimed.messages.map((m) => m.message?.shard)).size).toBe(3);
    const receipts = claimed.messages.map((m) => m.receipt).reverse();
    const hb = await queue.heartbeat({ queue: "multi", workerId: "w", receipts: [...receipts, "2.999.1"] });
    expect(hb.results.map((r) => r.receipt)).toEqual([...receipts, "2.999.1"]);
    expect(hb.results.slice(0, 6).every((r) => r.outcome === HeartbeatOutcome.EXTENDED)).toBe(true);
    expect(hb.results[6]?.outcome).toBe(HeartbeatOutcome.LOST);

    const nacked = await queue.nack({
      queue: "multi",
      receipts: receipts.slice(0, 2),
      delay: durationFromMs(60_000),
      reason: "try later",
    });
    expect(nacked.results.map((r) => r.receipt)).toEqual(receipts.slice(0, 2));
    expect(nacked.results.every((r) => r.outcome === NackOutcome.RETRY_SCHEDULED && r.retryAt)).toBe(true);
    const dead = await queue.nack({ queue: "multi", receipts: receipts.slice(2, 3), deadLetter: true });
    expect(dead.results[0]?.outcome).toBe(NackOutcome.DEAD_LETTERED);
    // receipts[2] was dead-lettered: its delivery is no longer the current one.
    const acks = await queue.ack({
      queue: "multi",
      receipts: [receipts[3] ?? "", receipts[3] ?? "", receipts[2] ?? ""],
    });
    expect(acks.results.map((r) => r.outcome)).toEqual([
      AckOutcome.ACKED,
      AckOutcome.ALREADY_ACKED,
      AckOutcome.LEASE_LOST,
    ]);
  });

  it("routes keyed messages to a stable shard and reports every shard's leader", async () => {
    const s = await server();
    const { queue, admin } = grpcClients(s.address);
    await admin.createQueue({ queue: "keyed", shardCount: 4 });
    const out = await queue.enqueue({
      queue: "keyed",
      messages: [
        { payload: bytes("1"), key: "customer-7" },
        { payload: bytes("2"), key: "customer-7" },
      ],
    });
    expect(out.messages[0]?.shard).toBe(out.messages[1]?.shard);
    const routes = await queue.lookupShards({ queue: "keyed" });
    expect(routes.shards.map((r) => r.shard)).toEqual([0, 1, 2, 3]);
    for (const r of routes.shards) expect(r.leader?.address).toBe(s.advertisedAddress);
  });

  it("deduplicates by dedup id", async () => {
    const s = await server();
    const { queue } = grpcClients(s.address);
    const first = await queue.enqueue({
      queue: "dedup",
      messages: [{ payload: bytes("a"), dedupId: "order-1" }],
    });
    const second = await queue.enqueue({
      queue: "dedup",
      messages: [{ payload: bytes("b"), dedupId: "order-1" }],
    });
    expect(second.messages[0]).toMatchObject({ id: first.messages[0]?.id, duplicate: true });
  });

  it("takes the trace context from the call metadata when the message has none", async () => {
    const s = await server();
    const { queue } = grpcClients(s.address);
    const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    await queue.enqueue(
      { queue: "traced", messages: [{ payload: bytes("t") }] },
      { headers: { traceparent } },
    );
    const claimed = await queue.claim({ queue: "traced", workerId: "w" });
    expect(claimed.messages[0]?.message?.traceContext?.traceparent).toBe(traceparent);
  });
});
