/**
 * SIGTERM while a Work stream that never reads holds ~900 leased jobs (issue
 * 10, item 9): the broker hands those leases back (as a nack with release:
 * no attempt is consumed) and exits without waiting out its shutdown
 * timeout. A second broker on the same store can claim every job again right
 * away: with a 10-minute lease, that is only possible if the leases were
 * released; and with max attempts 1, an expired lease (a counted attempt)
 * would have dead-lettered them instead.
 */
import http2 from "node:http2";
import { create, toBinary } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { WorkRequestSchema } from "@casq/api/casq/v1/work_pb.ts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eventually, grpcClients } from "../service/support.ts";
import { type CasqServerProcess, startServer, tempDir } from "./support/processes.ts";

const JOBS = 900;
const LEASE_MS = 600_000;

let store: { path: string; remove: () => void };
const servers: CasqServerProcess[] = [];

beforeAll(() => {
  store = tempDir("shutdown-leases");
});

afterAll(async () => {
  await Promise.all(servers.map((s) => s.stop("SIGKILL")));
  store?.remove();
});

/** Opens a Work stream over raw HTTP/2 and never reads its responses. */
function openNonReadingWorkStream(address: string): http2.ClientHttp2Session {
  const session = http2.connect(`http://${address}`);
  session.on("error", () => {});
  const stream = session.request({
    ":method": "POST",
    ":path": "/casq.v1.QueueService/Work",
    "content-type": "application/grpc",
    te: "trailers",
  });
  stream.on("error", () => {});
  stream.pause(); // never read: the flow-control window fills and the broker's writes stall
  const open = toBinary(
    WorkRequestSchema,
    create(WorkRequestSchema, {
      requestId: 1n,
      command: {
        case: "open",
        value: { queue: "q", workerId: "stuck-worker", credits: JOBS, leaseTtl: durationFromMs(LEASE_MS) },
      },
    }),
  );
  const frame = Buffer.alloc(5 + open.length);
  frame.writeUInt32BE(open.length, 1);
  frame.set(open, 5);
  stream.write(frame); // the request side stays open
  return session;
}

describe("graceful shutdown with a Work stream that does not read", () => {
  it("releases the stream's leases and exits; another broker claims every job at once, no attempt counted", async () => {
    const first = await startServer({ store: `file:${store.path}`, args: ["--shutdown-timeout", "10m"] });
    servers.push(first);
    const a = grpcClients(first.address);
    await a.admin.createQueue({ queue: "q", config: { maxAttempts: 1 } });
    const payload = new Uint8Array(1024).fill(97);
    for (let i = 0; i < JOBS; i += 100)
      await a.queue.enqueue({ queue: "q", messages: Array.from({ length: 100 }, () => ({ payload })) });

    const session = openNonReadingWorkStream(first.address);
    await eventually(async () => {
      const stats = await a.admin.getQueue({ queue: "q" });
      return stats.totals?.inFlight === BigInt(JOBS);
    }, 30_000);

    // With a 10-minute shutdown timeout, an exit before the harness's SIGKILL (60 s) is a prompt one.
    const exit = await first.stop("SIGTERM", 60_000);
    session.destroy();
    expect(exit, first.output()).toEqual({ code: 0, signal: null });

    const second = await startServer({ store: `file:${store.path}` });
    servers.push(second);
    const b = grpcClients(second.address);
    const stats = await b.admin.getQueue({ queue: "q" });
    expect(stats.totals?.inFlight).toBe(0n);
    expect(stats.totals?.ready).toBe(BigInt(JOBS));
    expect(stats.totals?.dead).toBe(0n);
    const claimed = await b.queue.claim({ queue: "q", workerId: "w2", maxMessages: 1000 });
    expect(claimed.messages.length).toBe(JOBS);
    // The second delivery of each, allowed by max attempts 1 because a release does not count
    // (the delivery's max_attempts is raised by each release).
    expect(new Set(claimed.messages.map((m) => `${m.attempt}/${m.maxAttempts}`))).toEqual(new Set(["2/2"]));
    await second.stop("SIGTERM");
  }, 180_000);
});
