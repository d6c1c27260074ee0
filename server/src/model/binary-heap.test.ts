import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { BinaryHeap } from "./binary-heap.ts";

describe("BinaryHeap", () => {
  it("pops in order", () => {
    const heap = new BinaryHeap<number>((a, b) => a < b);
    for (const n of [5, 3, 8, 1, 9, 2, 2]) heap.push(n);
    expect(heap.size).toBe(7);
    expect(heap.peek()).toBe(1);
    const out: number[] = [];
    for (let n = heap.pop(); n !== undefined; n = heap.pop()) out.push(n);
    expect(out).toEqual([1, 2, 2, 3, 5, 8, 9]);
    expect(heap.pop()).toBeUndefined();
    expect(heap.peek()).toBeUndefined();
  });

  it("sorts any input like Array.sort (property)", () => {
    fc.assert(
      fc.property(fc.array(fc.integer()), fc.array(fc.integer()), (first, second) => {
        const heap = new BinaryHeap<number>((a, b) => a < b);
        const popped: number[] = [];
        for (const n of first) heap.push(n);
        for (let i = 0; i < first.length / 2; i++) popped.push(heap.pop() as number);
        for (const n of second) heap.push(n);
        expect(heap.toArray().length).toBe(heap.size);
        const rest: number[] = [];
        for (let n = heap.pop(); n !== undefined; n = heap.pop()) rest.push(n);
        expect(rest).toEqual([...rest].sort((a, b) => a - b));
        expect([...popped, ...rest].sort((a, b) => a - b)).toEqual(
          [...first, ...second].sort((a, b) => a - b),
        );
      }),
    );
  });

  it("clears", () => {
    const heap = new BinaryHeap<number>((a, b) => a < b);
    heap.push(1);
    heap.clear();
    expect(heap.size).toBe(0);
  });

  it("retain keeps exactly the entries asked for, still in heap order", () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: -1000, max: 1000 }), { maxLength: 300 }), (items) => {
        const heap = new BinaryHeap<number>((a, b) => a < b);
        for (const n of items) heap.push(n);
        heap.retain((n) => n % 3 !== 0);
        const out: number[] = [];
        for (let n = heap.pop(); n !== undefined; n = heap.pop()) out.push(n);
        expect(out).toEqual(items.filter((n) => n % 3 !== 0).sort((a, b) => a - b));
      }),
    );
  });
});
