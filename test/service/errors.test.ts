/**
 * Every engine error reaches the client as the documented gRPC status, over
 * real gRPC on loopback: bad input is INVALID_ARGUMENT and changes nothing,
 * limits are RESOURCE_EXHAUSTED, unknown queues NOT_FOUND, a shard led by
 * another broker is UNAVAILABLE with the `casq-leader-address` trailer and a
 * decodable casq.v1.LeaderRedirect detail.
 */
import { durationFromMs, timestampFromMs } from "@bufbuild/protobuf/wkt";
import { BatchRedirectSchema, LeaderRedirectSchema } from "@casq/api/casq/v1/errors_pb.ts";
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { shardForKey } from "../../server/src/broker/shard-routing.ts";
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import { bytes, connectJsonClients, grpcClients, sharedStore, useTestServers } from "./support.ts";

const server = useTestServers();

/** The ConnectError a call fails with (fails the test if it succeeds). */
async function failure(call: Promise<unknown>): Promise<ConnectError> {
  try {
    await call;
  } catch (error) {
    return ConnectError.from(error);
  }
  throw new Error("the call succeeded");
}

async function expectCode(call: Promise<unknown>, code: Code, message?: RegExp): Promise<ConnectError> {
  const error = await failure(call);
  expect(Code[error.code], error.message).toBe(Code[code]);
  if (message) expect(error.rawMessage).toMatch(message);
  return error;
}

describe("error mapping", () => {
  it("answers INVALID_ARGUMENT for malformed requests, naming the field, and applies nothing", async () => {
    const s = await server();
    const { queue, admin } = grpcClients(s.address);
    await admin.createQueue({ queue: "q", shardCount: 4 });
    const ok = { payload: bytes("fine") };
    const far = Date.now() + 400 * 86_400_000;
    const cases: [Promise<unknown>, RegExp][] = [
      [queue.enqueue({ queue: "Bad Name", messages: [ok] }), /queue "Bad Name" is not a valid queue name/],
      [queue.enqueue({ queue: "", messages: [ok] }), /queue is required/],
      [queue.enqueue({ queue: "q", messages: [] }), /messages is empty/],
      [queue.enqueue({ queue: "q", messages: Array.from({ length: 1001 }, () => ok) }), /at most 1000/],
      // A batch spanning shards with one bad message: nothing is stored anywhere.
      [
        queue.enqueue({ queue: "q", messages: [ok, ok, ok, { payload: bytes("x"), priority: 1001 }] }),
        /messages\[3\]\.priority must be between -1000 and 1000/,
      ],
      [queue.enqueue({ queue: "q", messages: [{ maxAttempts: 1001 }] }), /max_attempts/],
      [queue.enqueue({ queue: "q", messages: [{ key: "k".repeat(1025) }] }), /key is longer than 1024 bytes/],
      [queue.enqueue({ queue: "q", messages: [{ dedupId: "d".repeat(257) }] }), /dedup_id is longer/],
      [
        queue.enqueue({
          queue: "q",
          messages: [{ schedule: { case: "delay", value: durationFromMs(366 * 86_400_000) } }],
        }),
        /messages\[0\]\.delay must be between 0ms and 365d/,
      ],
      [
        queue.enqueue({
          queue: "q",
          messages: [{ schedule: { case: "delay", value: { seconds: -1n, nanos: 0 } } }],
        }),
        /delay must be between/,
      ],
      [
        queue.enqueue({
          queue: "q",
          messages: [{ schedule: { case: "runAt", value: timestampFromMs(far) } }],
        }),
        /run_at is more than 365d ahead/,
      ],
      [queue.enqueue({ queue: "q", messages: [{ headers: { "": "x" } }] }), /header name is empty/],
      [queue.claim({ queue: "q", workerId: "" }), /worker_id is required/],
      [
        queue.claim({ queue: "q", workerId: "w", maxMessages: 1001 }),
        /max_messages must be between 1 and 1000/,
      ],
      [
        queue.claim({ queue: "q", workerId: "w", wait: durationFromMs(21_000) }),
        /wait must be between 0ms and 20s/,
      ],
      [
        queue.claim({ queue: "q", workerId: "w", leaseTtl: durationFromMs(50) }),
        /lease_ttl must be between 100ms/,
      ],
      [queue.claim({ queue: "q", subscription: "No!", workerId: "w" }), /subscription "No!"/],
      [queue.ack({ queue: "q", receipts: [] }), /receipts is empty/],
      [queue.ack({ queue: "q", receipts: ["0.1.1", "garbage"] }), /receipts\[1\] "garbage" is not a receipt/],
      [queue.ack({ queue: "q", receipts: ["01.1.1"] }), /not a receipt/],
      [queue.ack({ queue: "q", receipts: ["0.1.0"] }), /not a receipt/],
      [queue.ack({ queue: "q", receipts: ["7.1.1"] }), /names shard 7, but the queue has 4/],
      [queue.heartbeat({ queue: "q", workerId: "", receipts: ["0.1.1"] }), /worker_id is required/],
      [queue.nack({ queue: "q", receipts: ["0.1.1"], delay: durationFromMs(-5) }), /delay must be between/],
      [admin.createQueue({ queue: "big", shardCount: 257 }), /shard_count must be between 1 and 256/],
      [
        admin.createQueue({ queue: "cfg", config: { maxAttempts: 0 } }),
        /max_attempts must be between 1 and 1000/,
      ],
      [admin.updateQueue({ queue: "q", config: { leaseTtl: durationFromMs(10) } }), /lease_ttl/],
      [admin.purgeQueue({ queue: "q" }), /exactly one of subscription and all_subscriptions/],
      [admin.redriveDeadLetters({ queue: "q" }), /nothing selected/],
      [admin.listQueues({ pageToken: "not-a-token" }), /page_token/],
      [admin.listQueues({ pageSize: 1001 }), /page_size must be at most 1000/],
    ];
    for (const [call, message] of cases) await expectCode(call, Code.InvalidArgument, message);
    const stats = await admin.getQueue({ queue: "q" });
    expect(stats.totals?.messages).toBe(0n);
    expect((await queue.claim({ queue: "q", workerId: "w", maxMessages: 100 })).messages).toEqual([]);
  });

  it("answers RESOURCE_EXHAUSTED for queue limits and oversized requests", async () => {
    const s = await server({ maxRequestBytes: 64 * 1024 });
    const { queue, admin } = grpcClients(s.address);
    await admin.createQueue({ queue: "small", config: { limits: { maxPayloadBytes: 10, maxBatch: 2 } } });
    await expectCode(
      queue.enqueue({ queue: "small", messages: [{ payload: bytes("0123456789ABC") }] }),
      Code.ResourceExhausted,
      /payload size in bytes \(13\) exceeds the queue's limit of 10; make it smaller or raise max_payload_bytes/,
    );
    await expectCode(
      queue.enqueue({ queue: "small", messages: [{}, {}, {}] }),
      Code.ResourceExhausted,
      /max_batch/,
    );
    await expectCode(
      queue.ack({ queue: "small", receipts: ["0.0.1", "0.1.1", "0.2.1"] }),
      Code.ResourceExhausted,
      /number of receipts \(3\) exceeds the queue's limit of 2/,
    );
    await expectCode(
      queue.enqueue({ queue: "small", messages: [{ payload: new Uint8Array(100 * 1024) }] }),
      Code.ResourceExhausted,
    );
    expect((await admin.getQueue({ queue: "small" })).totals?.messages).toBe(0n);
  });

  it("refuses an enqueue the queue it would auto-create would refuse, and creates nothing (unary and stream)", async () => {
    const s = await server();
    const { queue, admin } = grpcClients(s.address);
    const bigHeader = { headers: { h: "v".repeat(17 * 1024) } }; // over the default max_header_bytes (16 KiB)
    const manyHeaders = { headers: Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`h${i}`, "v"])) };
    await expectCode(
      queue.enqueue({ queue: "fresh", messages: [{}, bigHeader] }),
      Code.ResourceExhausted,
      /message 1: header size in bytes \(\d+\) exceeds the queue's limit of 16384/,
    );
    await expectCode(
      queue.enqueue({ queue: "fresh", messages: [manyHeaders] }),
      Code.ResourceExhausted,
      /header/,
    );
    async function* one() {
      yield { requestId: 1n, enqueue: { queue: "fresh", messages: [bigHeader] } };
    }
    const answers = [];
    for await (const answer of queue.enqueueStream(one())) answers.push(answer);
    expect(answers.map((a) => a.result.case === "error" && Code[a.result.value.code])).toEqual([
      "ResourceExhausted",
    ]);
    // 51 MB on the wire, ~68 MB in the shard (payloads count as base64): over its 64 MiB max_document_bytes.
    const big = { payload: new Uint8Array(1_000_000) };
    await expectCode(
      queue.enqueue({ queue: "fresh", messages: Array.from({ length: 51 }, () => big) }),
      Code.ResourceExhausted,
      /max_document_bytes/,
    );
    expect(await s.store.list("queues/fresh/")).toEqual([]);
    await expectCode(admin.getQueue({ queue: "fresh" }), Code.NotFound);
    // A request it admits creates it as before.
    expect((await queue.enqueue({ queue: "fresh", messages: [{}] })).queueCreated).toBe(true);
  });

  it("answers NOT_FOUND for unknown queues and subscriptions, and ALREADY_EXISTS / FAILED_PRECONDITION", async () => {
    const s = await server({ autoCreateQueues: false });
    const { queue, admin } = grpcClients(s.address);
    await expectCode(
      queue.enqueue({ queue: "nope", messages: [{}] }),
      Code.NotFound,
      /queue nope does not exist/,
    );
    await expectCode(queue.claim({ queue: "nope", workerId: "w" }), Code.NotFound);
    await expectCode(queue.ack({ queue: "nope", receipts: ["0.0.1"] }), Code.NotFound);
    await expectCode(queue.lookupShards({ queue: "nope" }), Code.NotFound);
    await expectCode(admin.getQueue({ queue: "nope" }), Code.NotFound);
    await expectCode(
      admin.getDocument({ queue: "nope", shard: 0 })[Symbol.asyncIterator]().next(),
      Code.NotFound,
    );

    await admin.createQueue({ queue: "here" });
    await expectCode(
      queue.claim({ queue: "here", subscription: "ghost", workerId: "w" }),
      Code.NotFound,
      /ghost/,
    );
    await expectCode(admin.deleteSubscription({ queue: "here", subscription: "ghost" }), Code.NotFound);
    await expectCode(admin.createQueue({ queue: "here" }), Code.AlreadyExists, /already exists/);
    await expectCode(
      admin.createSubscription({ queue: "here", subscription: "default" }),
      Code.AlreadyExists,
    );
    await queue.enqueue({ queue: "here", messages: [{ payload: bytes("keep me") }] });
    await expectCode(
      admin.deleteQueue({ queue: "here" }),
      Code.FailedPrecondition,
      /purge it first or set force/,
    );
    await admin.deleteQueue({ queue: "here", force: true });
    await expectCode(queue.claim({ queue: "here", workerId: "w" }), Code.NotFound);
  });

  it("redirects to the leading broker: UNAVAILABLE, casq-leader-address trailer and a LeaderRedirect detail", async () => {
    const store = sharedStore(new MemoryStore());
    const a = await server({ store, brokerId: "broker-a" });
    const b = await server({ store, brokerId: "broker-b" });
    await grpcClients(a.address).queue.enqueue({ queue: "led", messages: [{ payload: bytes("1") }] });

    const error = await expectCode(
      grpcClients(b.address).queue.enqueue({ queue: "led", messages: [{ payload: bytes("2") }] }),
      Code.Unavailable,
      /led by broker broker-a/,
    );
    // Spelled out as proto/casq/v1/errors.proto names it: this pins LEADER_ADDRESS_TRAILER on the wire.
    expect(error.metadata.get("casq-leader-address")).toBe(a.advertisedAddress);
    const [redirect] = error.findDetails(LeaderRedirectSchema);
    expect(redirect).toMatchObject({
      leaderAddress: a.advertisedAddress,
      leaderId: "broker-a",
      queue: "led",
      shard: 0,
    });
    expect(redirect?.epoch).toBeGreaterThanOrEqual(1n);

    // The same over Connect JSON / HTTP/1.1.
    const viaJson = await expectCode(
      connectJsonClients(b.address).queue.claim({ queue: "led", workerId: "w" }),
      Code.Unavailable,
    );
    expect(viaJson.findDetails(LeaderRedirectSchema)[0]?.leaderAddress).toBe(a.advertisedAddress);
    expect(viaJson.metadata.get("casq-leader-address")).toBe(a.advertisedAddress);
    // Reads are answered by any broker.
    const routes = await grpcClients(b.address).queue.lookupShards({ queue: "led" });
    expect(routes.shards[0]?.leader?.brokerId).toBe("broker-a");
  });

  it("refuses a batch over shards led by two brokers as a whole, with a BatchRedirect that splits it", async () => {
    const store = sharedStore(new MemoryStore());
    const first = await server({ store, brokerId: "broker-first" });
    const b = await server({ store, brokerId: "broker-b" });
    await grpcClients(first.address).admin.createQueue({ queue: "split", shardCount: 2 });
    await first.close({ graceful: true }); // releases both shards
    const c = await server({ store, brokerId: "broker-c" });
    const keyOf = (shard: number) =>
      ["a", "b", "c", "d", "e", "f"].find((k) => shardForKey(k, 2) === shard) ?? "";
    const [k0, k1] = [keyOf(0), keyOf(1)];
    // b takes shard 1, c takes shard 0.
    await grpcClients(b.address).queue.enqueue({
      queue: "split",
      messages: [{ payload: bytes("b1"), key: k1 }],
    });
    await grpcClients(c.address).queue.enqueue({
      queue: "split",
      messages: [{ payload: bytes("c0"), key: k0 }],
    });

    const batch = [
      { payload: bytes("x0"), key: k0 },
      { payload: bytes("x1"), key: k1 },
      { payload: bytes("y0"), key: k0 },
    ];
    const error = await expectCode(
      grpcClients(c.address).queue.enqueue({ queue: "split", messages: batch }),
      Code.Unavailable,
      /led by 2 brokers.*nothing was stored/,
    );
    const [split] = error.findDetails(BatchRedirectSchema);
    expect(split?.queue).toBe("split");
    expect(
      split?.routes.map((r) => ({ leaderAddress: r.leaderAddress, messageIndexes: r.messageIndexes })),
    ).toEqual(
      expect.arrayContaining([
        { leaderAddress: c.advertisedAddress, messageIndexes: [0, 2] },
        { leaderAddress: b.advertisedAddress, messageIndexes: [1] },
      ]),
    );
    expect(split?.routes).toHaveLength(2);
    const stored = async () =>
      (await grpcClients(b.address).admin.getQueue({ queue: "split" })).totals?.messages;
    expect(await stored()).toBe(2n); // nothing of the batch

    // Each part, sent to its broker, is stored.
    for (const route of split?.routes ?? []) {
      const messages = route.messageIndexes.map((i) => batch[i] ?? { payload: bytes("?") });
      await grpcClients(route.leaderAddress).queue.enqueue({ queue: "split", messages });
    }
    expect(await stored()).toBe(5n);
    // A batch within one broker's shards is stored as before.
    await grpcClients(c.address).queue.enqueue({
      queue: "split",
      messages: [batch[0] ?? { payload: bytes("?") }],
    });
    expect(await stored()).toBe(6n);
  });

  it("answers DATA_LOSS for a shard document that cannot be read, and leaves it alone", async () => {
    const inner = new MemoryStore();
    const s = await server({ store: sharedStore(inner) });
    const { queue, admin } = grpcClients(s.address);
    await admin.createQueue({ queue: "broken" });
    // Someone else (another broker, or a person) writes garbage after this broker loaded nothing yet.
    const fresh = await server({ store: sharedStore(inner) });
    const stored = await inner.get("queues/broken/0.json");
    await inner.put("queues/broken/0.json", bytes("{not json"), { ifMatch: stored?.etag ?? "" });
    await s.close({ graceful: false });
    await expectCode(
      grpcClients(fresh.address).queue.enqueue({ queue: "broken", messages: [{}] }),
      Code.DataLoss,
      /cannot be read and will not be overwritten/,
    );
    expect(new TextDecoder().decode((await inner.get("queues/broken/0.json"))?.body)).toBe("{not json");
    const status = await grpcClients(fresh.address).admin.getQueue({ queue: "broken" });
    expect(status.shards[0]?.problem).toMatch(/JSON/);
    void queue;
  });
});
