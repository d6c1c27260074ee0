/**
 * Real `casq serve` processes on an S3 store, once per S3 server kind the
 * tests run against (the gofakes3 fake and VersityGW): enqueue, claim over
 * gRPC and ack, with the shard document really in the bucket; then the leader
 * is killed with SIGKILL and a second broker on the same bucket takes the
 * shard over once the leader lease has run out, with a higher epoch,
 * keeping every acknowledged enqueue, never redelivering the acked message,
 * and redelivering the one whose lease the dead broker's worker held.
 */
import { ListObjectsV2Command } from "@aws-sdk/client-s3";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, describe, expect, it } from "vitest";
import { bytes, grpcClients, text } from "../service/support.ts";
import { openS3Endpoint, S3_SERVER_KINDS, type S3Endpoint } from "../support/s3-endpoints.ts";
import { testS3Client } from "../support/s3-server.ts";
import { type CasqServerProcess, startServer, waitFor } from "./support/processes.ts";

const servers: CasqServerProcess[] = [];
const endpoints: S3Endpoint[] = [];

afterAll(async () => {
  await Promise.all(servers.map((s) => s.stop("SIGKILL")));
  await Promise.all(endpoints.map((e) => e.close()));
});

/** Keys in the endpoint's bucket. */
async function bucketKeys(s3: S3Endpoint): Promise<string[]> {
  const client = testS3Client(s3.endpoint);
  try {
    const listed = await client.send(new ListObjectsV2Command({ Bucket: s3.bucket }));
    return (listed.Contents ?? []).map((o) => o.Key ?? "");
  } finally {
    client.destroy();
  }
}

describe.each(S3_SERVER_KINDS)("casq serve on S3 (%s)", (kind) => {
  it("serves enqueue, claim and ack, and a second broker takes over after SIGKILL of the leader", async () => {
    const s3 = await openS3Endpoint(kind);
    endpoints.push(s3);
    const args = ["--leader-lease", "1s"];
    const [first, second] = await Promise.all([
      startServer({ store: s3.storeUrl("e2e"), env: s3.env, args }),
      startServer({ store: s3.storeUrl("e2e"), env: s3.env, args }),
    ]);
    if (!first || !second) throw new Error("brokers did not start");
    servers.push(first, second);
    const a = grpcClients(first.address);
    const b = grpcClients(second.address);

    await a.admin.createQueue({ queue: "orders" });
    const enqueued = await a.queue.enqueue({
      queue: "orders",
      messages: ["acked", "leased", "waiting"].map((p) => ({ payload: bytes(p) })),
    });
    expect(enqueued.messages).toHaveLength(3);
    // The state is in the bucket, under the URL's prefix.
    expect(await bucketKeys(s3)).toEqual(
      expect.arrayContaining(["e2e/queues/orders/queue.json", "e2e/queues/orders/0.json"]),
    );

    const claimed = await a.queue.claim({
      queue: "orders",
      workerId: "w1",
      maxMessages: 2,
      leaseTtl: { seconds: 1n },
    });
    expect(claimed.messages.map((m) => text(m.message?.payload))).toEqual(["acked", "leased"]);
    const ack = await a.queue.ack({ queue: "orders", receipts: [claimed.messages[0]?.receipt ?? ""] });
    expect(ack.results).toHaveLength(1);
    const before = await a.admin.getQueue({ queue: "orders" });
    const epochBefore = Number(before.shards[0]?.leader?.epoch ?? 0);
    expect(before.shards[0]?.leader?.address).toBe(first.address);

    await first.stop("SIGKILL");

    // Until the lease runs out the survivor redirects to the dead leader; then it takes over.
    await waitFor("the survivor to accept an enqueue", async () => {
      try {
        await b.queue.enqueue({ queue: "orders", messages: [{ payload: bytes("after the kill") }] });
        return true;
      } catch (error) {
        const code = ConnectError.from(error).code;
        if (code !== Code.Unavailable && code !== Code.FailedPrecondition) throw error;
        return false;
      }
    });
    const after = await b.admin.getQueue({ queue: "orders" });
    expect(after.shards[0]?.leader?.address).toBe(second.address);
    expect(Number(after.shards[0]?.leader?.epoch)).toBeGreaterThan(epochBefore);

    // Everything not acked is delivered by the new leader: the leased one again (attempt 2, once
    // its lease ran out), the waiting one and the new one; the acked one never again.
    const delivered = new Map<string, number>();
    await waitFor("the new leader to deliver every unacked message", async () => {
      const got = await b.queue.claim({ queue: "orders", workerId: "w2", maxMessages: 10 });
      for (const m of got.messages) delivered.set(text(m.message?.payload), m.attempt);
      if (got.messages.length > 0)
        await b.queue.ack({ queue: "orders", receipts: got.messages.map((m) => m.receipt) });
      return delivered.size >= 3;
    });
    expect(Object.fromEntries(delivered)).toEqual({ leased: 2, waiting: 1, "after the kill": 1 });
    const final = await b.admin.getQueue({ queue: "orders" });
    expect(Number(final.totals?.depth ?? -1)).toBe(0);
    expect(Number(final.totals?.inFlight ?? -1)).toBe(0);
  });
});
