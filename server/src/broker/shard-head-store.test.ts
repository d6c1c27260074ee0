/**
 * The head store's commit loop, driven directly (the shard leader's tests
 * cover it through the leader): what a commit whose apply throws leaves,
 * and when the writes ahead a commit makes due start.
 */
import { describe, expect, it } from "vitest";
import { ManualClock } from "../../testing/manual-clock.ts";
import { applyOperation } from "../model/apply-operation.ts";
import { ShardState } from "../model/shard-state.ts";
import { MemoryStore } from "../store/memory-store.ts";
import type { CallOptions, PutCondition } from "../store/object-store.ts";
import { seededRandom } from "../util/random.ts";
import { ShardHeadStore } from "./shard-head-store.ts";
import { DEFAULT_COMMIT_OPTIONS } from "./shard-leader.ts";

const HEAD = "queues/jobs/0.json";

function enqueueOf(id: string, payload = new Uint8Array([1])) {
  return (working: ShardState, now: number) => ({
    value: applyOperation(working, { kind: "enqueue", messages: [{ id, payload }] }, now),
    changed: true,
  });
}

/** A memory store that counts the segment objects put. */
class SegmentCounter extends MemoryStore {
  segmentPuts = 0;
  override put(key: string, body: Uint8Array, condition: PutCondition, options?: CallOptions) {
    if (key.startsWith("queues/jobs/0/seg/")) this.segmentPuts += 1;
    return super.put(key, body, condition, options);
  }
}

/** Shard 0 of queue `jobs`, led by broker-a. */
const SHARD = { queue: "jobs", shard: 0, identity: { id: "broker-a", address: "a:50051" } };

function headStore(store: MemoryStore, tailBytes = DEFAULT_COMMIT_OPTIONS.tailBytes): ShardHeadStore {
  const options = { ...DEFAULT_COMMIT_OPTIONS, tailBytes };
  return new ShardHeadStore({ store, ...SHARD, clock: new ManualClock(), random: seededRandom(1), options });
}

describe("ShardHeadStore.commit", () => {
  it("rebuilds the committed state when an apply throws after changing it, so the next commit does not write that", async () => {
    const memory = new MemoryStore();
    const head = headStore(memory);
    expect((await head.commit(enqueueOf("a"), { release: false })).kind).toBe("written");
    const buggy = (working: ShardState, now: number) => {
      enqueueOf("half-applied")(working, now);
      throw new Error("a bug in apply");
    };
    await expect(head.commit(buggy, { release: false })).rejects.toThrow("a bug in apply");
    expect((await head.commit(enqueueOf("c"), { release: false })).kind).toBe("written");
    const stored = await memory.get(HEAD);
    if (stored === undefined) throw new Error("no head");
    expect(
      ShardState.decode(stored.body)
        .sortedMessages()
        .map((m) => m.msg.id),
    ).toEqual(["a", "c"]);
  });

  it("starts the writes ahead a landed commit made due when asked, and a release starts none, not even those", async () => {
    const full = new Uint8Array(5000); // past the tail budget below, not twice it: a segment is due, not sealed inline
    const memory = new SegmentCounter();
    const head = headStore(memory, 4096);
    expect((await head.commit(enqueueOf("a", full), { release: false })).kind).toBe("written");
    expect(memory.segmentPuts).toBe(0); // not inline with the commit
    head.writeAhead();
    expect(memory.segmentPuts).toBe(1);
    head.writeAhead(); // once per commit
    expect(memory.segmentPuts).toBe(1);

    const released = new SegmentCounter();
    const releasing = headStore(released, 4096);
    expect((await releasing.commit(enqueueOf("a", full), { release: false })).kind).toBe("written");
    expect((await releasing.commit(enqueueOf("b"), { release: true })).kind).toBe("written");
    releasing.writeAhead();
    expect(released.segmentPuts).toBe(0); // the next leader seals
  });
});
