import { describe, expect, it } from "vitest";
import { RequestQueue } from "./request-queue.ts";

describe("RequestQueue", () => {
  it("yields pushed items in order, waits for more, and ends after the queued ones", async () => {
    const queue = new RequestQueue<number>();
    queue.push(1);
    const seen: number[] = [];
    const consumer = (async () => {
      for await (const item of queue) seen.push(item);
    })();
    await new Promise((r) => setTimeout(r, 5));
    queue.push(2);
    queue.push(3);
    queue.end();
    queue.push(4); // ignored after end
    await consumer;
    expect(seen).toEqual([1, 2, 3]);
  });
});
