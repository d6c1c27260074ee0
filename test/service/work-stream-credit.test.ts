/**
 * The Work stream's claims use the credit the stream holds when the claim is
 * applied: credit granted while the claim waits for the write in flight rides
 * in that same claim (one write), not in the next one.
 */
import { Code } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import type {
  CallOptions,
  ObjectStore,
  PutCondition,
  PutResult,
} from "../../server/src/store/object-store.ts";
import { UnavailableError } from "../../server/src/store/store-errors.ts";
import { bytes, eventually, grpcClients, openWork, useTestServers } from "./support.ts";

const server = useTestServers();

type Head = { subscriptions: { name: string; deliveries: { lease?: { worker: string } }[] }[] };

/** A memory store that records the heads of one queue it writes and can hold their PUTs. */
class HeldHeads {
  readonly memory = new MemoryStore();
  readonly heads: Head[] = [];
  hold = false;
  /** The held PUTs fail (store unavailable) when released. */
  failHeld = false;
  private waiting: (() => void)[] = [];
  readonly store: ObjectStore;

  constructor(headKey: string) {
    const memory = this.memory;
    this.store = Object.assign(Object.create(memory) as MemoryStore, {
      put: async (
        key: string,
        body: Uint8Array,
        condition: PutCondition,
        options?: CallOptions,
      ): Promise<PutResult> => {
        if (key === headKey) {
          if (this.hold) {
            await new Promise<void>((resolve) => this.waiting.push(resolve));
            if (this.failHeld) throw new UnavailableError(key, "failed by the test");
          }
          this.heads.push(JSON.parse(new TextDecoder().decode(body)) as Head);
        }
        return memory.put(key, body, condition, options);
      },
    });
  }

  get held(): number {
    return this.waiting.length;
  }

  release(): void {
    this.hold = false;
    for (const go of this.waiting.splice(0)) go();
  }
}

function leasesOf(head: Head, worker: string): number {
  const sub = head.subscriptions.find((s) => s.name === "default");
  return sub?.deliveries.filter((d) => d.lease?.worker === worker).length ?? 0;
}

describe("Work stream credit", () => {
  it("claims credit granted while its claim waits for the write in flight in that same claim", async () => {
    const held = new HeldHeads("queues/credit/0.json");
    const s = await server({ store: held.store });
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "credit" });
    await clients.queue.enqueue({
      queue: "credit",
      messages: Array.from({ length: 10 }, (_, i) => ({ payload: bytes(`m${i}`) })),
    });

    const { requests, responses, reading } = await openWork(clients, { queue: "credit", credits: 0 });

    // A write in flight, held by the store.
    held.hold = true;
    const enqueueing = clients.queue.enqueue({ queue: "credit", messages: [{ payload: bytes("late") }] });
    await eventually(() => held.held === 1);
    const leader = s.broker.leader("credit", 0);
    // Credit 2: the stream's claim waits behind the write in flight ...
    requests.push({ command: { case: "credit", value: { credits: 2 } } });
    await eventually(() => leader.pendingCount === 1);
    // ... and 3 more arrive meanwhile (an empty heartbeat answered shows they were read).
    requests.push({ command: { case: "credit", value: { credits: 3 } } });
    requests.push({ requestId: 7n, command: { case: "heartbeat", value: { receipts: [] } } });
    await eventually(() => responses.some((r) => r.requestId === 7n));
    expect(held.held).toBe(1);

    held.release();
    await enqueueing;
    await eventually(() => responses.filter((r) => r.event.case === "job").length === 5);
    // The first head with this worker's leases holds all five: one claim, one write.
    const firstWithLeases = held.heads.find((head) => leasesOf(head, "worker-1") > 0);
    expect(firstWithLeases && leasesOf(firstWithLeases, "worker-1")).toBe(5);

    requests.end();
    await reading;
  });

  it("claims again when the credit a failed write took comes back, though it had stopped for want of credit", async () => {
    // Simulation seed 91001413: a write that would have handed this stream jobs failed after
    // the stream, finding its credit taken, had stopped claiming; the credit came back but
    // nothing woke the stream, and its worker got no job for ever.
    const held = new HeldHeads("queues/parked/0.json");
    const s = await server({ store: held.store });
    const clients = grpcClients(s.address);
    await clients.admin.createQueue({ queue: "parked" });

    const { requests, responses, reading } = await openWork(clients, { queue: "parked", credits: 2 });

    // The write of two jobs, which also fills the stream's standing claim (taking its credit), hangs ...
    held.hold = true;
    held.failHeld = true;
    const failing = clients.queue.enqueue({
      queue: "parked",
      messages: [{ payload: bytes("a") }, { payload: bytes("b") }],
    });
    await eventually(() => held.held === 1);
    // ... past the stream's 5 s re-probe, which finds no credit left: the stream stops claiming ...
    await new Promise((resolve) => setTimeout(resolve, 5_500));
    // ... and then fails: the jobs were not stored, the credit comes back.
    held.release();
    await expect(failing).rejects.toMatchObject({ code: Code.Unavailable });
    held.failHeld = false;

    await clients.queue.enqueue({
      queue: "parked",
      messages: [{ payload: bytes("c") }, { payload: bytes("d") }],
    });
    // Within a moment (a stream that stopped for want of credit looks again only every 5 s on its own).
    await eventually(() => responses.filter((r) => r.event.case === "job").length === 2, 2_500);
    requests.end();
    await reading;
  }, 20_000);
});
