/**
 * The small scenario whose `encode()` output is the annotated example in
 * `docs/document-format.md`. A test checks that the document in the docs is
 * exactly what this produces, so the docs cannot drift from the code.
 *
 * Regenerate the example with:
 *   npx tsx -e 'import("./server/testing/document-example.ts").then(m => console.log(m.exampleDocumentJson()))'
 */
import { applyOperation } from "../src/model/apply-operation.ts";
import type { Receipt } from "../src/model/operations.ts";
import { ShardState } from "../src/model/shard-state.ts";

/** 2026-01-01T00:00:00Z. */
const T = 1_767_225_600_000;

/** Builds the example shard: two subscriptions, acks, a nack, a lease, a dead letter, a redrive, dedup. */
export function buildExampleShard(): ShardState {
  const enc = new TextEncoder();
  const s = ShardState.create({ queue: "emails", shard: 0, now: T, config: { maxAttempts: 3 } });
  applyOperation(s, { kind: "createSubscription", name: "analytics" }, T + 1_000);
  applyOperation(
    s,
    {
      kind: "enqueue",
      messages: [
        {
          id: "msg-0001",
          payload: enc.encode('{"to":"ada@example.com"}'),
          headers: { "content-type": "application/json" },
          key: "customer-42",
          dedupId: "order-1001",
          traceContext: { traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" },
        },
        { id: "msg-0002", payload: enc.encode("urgent"), priority: 10 },
        { id: "msg-0003", payload: enc.encode("later"), delayMs: 3_600_000 },
        { id: "msg-0004", payload: enc.encode("bad"), maxAttempts: 1 },
        { id: "msg-0005", payload: enc.encode("plain") },
      ],
    },
    T + 2_000,
  );
  // A worker on "default" takes four messages: msg-0002 (priority 10) first, then by offset.
  const claimed = applyOperation(
    s,
    { kind: "claim", subscription: "default", workerId: "worker-a", max: 4, leaseTtlMs: 30_000 },
    T + 3_000,
  ).messages;
  const receipt = (id: string) => claimed.find((c) => c.id === id)?.receipt as Receipt;
  // msg-0002 and msg-0005 are done. msg-0001 is still leased, so "acked_below" stays at 0 and
  // msg-0005 (still owed to "analytics", hence retained) is listed in "acked".
  applyOperation(
    s,
    { kind: "ack", subscription: "default", receipts: [receipt("msg-0002"), receipt("msg-0005")] },
    T + 4_000,
  );
  // msg-0004 fails on its only attempt: dead-lettered. The operator fixes the cause and redrives it:
  // it gets "targets" (default, plus analytics which still owes it) and "attempts_at_redrive".
  applyOperation(
    s,
    { kind: "nack", subscription: "default", receipts: [receipt("msg-0004")], reason: "template not found" },
    T + 5_000,
  );
  applyOperation(s, { kind: "redrive", subscription: "default" }, T + 6_000);
  // "analytics" takes msg-0002 and msg-0001. It dead-letters msg-0002, which leaves "messages"
  // (everyone is done with it) but lives on, payload included, in the dead letter; msg-0001 is
  // nacked and retried after the backoff ("available_at").
  const [a2, a1] = applyOperation(
    s,
    { kind: "claim", subscription: "analytics", workerId: "worker-b", max: 2 },
    T + 7_000,
  ).messages;
  applyOperation(
    s,
    {
      kind: "nack",
      subscription: "analytics",
      receipts: [a2?.receipt as Receipt],
      deadLetter: true,
      reason: "unsupported event",
    },
    T + 8_000,
  );
  applyOperation(
    s,
    { kind: "nack", subscription: "analytics", receipts: [a1?.receipt as Receipt] },
    T + 8_000,
  );
  // The leading broker stamps the document before writing it.
  s.broker = { id: "broker-7f3a", address: "10.0.0.12:7070", epoch: 2, leaseUntil: T + 38_000 };
  s.recordWrite("broker-7f3a:2:000041");
  s.recordWrite("broker-7f3a:2:000042");
  return s;
}

/** The example document, pretty-printed (2 spaces) for the docs. */
export function exampleDocumentJson(): string {
  return JSON.stringify(JSON.parse(new TextDecoder().decode(buildExampleShard().encode())), null, 2);
}
