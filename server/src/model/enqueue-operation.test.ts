import { describe, expect, it } from "vitest";
import {
  claim,
  docJson,
  enqueue,
  expectRejected,
  expire,
  ids,
  msg,
  newShard,
  T0,
  text,
} from "../../testing/model-test-helpers.ts";
import { applyOperation } from "./apply-operation.ts";

describe("enqueue", () => {
  it("assigns consecutive offsets and stores every field", () => {
    const s = newShard();
    const results = enqueue(
      s,
      T0,
      msg("a", {
        headers: { b: "2", a: "1" },
        key: "user-1",
        priority: 5,
        maxAttempts: 2,
        dedupId: "d-a",
        traceContext: { traceparent: "00-abc-def-01" },
      }),
      msg("b"),
    );
    expect(results).toEqual([
      { id: "a", offset: 0, duplicate: false },
      { id: "b", offset: 1, duplicate: false },
    ]);
    expect(s.nextOffset).toBe(2);
    const [first] = claim(s, T0, { max: 1 });
    expect(first).toMatchObject({
      id: "a",
      offset: 0,
      key: "user-1",
      priority: 5,
      runAt: T0,
      enqueuedAt: T0,
      dedupId: "d-a",
      subscription: "default",
      receipt: { offset: 0, attempt: 1 },
      attempt: 1,
      maxAttempts: 2,
      leaseDeadline: T0 + 60_000,
    });
    expect({ ...first?.headers }).toEqual({ a: "1", b: "2" });
    expect({ ...first?.traceContext }).toEqual({ traceparent: "00-abc-def-01" });
    expect(text(first?.payload as Uint8Array)).toBe("payload of a");
  });

  it("copies the payload (later changes by the caller do not leak in)", () => {
    const s = newShard();
    const payload = new Uint8Array([1, 2, 3]);
    enqueue(s, T0, { id: "a", payload });
    payload[0] = 99;
    expect([...(claim(s, T0)[0]?.payload ?? [])]).toEqual([1, 2, 3]);
  });

  it("resolves delayMs and runAt; a past runAt is runnable now", () => {
    const s = newShard();
    enqueue(
      s,
      T0,
      msg("later", { delayMs: 5000 }),
      msg("at", { runAt: T0 + 1000 }),
      msg("past", { runAt: T0 - 1 }),
    );
    expect(ids(claim(s, T0))).toEqual(["past"]);
    expect(ids(claim(s, T0 + 1000))).toEqual(["at"]);
    expect(ids(claim(s, T0 + 4999))).toEqual([]);
    expect(ids(claim(s, T0 + 5000))).toEqual(["later"]);
  });

  describe("deduplication", () => {
    it("returns the original for a dedup id seen within the window, and enqueues nothing", () => {
      const s = newShard();
      enqueue(s, T0, msg("a", { dedupId: "order-1" }));
      const before = docJson(s);
      const r = applyOperation(
        s,
        { kind: "enqueue", messages: [msg("b", { dedupId: "order-1" })] },
        T0 + 1000,
      );
      expect(r.results).toEqual([{ id: "a", offset: 0, duplicate: true }]);
      expect(r.changed).toBe(false);
      expect(docJson(s)).toEqual(before);
      expect(s.nextOffset).toBe(1);
    });

    it("dedups within one batch too", () => {
      const s = newShard();
      const r = enqueue(s, T0, msg("a", { dedupId: "x" }), msg("b", { dedupId: "x" }), msg("c"));
      expect(r).toEqual([
        { id: "a", offset: 0, duplicate: false },
        { id: "a", offset: 0, duplicate: true },
        { id: "c", offset: 1, duplicate: false },
      ]);
    });

    it("still finds the original after it was acked and dropped", () => {
      const s = newShard();
      enqueue(s, T0, msg("a", { dedupId: "x" }));
      const [c] = claim(s, T0);
      applyOperation(s, { kind: "ack", subscription: "default", receipts: [c?.receipt as never] }, T0);
      expect(docJson(s).messages).toEqual([]);
      expect(enqueue(s, T0 + 1, msg("b", { dedupId: "x" }))).toEqual([
        { id: "a", offset: 0, duplicate: true },
      ]);
    });

    it("accepts the dedup id again once the window passed (swept or not)", () => {
      const s = newShard({ dedupWindowMs: 10_000 });
      enqueue(s, T0, msg("a", { dedupId: "x" }));
      expect(enqueue(s, T0 + 10_000, msg("b", { dedupId: "x" }))).toEqual([
        { id: "b", offset: 1, duplicate: false },
      ]);
      expect(enqueue(s, T0 + 15_000, msg("c", { dedupId: "x" }))[0]?.duplicate).toBe(true);
      expect(expire(s, T0 + 20_000).dedupPruned).toBe(1);
      expect(docJson(s).dedup).toEqual([]);
      expect(enqueue(s, T0 + 20_000, msg("d", { dedupId: "x" }))[0]).toEqual({
        id: "d",
        offset: 2,
        duplicate: false,
      });
    });

    it("is off when the window is 0", () => {
      const s = newShard({ dedupWindowMs: 0 });
      expect(
        enqueue(s, T0, msg("a", { dedupId: "x" }), msg("b", { dedupId: "x" })).map((r) => r.duplicate),
      ).toEqual([false, false]);
      expect(docJson(s).dedup).toEqual([]);
    });
  });

  it("fans out to every subscription", () => {
    const s = newShard();
    applyOperation(s, { kind: "createSubscription", name: "audit" }, T0);
    enqueue(s, T0, msg("a"));
    expect(ids(claim(s, T0))).toEqual(["a"]);
    expect(ids(claim(s, T0, { subscription: "audit" }))).toEqual(["a"]);
  });

  it("refuses an enqueue when no subscription and no retention would keep the message", () => {
    const s = newShard();
    applyOperation(s, { kind: "deleteSubscription", name: "default" }, T0);
    const m = expectRejected(s, { kind: "enqueue", messages: [msg("a")] }, T0, "failed_precondition");
    expect(m).toContain("create a subscription");
    expect(s.nextOffset).toBe(0);
  });

  it("keeps messages by retention when the queue has no subscription", () => {
    const s = newShard({ retentionMs: 60_000 });
    applyOperation(s, { kind: "deleteSubscription", name: "default" }, T0);
    expect(enqueue(s, T0, msg("a"))).toEqual([{ id: "a", offset: 0, duplicate: false }]);
    expect(docJson(s).messages.map((x: { id: string }) => x.id)).toEqual(["a"]);
  });

  describe("rejections leave the state unchanged", () => {
    const big = (n: number) => ({ id: `big-${n}`, payload: new Uint8Array(n) });

    it("empty batch", () => {
      expectRejected(newShard(), { kind: "enqueue", messages: [] }, T0, "invalid_argument");
    });

    it("batch above max_batch", () => {
      const s = newShard({ maxBatch: 2 });
      const m = expectRejected(
        s,
        { kind: "enqueue", messages: [msg("a"), msg("b"), msg("c")] },
        T0,
        "resource_exhausted",
      );
      expect(m).toContain("max_batch");
    });

    it("payload above max_payload_bytes (the whole batch)", () => {
      const s = newShard({ maxPayloadBytes: 100 });
      enqueue(s, T0, msg("first"));
      const m = expectRejected(
        s,
        { kind: "enqueue", messages: [msg("ok"), big(101)] },
        T0,
        "resource_exhausted",
      );
      expect(m).toContain("100");
      expect(m).toContain("max_payload_bytes");
    });

    it("too many or too large headers", () => {
      const s = newShard({ maxHeaders: 1, maxHeaderBytes: 10 });
      expectRejected(
        s,
        { kind: "enqueue", messages: [msg("a", { headers: { a: "1", b: "2" } })] },
        T0,
        "resource_exhausted",
      );
      expectRejected(
        s,
        { kind: "enqueue", messages: [msg("a", { headers: { a: "12345678901" } })] },
        T0,
        "resource_exhausted",
      );
    });

    it.each([
      [{ priority: 1001 }],
      [{ priority: 1.5 }],
      [{ maxAttempts: 0 }],
      [{ delayMs: -1 }],
      [{ delayMs: 10, runAt: T0 }],
      [{ runAt: Number.NaN }],
      [{ dedupId: "" }],
      [{ key: 5 as unknown as string }],
      [{ headers: { a: 1 as unknown as string } }],
      [{ headers: { "": "x" } }],
      [{ traceContext: { traceparent: "x".repeat(5000) } }],
    ])("invalid field %j", (extra) => {
      const s = newShard();
      enqueue(s, T0, msg("first"));
      expectRejected(
        s,
        { kind: "enqueue", messages: [msg("ok"), msg("bad", extra)] },
        T0,
        "invalid_argument",
      );
    });

    it("missing id or payload", () => {
      const s = newShard();
      expectRejected(
        s,
        { kind: "enqueue", messages: [{ id: "", payload: new Uint8Array() }] },
        T0,
        "invalid_argument",
      );
      expectRejected(
        s,
        { kind: "enqueue", messages: [{ id: "x", payload: "no" as never }] },
        T0,
        "invalid_argument",
      );
    });

    it("an id already used by a retained message, or twice in the batch", () => {
      const s = newShard();
      enqueue(s, T0, msg("a"));
      expectRejected(s, { kind: "enqueue", messages: [msg("b"), msg("a")] }, T0, "already_exists");
      expectRejected(s, { kind: "enqueue", messages: [msg("c"), msg("c")] }, T0, "already_exists");
    });

    it("a full document, while claims and acks keep working", () => {
      const s = newShard({ maxDocumentBytes: 64 * 1024, maxPayloadBytes: 32 * 1024 });
      enqueue(s, T0, big(20_000));
      enqueue(s, T0, { id: "big2", payload: new Uint8Array(20_000) });
      const m = expectRejected(s, { kind: "enqueue", messages: [big(20_001)] }, T0, "resource_exhausted");
      expect(m).toContain("queue shard is full");
      expect(m).toContain("max_document_bytes");
      const claimed = claim(s, T0);
      expect(claimed.length).toBe(2);
      applyOperation(
        s,
        { kind: "ack", subscription: "default", receipts: claimed.map((c) => c.receipt) },
        T0,
      );
      expect(enqueue(s, T0, big(20_001))[0]?.duplicate).toBe(false);
    });
  });
});
