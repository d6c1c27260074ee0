/**
 * The head store's commit loop, driven directly (the shard leader's tests
 * cover it through the leader): what a commit whose apply throws leaves.
 */
import { describe, expect, it } from "vitest";
import { ManualClock } from "../../testing/manual-clock.ts";
import { applyOperation } from "../model/apply-operation.ts";
import { ShardState } from "../model/shard-state.ts";
import { MemoryStore } from "../store/memory-store.ts";
import { seededRandom } from "../util/random.ts";
import { ShardHeadStore } from "./shard-head-store.ts";
import { DEFAULT_COMMIT_OPTIONS } from "./shard-leader.ts";

const HEAD = "queues/jobs/0.json";

function enqueueOf(id: string) {
  return (working: ShardState, now: number) => ({
    value: applyOperation(
      working,
      { kind: "enqueue", messages: [{ id, payload: new Uint8Array([1]) }] },
      now,
    ),
    changed: true,
  });
}

describe("ShardHeadStore.commit", () => {
  it("rebuilds the committed state when an apply throws after changing it, so the next commit does not write that", async () => {
    const memory = new MemoryStore();
    const head = new ShardHeadStore({
      store: memory,
      queue: "jobs",
      shard: 0,
      identity: { id: "broker-a", address: "a:50051" },
      clock: new ManualClock(),
      random: seededRandom(1),
      options: DEFAULT_COMMIT_OPTIONS,
    });
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
});
