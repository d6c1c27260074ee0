import { describe, expect, it } from "vitest";
import { AsyncQueue } from "./async-queue.ts";

async function drain<T>(queue: AsyncQueue<T>): Promise<T[]> {
  const seen: T[] = [];
  for await (const item of queue) seen.push(item);
  return seen;
}

describe("AsyncQueue", () => {
  it("yields what was pushed before and while iterating, in push order, then ends", async () => {
    const queue = new AsyncQueue<number>();
    queue.push(1);
    queue.push(2);
    const done = drain(queue);
    await Promise.resolve();
    queue.push(3);
    setImmediate(() => {
      queue.push(4);
      queue.end();
    });
    expect(await done).toEqual([1, 2, 3, 4]);
  });

  it("fails after the items already pushed, and ignores everything once closed", async () => {
    const queue = new AsyncQueue<string>();
    queue.push("a");
    expect(queue.closed).toBe(false);
    queue.fail(new Error("broken"));
    expect(queue.closed).toBe(true);
    queue.push("late");
    queue.end();
    queue.fail(new Error("second"));
    const seen: string[] = [];
    await expect(
      (async () => {
        for await (const item of queue) seen.push(item);
      })(),
    ).rejects.toThrow("broken");
    expect(seen).toEqual(["a"]);
  });

  it("ends a waiting consumer, and end is idempotent", async () => {
    const queue = new AsyncQueue<number>();
    const done = drain(queue);
    await Promise.resolve();
    queue.end();
    queue.end();
    expect(await done).toEqual([]);
    expect(queue.closed).toBe(true);
  });

  it("keeps falsy and undefined items", async () => {
    const queue = new AsyncQueue<number | undefined | null>();
    for (const item of [0, undefined, null, 5]) queue.push(item);
    queue.end();
    expect(await drain(queue)).toEqual([0, undefined, null, 5]);
  });
});
