/**
 * Jobs in batches on the Work stream: a worker that opens with
 * `batched_jobs` gets the jobs of one claim together in `jobs` messages (at
 * most 1,000 jobs, and no more once the payloads reach 1 MiB); a worker that
 * does not gets every job in a `job` message of its own, as before.
 */
import type { ClaimedMessage } from "@casq/api/casq/v1/message_pb.ts";
import type { WorkResponse } from "@casq/api/casq/v1/work_pb.ts";
import { describe, expect, it } from "vitest";
import type { Delivery } from "../../server/src/broker/shard-claims.ts";
import type { ClaimedMessage as ModelClaimedMessage } from "../../server/src/model/operations.ts";
import {
  jobBatches,
  MAX_JOB_BATCH_PAYLOAD_BYTES,
  MAX_JOBS_PER_MESSAGE,
} from "../../server/src/service/work-stream.ts";
import { bytes, eventually, grpcClients, openWork, text, useTestServers } from "./support.ts";

const server = useTestServers();

/** Every job the responses carry, in order, and the size of each message that carried them. */
function jobsIn(responses: readonly WorkResponse[]): {
  jobs: ClaimedMessage[];
  sizes: number[];
  singles: number;
} {
  const jobs: ClaimedMessage[] = [];
  const sizes: number[] = [];
  let singles = 0;
  for (const r of responses) {
    if (r.event.case === "job") {
      jobs.push(r.event.value);
      singles += 1;
    } else if (r.event.case === "jobs") {
      jobs.push(...r.event.value.jobs);
      sizes.push(r.event.value.jobs.length);
    }
  }
  return { jobs, sizes, singles };
}

describe("Work stream jobs in batches", () => {
  it("sends the jobs of one claim together to a worker that asked, in order, one credit each", async () => {
    const s = await server();
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "batched" });
    await clients.queue.enqueue({
      queue: "batched",
      messages: Array.from({ length: 100 }, (_, i) => ({ payload: bytes(`m${i}`) })),
    });

    const { requests, responses, reading } = await openWork(clients, {
      queue: "batched",
      credits: 100,
      batchedJobs: true,
    });
    await eventually(() => jobsIn(responses).jobs.length === 100);
    const { jobs, sizes, singles } = jobsIn(responses);
    expect(singles).toBe(0);
    expect(sizes).toEqual([100]);
    expect(jobs.map((j) => text(j.message?.payload))).toEqual(Array.from({ length: 100 }, (_, i) => `m${i}`));
    expect(new Set(jobs.map((j) => j.receipt)).size).toBe(100);

    // The credit is used up: a new job waits for more, then comes alone.
    await clients.queue.enqueue({ queue: "batched", messages: [{ payload: bytes("late") }] });
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(jobsIn(responses).jobs).toHaveLength(100);
    requests.push({ command: { case: "credit", value: { credits: 1 } } });
    await eventually(() => jobsIn(responses).jobs.length === 101);
    expect(jobsIn(responses).singles).toBe(1);

    // Every receipt settles as delivered.
    requests.push({
      requestId: 2n,
      command: { case: "ack", value: { receipts: jobsIn(responses).jobs.map((j) => j.receipt) } },
    });
    await eventually(() => responses.some((r) => r.requestId === 2n));
    const acked = responses.find((r) => r.requestId === 2n)?.event;
    expect(acked?.case).toBe("acked");
    if (acked?.case === "acked") expect(acked.value.results.every((r) => r.outcome === 1)).toBe(true);
    requests.end();
    await reading;
  });

  it("sends every job in a message of its own to a worker that did not ask", async () => {
    const s = await server();
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "single" });
    await clients.queue.enqueue({
      queue: "single",
      messages: Array.from({ length: 20 }, (_, i) => ({ payload: bytes(`m${i}`) })),
    });
    const { requests, responses, reading } = await openWork(clients, { queue: "single", credits: 20 });
    await eventually(() => jobsIn(responses).jobs.length === 20);
    const { jobs, sizes, singles } = jobsIn(responses);
    expect(sizes).toEqual([]);
    expect(singles).toBe(20);
    expect(jobs.map((j) => text(j.message?.payload))).toEqual(Array.from({ length: 20 }, (_, i) => `m${i}`));
    requests.end();
    await reading;
  });

  it("starts a new message before the payloads pass 1 MiB", async () => {
    const s = await server();
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "large" });
    for (let i = 0; i < 5; i++)
      await clients.queue.enqueue({
        queue: "large",
        messages: [{ payload: new Uint8Array(400 * 1024).fill(i) }],
      });
    const { requests, responses, reading } = await openWork(clients, {
      queue: "large",
      credits: 5,
      batchedJobs: true,
    });
    await eventually(() => jobsIn(responses).jobs.length === 5);
    const { jobs, sizes, singles } = jobsIn(responses);
    expect(sizes).toEqual([2, 2, 1]);
    expect(singles).toBe(0);
    expect(jobs.map((j) => j.message?.payload[0])).toEqual([0, 1, 2, 3, 4]);
    requests.end();
    await reading;
  });
});

describe("jobBatches", () => {
  const delivery = (offset: number, size: number): Delivery => ({
    shard: 0,
    message: { offset, payload: new Uint8Array(size) } as unknown as ModelClaimedMessage,
  });
  const offsets = (batches: Delivery[][]) =>
    batches.map((b) => b.map((d) => (d.message as unknown as { offset: number }).offset));

  it("cuts at the job count and keeps the order", () => {
    const deliveries = Array.from({ length: MAX_JOBS_PER_MESSAGE * 2 + 1 }, (_, i) => delivery(i, 10));
    const batches = jobBatches(deliveries);
    expect(batches.map((b) => b.length)).toEqual([MAX_JOBS_PER_MESSAGE, MAX_JOBS_PER_MESSAGE, 1]);
    expect(offsets(batches).flat()).toEqual(deliveries.map((_, i) => i));
  });

  it("cuts before the payloads pass the byte limit, and sends a bigger job alone", () => {
    const half = MAX_JOB_BATCH_PAYLOAD_BYTES / 2;
    const batches = jobBatches([
      delivery(0, half),
      delivery(1, half),
      delivery(2, 1),
      delivery(3, MAX_JOB_BATCH_PAYLOAD_BYTES + 1),
      delivery(4, 1),
      delivery(5, 0),
    ]);
    expect(offsets(batches)).toEqual([[0, 1], [2], [3], [4, 5]]);
    expect(jobBatches([])).toEqual([]);
  });
});
