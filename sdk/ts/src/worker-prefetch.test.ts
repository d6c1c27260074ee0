/**
 * The worker's adaptive prefetch and its batching, against a stub broker (a
 * real HTTP/2 gRPC server, connectNodeAdapter) that has jobs without end: it
 * sends one job per credit at once, and answers every ack and nack.
 *
 * - Handlers that are faster than the broker's deliveries are starved: the
 *   credit window grows past `concurrency`, and never past `maxPrefetch`.
 * - Acks ride together: many receipts per `ack` request.
 * - On stop, buffered jobs that never started go back as releases
 *   (`nack` with `release`), in one request, and every job the broker sent
 *   is acked or released: none is dropped (jobs that arrive after the
 *   worker half-closed its stream go back by the unary Nack).
 */
import { create } from "@bufbuild/protobuf";
import {
  AckOutcome,
  ClaimedMessageSchema,
  MessageSchema,
  NackOutcome,
} from "@casq/api/casq/v1/message_pb.ts";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import type { WorkRequest } from "@casq/api/casq/v1/work_pb.ts";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { afterEach, describe, expect, it } from "vitest";
import { serveOnLoopback } from "../testing/loopback-server.ts";
import { until } from "../testing/until.ts";
import { Worker } from "./worker.ts";

interface StubBroker {
  readonly address: string;
  /** Receipts sent as jobs. */
  readonly sent: string[];
  /** Receipts acked, released (nack with release) and nacked otherwise. */
  readonly acked: string[];
  readonly released: string[];
  readonly nacked: string[];
  /** Receipts per ack request and per release request, in order. */
  readonly ackSizes: number[];
  readonly releaseSizes: number[];
  /** The most jobs the worker had at once: credit granted less receipts settled. */
  readonly peak: () => number;
  close(): Promise<void>;
}

async function startStub(): Promise<StubBroker> {
  const sent: string[] = [];
  const acked: string[] = [];
  const released: string[] = [];
  const nacked: string[] = [];
  const ackSizes: number[] = [];
  const releaseSizes: number[] = [];
  let granted = 0;
  let peak = 0;
  const job = () => {
    const n = sent.length + 1;
    sent.push(`r-${n}`);
    return {
      event: {
        case: "job" as const,
        value: create(ClaimedMessageSchema, {
          message: create(MessageSchema, { id: `job-${n}`, queue: "q", offset: BigInt(n) }),
          receipt: `r-${n}`,
          attempt: 1,
          maxAttempts: 5,
        }),
      },
    };
  };
  const grant = (credits: number) => {
    granted += credits;
    peak = Math.max(peak, granted - acked.length - released.length - nacked.length);
  };
  const handler = connectNodeAdapter({
    routes: (router) =>
      router.service(QueueService, {
        // Jobs that arrive after the worker half-closed its stream are released by unary call.
        async nack(request) {
          if (request.release) released.push(...request.receipts);
          else nacked.push(...request.receipts);
          return {
            results: request.receipts.map((receipt) => ({ receipt, outcome: NackOutcome.RETRY_SCHEDULED })),
          };
        },
        async *work(requests: AsyncIterable<WorkRequest>) {
          for await (const request of requests) {
            const command = request.command;
            if (command.case === "open") {
              yield {
                requestId: request.requestId,
                event: {
                  case: "opened",
                  value: {
                    sessionId: "s-1",
                    brokerId: "stub",
                    queue: "q",
                    leaseTtl: { seconds: 30n },
                    heartbeatInterval: { seconds: 10n },
                    maxCredits: 1000,
                    routing: { servingShards: [0], shards: [] },
                  },
                },
              };
              grant(command.value.credits);
              for (let i = 0; i < command.value.credits; i++) yield job();
            } else if (command.case === "credit") {
              grant(command.value.credits);
              for (let i = 0; i < command.value.credits; i++) yield job();
            } else if (command.case === "ack") {
              acked.push(...command.value.receipts);
              ackSizes.push(command.value.receipts.length);
              yield {
                requestId: request.requestId,
                event: {
                  case: "acked",
                  value: {
                    results: command.value.receipts.map((receipt) => ({
                      receipt,
                      outcome: AckOutcome.ACKED,
                    })),
                  },
                },
              };
            } else if (command.case === "nack") {
              if (command.value.release) {
                released.push(...command.value.receipts);
                releaseSizes.push(command.value.receipts.length);
              } else nacked.push(...command.value.receipts);
              yield {
                requestId: request.requestId,
                event: {
                  case: "nacked",
                  value: {
                    results: command.value.receipts.map((receipt) => ({
                      receipt,
                      outcome: NackOutcome.RETRY_SCHEDULED,
                    })),
                  },
                },
              };
            }
          }
        },
      }),
  });
  const server = await serveOnLoopback(handler);
  return {
    address: server.address,
    sent,
    acked,
    released,
    nacked,
    ackSizes,
    releaseSizes,
    peak: () => peak,
    close: server.close,
  };
}

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function stubAndWorker(): Promise<{ stub: StubBroker; worker: Worker }> {
  const stub = await startStub();
  cleanups.push(() => stub.close());
  return { stub, worker: new Worker({ brokers: [stub.address], workerId: "prefetch-test", logger: null }) };
}

describe("worker prefetch", () => {
  it("grows the prefetch past concurrency while handlers are starved, never past maxPrefetch", async () => {
    const { stub, worker } = await stubAndWorker();
    let handled = 0;
    const done = worker.run(
      "q",
      () => {
        handled += 1;
      },
      { concurrency: 4, maxPrefetch: 64 },
    );
    // Enough rounds for the window to double from 4 to 64 several times over.
    await until("2 000 jobs handled", () => handled >= 2_000);
    await worker.stop({ timeoutMs: 1_000 });
    await done;
    // More than twice the concurrency (an ack and a credit crossing can count one job twice).
    expect(stub.peak()).toBeGreaterThan(8);
    expect(stub.peak()).toBeLessThanOrEqual(64);
    // Acks ride together.
    expect(Math.max(...stub.ackSizes)).toBeGreaterThan(1);
    expect(stub.ackSizes.length).toBeLessThan(stub.acked.length);
    // Nothing lost: every job sent is acked, or released by the stop.
    expect(new Set([...stub.acked, ...stub.released])).toEqual(new Set(stub.sent));
    expect(stub.acked.length + stub.released.length).toBe(stub.sent.length);
  });

  it("keeps a fixed prefetch when one is given", async () => {
    const { stub, worker } = await stubAndWorker();
    let handled = 0;
    const done = worker.run(
      "q",
      () => {
        handled += 1;
      },
      { concurrency: 4, prefetch: 6 },
    );
    await until("1 000 jobs handled", () => handled >= 1_000);
    await worker.stop({ timeoutMs: 1_000 });
    await done;
    expect(stub.peak()).toBe(6);
  });

  it("releases buffered jobs that never started when stopped, in one request, and acks the running one", async () => {
    const { stub, worker } = await stubAndWorker();
    const started: string[] = [];
    let finish = () => {};
    const running = new Promise<void>((resolve) => {
      finish = resolve;
    });
    const done = worker.run(
      "q",
      async (job) => {
        started.push(job.receipt);
        await running;
      },
      { concurrency: 1, prefetch: 8 },
    );
    // One handler runs; seven jobs wait in the buffer.
    await until("eight jobs sent and one started", () => stub.sent.length === 8 && started.length === 1);
    const stopped = worker.stop({ timeoutMs: 10_000 });
    await until("the buffered jobs released", () => stub.released.length === 7);
    finish();
    await stopped;
    await done;
    expect(started).toEqual(["r-1"]);
    expect(stub.acked).toEqual(["r-1"]);
    expect([...stub.released].sort()).toEqual(["r-2", "r-3", "r-4", "r-5", "r-6", "r-7", "r-8"]);
    expect(stub.releaseSizes).toEqual([7]);
    expect(stub.nacked).toEqual([]);
  });
});
