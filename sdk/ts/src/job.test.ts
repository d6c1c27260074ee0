/** The Job a handler gets, built from a delivery as the broker sends it. */
import { create } from "@bufbuild/protobuf";
import { ClaimedMessageSchema } from "@casq/api/casq/v1/message_pb.ts";
import { describe, expect, it } from "vitest";
import { type Job, jobFromClaim } from "./job.ts";

const claimed = create(ClaimedMessageSchema, {
  message: {
    id: "01JXAMPLE",
    queue: "emails",
    shard: 3,
    offset: 42n,
    payload: new TextEncoder().encode('{"to":"ann@example.com"}'),
    headers: { source: "signup" },
    key: "ann",
    priority: 2,
    enqueuedAt: { seconds: 1_700_000_000n, nanos: 500_000_000 },
    dedupId: "signup-ann",
    traceContext: {
      traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
      tracestate: "a=1",
    },
  },
  subscription: "mailer",
  attempt: 2,
  maxAttempts: 5,
  receipt: "receipt-1",
  leaseDeadline: { seconds: 1_700_000_030n, nanos: 0 },
});

describe("jobFromClaim", () => {
  it("carries every field of the delivery", () => {
    const job = jobFromClaim(claimed, () => new AbortController().signal);
    expect({
      id: job.id,
      queue: job.queue,
      subscription: job.subscription,
      shard: job.shard,
      offset: job.offset,
      headers: job.headers,
      key: job.key,
      priority: job.priority,
      attempt: job.attempt,
      maxAttempts: job.maxAttempts,
      receipt: job.receipt,
      traceContext: job.traceContext,
      enqueuedAt: job.enqueuedAt?.toISOString(),
      dedupId: job.dedupId,
      leaseDeadline: job.leaseDeadline?.toISOString(),
    }).toEqual({
      id: "01JXAMPLE",
      queue: "emails",
      subscription: "mailer",
      shard: 3,
      offset: 42n,
      headers: { source: "signup" },
      key: "ann",
      priority: 2,
      attempt: 2,
      maxAttempts: 5,
      receipt: "receipt-1",
      traceContext: {
        traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        tracestate: "a=1",
      },
      enqueuedAt: "2023-11-14T22:13:20.500Z",
      dedupId: "signup-ann",
      leaseDeadline: "2023-11-14T22:13:50.000Z",
    });
    expect(job.text()).toBe('{"to":"ann@example.com"}');
    expect(job.json<{ to: string }>().to).toBe("ann@example.com");
    expect(job.headers).not.toBe(claimed.message?.headers); // the handler's copy
  });

  it("can be taken apart in a handler's parameters, methods and signal included", () => {
    const controller = new AbortController();
    const handler = ({ text, json, signal, id }: Job) => [text(), json<{ to: string }>().to, signal, id];
    expect(handler(jobFromClaim(claimed, () => controller.signal))).toEqual([
      '{"to":"ann@example.com"}',
      "ann@example.com",
      controller.signal,
      "01JXAMPLE",
    ]);
  });

  it("asks for the signal each time it is read", () => {
    let reads = 0;
    const controller = new AbortController();
    const job = jobFromClaim(claimed, () => {
      reads++;
      return controller.signal;
    });
    expect(reads).toBe(0);
    expect(job.signal).toBe(controller.signal);
    expect(job.signal).toBe(controller.signal);
    expect(reads).toBe(2);
  });

  it("gives defaults for a delivery without a message body's optional parts", () => {
    const bare = create(ClaimedMessageSchema, {
      message: { id: "x", queue: "q" },
      attempt: 1,
      maxAttempts: 1,
    });
    const job = jobFromClaim(bare, () => new AbortController().signal);
    expect([job.key, job.dedupId, job.traceContext, job.enqueuedAt, job.leaseDeadline, job.text()]).toEqual([
      "",
      "",
      undefined,
      undefined,
      undefined,
      "",
    ]);
  });
});
