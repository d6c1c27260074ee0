import { describe, expect, it } from "vitest";
import {
  ack,
  claim,
  docJson,
  docText,
  enqueue,
  expectCasqError,
  jsonBytes,
  msg,
  newShard,
  T0,
} from "../../testing/model-test-helpers.ts";
import { applyOperation } from "./apply-operation.ts";
import { SHARD_FORMAT } from "./document-formats.ts";
import type { Operation, Receipt } from "./operations.ts";
import { ShardState, WRITE_HISTORY } from "./shard-state.ts";

/** A shard exercising every part of the format. */
function richShard(): ShardState {
  const s = newShard({ retentionMs: 60_000, maxAttempts: 3 });
  s.recordWrite("w-0000");
  s.recordWrite("w-0001");
  s.broker = { id: "broker-a", address: "10.0.0.1:7070", epoch: 3, leaseUntil: T0 + 30_000 };
  applyOperation(s, { kind: "createSubscription", name: "audit" }, T0);
  enqueue(
    s,
    T0,
    msg("m0", { headers: JSON.parse('{"content-type":"application/json","__proto__":"odd but legal"}') }),
    msg("m1", { key: "k1", priority: 7, dedupId: "d1", traceContext: { traceparent: "00-1-2-01" } }),
    msg("m2", { delayMs: 30_000, maxAttempts: 2 }),
    msg("m3"),
    { id: "m4", payload: new Uint8Array([0, 255, 1, 254]) },
  );
  const claimed = claim(s, T0 + 1, { max: 4, leaseTtlMs: 10_000 });
  const receipt = (id: string) => claimed.find((c) => c.id === id)?.receipt as Receipt;
  ack(s, T0 + 2, [receipt("m3")]); // sparse ack above the floor
  applyOperation(
    s,
    { kind: "nack", subscription: "default", receipts: [receipt("m0")], delayMs: 5000 },
    T0 + 3,
  );
  applyOperation(
    s,
    { kind: "nack", subscription: "default", receipts: [receipt("m4")], deadLetter: true, reason: "poison" },
    T0 + 4,
  );
  applyOperation(s, { kind: "redrive", subscription: "default", ids: ["m4"] }, T0 + 5); // targeted message
  const [a] = claim(s, T0 + 6, { subscription: "audit", max: 1 });
  applyOperation(
    s,
    { kind: "nack", subscription: "audit", receipts: [a?.receipt as Receipt], deadLetter: true },
    T0 + 7,
  );
  return s;
}

const probe: [Operation, number][] = [
  [{ kind: "expire" }, T0 + 20_000],
  [{ kind: "claim", subscription: "default", workerId: "w", max: 10 }, T0 + 40_000],
  [{ kind: "claim", subscription: "audit", workerId: "w", max: 10 }, T0 + 40_000],
  [{ kind: "ack", subscription: "default", receipts: [{ offset: 1, attempt: 1 }] }, T0 + 40_001],
  [{ kind: "enqueue", messages: [msg("m5", { dedupId: "d1" }), msg("m6")] }, T0 + 40_002],
  [{ kind: "expire" }, T0 + 500_000],
  [{ kind: "claim", subscription: "default", workerId: "w", max: 10 }, T0 + 500_001],
];

describe("document codec", () => {
  it("round-trips: decode(encode(s)) encodes to the same bytes and behaves the same", () => {
    const s = richShard();
    const bytes = s.encode();
    const copy = ShardState.decode(bytes);
    expect(Buffer.from(copy.encode()).equals(Buffer.from(bytes))).toBe(true);
    expect(copy.approxBytes()).toBe(s.approxBytes());
    expect(copy.queue).toBe("jobs");
    expect(copy.writeId).toBe("w-0001");
    expect(copy.broker).toEqual(s.broker);
    expect(copy.nextOffset).toBe(s.nextOffset);
    expect(copy.config).toEqual(s.config);
    for (const [op, now] of probe) {
      expect(applyOperation(copy, op, now)).toEqual(applyOperation(s, op, now));
      expect(docText(copy)).toBe(docText(s));
    }
  });

  it("is canonical: equal histories give equal bytes, encode is repeatable", () => {
    expect(docText(richShard())).toBe(docText(richShard()));
    const s = richShard();
    expect(docText(s)).toBe(docText(s));
  });

  it("writes the documented shape", () => {
    const doc = docJson(richShard());
    expect(Object.keys(doc)).toEqual([
      "format",
      "queue",
      "shard",
      "created_at",
      "write_id",
      "recent_write_ids",
      "broker",
      "next_offset",
      "config",
      "counters",
      "subscriptions",
      "dedup",
      "segments",
      "messages",
    ]);
    expect(doc.format).toBe(SHARD_FORMAT);
    expect(doc.write_id).toBe("w-0001");
    expect(doc.recent_write_ids).toEqual(["w-0000"]);
    expect(doc.broker).toEqual({
      id: "broker-a",
      address: "10.0.0.1:7070",
      epoch: 3,
      lease_until: T0 + 30_000,
    });
    const def = doc.subscriptions[1];
    expect(def.name).toBe("default");
    expect(def.acked_below).toBe(0);
    expect(def.acked).toEqual([[3, 3]]);
    expect(doc.messages.find((m: { id: string }) => m.id === "m4").targets).toEqual(["audit", "default"]);
    expect(Object.getOwnPropertyDescriptor(doc.messages[0].headers, "__proto__")?.value).toBe(
      "odd but legal",
    );
    expect(doc.messages.find((m: { id: string }) => m.id === "m4").payload).toBe("AP8B/g==");
  });

  it("clone() is independent", () => {
    const s = richShard();
    const c = s.clone();
    enqueue(c, T0 + 10, msg("only-in-clone"));
    expect(docText(s)).not.toBe(docText(c));
    expect(s.nextOffset).toBe(5);
  });

  it("keeps an empty new shard and its write id / broker null", () => {
    const s = newShard();
    const doc = docJson(s);
    expect(doc.write_id).toBeNull();
    expect(doc.broker).toBeNull();
    expect(docText(ShardState.decode(s.encode()))).toBe(docText(s));
  });

  it("keeps the last WRITE_HISTORY earlier write ids, oldest first, and round-trips them", () => {
    const s = newShard();
    for (let i = 0; i < WRITE_HISTORY + 5; i++) s.recordWrite(`w-${i}`);
    const doc = docJson(s);
    expect(doc.write_id).toBe(`w-${WRITE_HISTORY + 4}`);
    expect(doc.recent_write_ids).toHaveLength(WRITE_HISTORY);
    expect(doc.recent_write_ids[0]).toBe("w-4");
    expect(doc.recent_write_ids.at(-1)).toBe(`w-${WRITE_HISTORY + 3}`);
    expect(ShardState.decode(s.encode()).recentWriteIds).toEqual(doc.recent_write_ids);
  });

  it("reads a document written before recent_write_ids existed, and refuses a malformed one", () => {
    const s = newShard();
    s.recordWrite("w-1");
    const doc = docJson(s);
    delete doc.recent_write_ids;
    const old = ShardState.decode(new TextEncoder().encode(JSON.stringify(doc)));
    expect(old.writeId).toBe("w-1");
    expect(old.recentWriteIds).toEqual([]);
    expectCasqError(
      () => ShardState.decode(new TextEncoder().encode(JSON.stringify({ ...doc, recent_write_ids: [7] }))),
      "data_loss",
    );
  });

  describe("refuses what it cannot fully read (data_loss)", () => {
    const enc = new TextEncoder();
    it.each([
      ["empty", new Uint8Array()],
      ["not JSON", enc.encode("hello")],
      ["invalid UTF-8", new Uint8Array([0x7b, 0xff, 0xfe, 0x7d])],
      ["null", enc.encode("null")],
      ["an array", enc.encode("[]")],
      ["a foreign object", enc.encode('{"hello":"world"}')],
    ])("%s", (_name, bytes) => {
      expectCasqError(() => ShardState.decode(bytes), "data_loss");
    });

    it("a truncated document, at any cut", () => {
      const bytes = richShard().encode();
      for (const cut of [1, 10, bytes.length / 3, bytes.length / 2, bytes.length - 1]) {
        expectCasqError(() => ShardState.decode(bytes.slice(0, Math.floor(cut))), "data_loss");
      }
    });

    it("an unknown (newer) format version, saying so", () => {
      const doc = docJson(richShard());
      doc.format = "casq.shard.v3";
      const message = expectCasqError(() => ShardState.decode(jsonBytes(doc)), "data_loss");
      expect(message).toContain("newer casq");
      expect(message).toContain("refusing to touch it");
    });

    type Mutation = [string, (doc: ReturnType<typeof docJson>) => void];
    const mutations: Mutation[] = [
      ["shard as string", (d) => (d.shard = "0")],
      ["negative next_offset", (d) => (d.next_offset = -1)],
      ["unknown top-level field", (d) => (d.extra = 1)],
      ["missing messages", (d) => delete d.messages],
      ["bad queue name", (d) => (d.queue = "Bad Queue")],
      ["payload not base64", (d) => (d.messages[0].payload = "%%%")],
      ["payload a number", (d) => (d.messages[0].payload = 5)],
      ["non-canonical base64", (d) => (d.messages[0].payload = "AB==")],
      ["base64 without padding", (d) => (d.messages[0].payload = "AP8")],
      ["URL-safe base64", (d) => (d.messages[0].payload = "AP8B_g==")],
      ["base64 with a space", (d) => (d.messages[0].payload = "AP8B /g==")],
      ["base64 with a newline", (d) => (d.messages[0].payload = "AP8B\n/g==")],
      ["base64 padding inside", (d) => (d.messages[0].payload = "AA==AAAA")],
      ["message id empty", (d) => (d.messages[0].id = "")],
      ["priority out of range", (d) => (d.messages[0].priority = 5000)],
      ["run_at before enqueued_at", (d) => (d.messages[0].run_at = 1)],
      ["header value not a string", (d) => (d.messages[0].headers = { a: 1 })],
      ["unknown message field", (d) => (d.messages[0].colour = "red")],
      ["offsets not ascending", (d) => d.messages.reverse()],
      ["duplicate message id", (d) => (d.messages[1].id = d.messages[0].id)],
      ["offset beyond next_offset", (d) => (d.next_offset = 2)],
      ["config out of range", (d) => (d.config.lease_ttl_ms = 0)],
      ["config missing field", (d) => delete d.config.backoff.jitter],
      ["counter negative", (d) => (d.counters.acked = -1)],
      ["counter fractional", (d) => (d.subscriptions[0].counters.acked = 0.5)],
      ["acked not numbers", (d) => (d.subscriptions[1].acked = ["x"])],
      ["acked below the floor", (d) => (d.subscriptions[1].acked_below = 4)],
      ["duplicate subscription", (d) => d.subscriptions.push(d.subscriptions[0])],
      ["delivery of an unknown offset", (d) => (d.subscriptions[1].deliveries[0].offset = 99)],
      [
        "lease without attempts",
        (d) => (d.subscriptions[1].deliveries.find((x: { lease?: unknown }) => x.lease).attempts = 0),
      ],
      [
        "lease worker missing",
        (d) => delete d.subscriptions[1].deliveries.find((x: { lease?: unknown }) => x.lease).lease.worker,
      ],
      [
        "targets an unknown subscription",
        (d) => (d.messages.find((m: { targets?: string[] }) => m.targets).targets = ["ghost"]),
      ],
      [
        "dead letter of an unsettled message",
        (d) => d.subscriptions[1].dead_letters.push(d.subscriptions[0].dead_letters[0]),
      ],
      ["dedup names a future offset", (d) => (d.dedup[0].offset = 1000)],
      ["write_id a number", (d) => (d.write_id = 7)],
      ["broker epoch a string", (d) => (d.broker.epoch = "3")],
      ["an empty index_segments list (omitted when empty)", (d) => (d.index_segments = [])],
      [
        "an index segment that is not loaded",
        (d) =>
          (d.index_segments = [
            {
              name: `${"0".repeat(20)}-1-a.index.json`,
              first: 0,
              last: 0,
              count: 1,
              bytes: 10,
              sha256: "0".repeat(64),
              created_at: 1,
            },
          ]),
      ],
    ];
    it.each(mutations)("%s", (_name, mutate) => {
      const doc = docJson(richShard());
      mutate(doc);
      const message = expectCasqError(() => ShardState.decode(jsonBytes(doc)), "data_loss");
      expect(message).toMatch(/refusing/);
    });
  });
});
