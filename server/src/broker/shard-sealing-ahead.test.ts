/**
 * Segments written ahead: once a head write lands with the tail at its
 * budget, the tail's messages are written into a segment in the background,
 * and the first commit after that write indexes it. Commits meanwhile do not
 * wait for it (a commit costs one head write even when it seals), unless the
 * tail reaches twice the budget.
 */
import { describe, expect, it } from "vitest";
import { flush } from "../../testing/broker-test-support.ts";
import { ManualClock } from "../../testing/manual-clock.ts";
import { MemoryStore } from "../store/memory-store.ts";
import type { CallOptions, PutCondition, PutResult } from "../store/object-store.ts";
import { seededRandom } from "../util/random.ts";
import { expectKind } from "./broker.ts";
import { ShardLeader } from "./shard-leader.ts";

const HEAD = "queues/jobs/0.json";
const SEG = "queues/jobs/0/seg/";
const TAIL_BYTES = 4096;
const body = (i: number) => new TextEncoder().encode(`job-${i}-${"x".repeat(200)}`);

/** A memory store that holds every segment PUT while `holding` (heads go through). */
class SegmentGate extends MemoryStore {
  holding = true;
  private held: (() => void)[] = [];

  get heldPuts(): number {
    return this.held.length;
  }

  release(): void {
    this.holding = false;
    for (const go of this.held.splice(0)) go();
  }

  override async put(
    key: string,
    body: Uint8Array,
    condition: PutCondition,
    options?: CallOptions,
  ): Promise<PutResult> {
    if (key.startsWith(SEG) && this.holding) await new Promise<void>((resolve) => this.held.push(resolve));
    return super.put(key, body, condition, options);
  }
}

function leader(store: MemoryStore) {
  return new ShardLeader({
    store,
    queue: "jobs",
    shard: 0,
    identity: { id: "broker-a", address: "a:50051" },
    clock: new ManualClock(),
    random: seededRandom(1),
    options: { tailBytes: TAIL_BYTES },
  });
}

let next = 0;
function enqueue(shard: ShardLeader, count: number) {
  const messages = Array.from({ length: count }, () => {
    const i = next++;
    return { id: `m${i}`, payload: body(i) };
  });
  return shard.submit({ kind: "enqueue", messages });
}

/** Enqueues one message a commit until the tail reaches its budget and a segment write starts; returns how many. */
async function fillTail(shard: ShardLeader, store: SegmentGate): Promise<number> {
  let n = 0;
  while (store.heldPuts === 0) {
    await enqueue(shard, 1);
    n += 1;
  }
  return n;
}

async function head(store: MemoryStore) {
  const stored = await store.get(HEAD);
  if (!stored) throw new Error("no head");
  return JSON.parse(new TextDecoder().decode(stored.body)) as {
    segments: { name: string; first: number; last: number; count: number; gone: number[][] }[];
    messages: { offset: number }[];
  };
}

describe("segments written ahead of the head", () => {
  it("commits go on while the segment of a full tail is written; the first commit after it indexes it", async () => {
    next = 0;
    const store = new SegmentGate();
    const a = leader(store);
    const n = await fillTail(a, store);
    // The segment write is held, and commits still land (they would wait for it if sealing were inline).
    await enqueue(a, 1);
    await enqueue(a, 1);
    expect((await head(store)).segments).toEqual([]);
    expect((await head(store)).messages).toHaveLength(n + 2);
    store.release();
    await flush();
    await enqueue(a, 1);
    const doc = await head(store);
    expect(doc.segments).toHaveLength(1);
    const [seg] = doc.segments;
    expect(seg).toMatchObject({ first: 0, last: n - 1, count: n, gone: [] });
    // Every message exactly once: the segment's, the rest still in the tail.
    expect(doc.messages.map((m) => m.offset)).toEqual([n, n + 1, n + 2]);
    expect((await store.list(SEG)).map((e) => e.key)).toEqual([SEG + seg?.name]);
    await a.stop({ release: true });
  });

  it("messages that left the tail while their segment was written are gone in it from the start", async () => {
    next = 0;
    const store = new SegmentGate();
    const a = leader(store);
    const n = await fillTail(a, store);
    // The five oldest are claimed and acked (retention 0: they leave the shard) meanwhile.
    const claim = expectKind(
      await a.submit({ kind: "claim", subscription: "default", workerId: "w", max: 5 }),
      "claim",
    );
    await a.submit({ kind: "ack", subscription: "default", receipts: claim.messages.map((m) => m.receipt) });
    store.release();
    await flush();
    await enqueue(a, 1);
    const doc = await head(store);
    expect(doc.segments).toHaveLength(1);
    expect(doc.segments[0]).toMatchObject({ first: 0, last: n - 1, count: n, gone: [[0, 4]] });
    // A new leader reads it back and serves exactly the 15 left and the new one, in order.
    await a.stop({ release: true });
    const b = leader(store);
    const ids: string[] = [];
    for (;;) {
      const got = expectKind(
        await b.submit({ kind: "claim", subscription: "default", workerId: "w", max: 50 }),
        "claim",
      );
      if (got.messages.length === 0) break;
      ids.push(...got.messages.map((m) => m.id));
      await b.submit({ kind: "ack", subscription: "default", receipts: got.messages.map((m) => m.receipt) });
    }
    expect(ids).toEqual(Array.from({ length: n - 4 }, (_, i) => `m${i + 5}`));
    await b.stop({ release: true });
  });

  it("a commit that would take the tail past twice the budget waits for the segment being written", async () => {
    next = 0;
    const store = new SegmentGate();
    const a = leader(store);
    const n = await fillTail(a, store);
    let landed = false;
    // This one takes the tail past twice the budget.
    const waiting = enqueue(a, n + 1).then(() => {
      landed = true;
    });
    await flush();
    expect(landed).toBe(false);
    expect(store.heldPuts).toBe(1);
    store.release();
    await waiting;
    const doc = await head(store);
    expect(doc.segments[0]).toMatchObject({ first: 0, last: n - 1, count: n });
    await a.stop({ release: true });
  });
});
