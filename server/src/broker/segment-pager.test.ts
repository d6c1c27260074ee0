import { describe, expect, it } from "vitest";
import { segmentPrefix } from "../model/segment-codec.ts";
import type { SegmentState } from "../model/shard-records.ts";
import { MemoryStore } from "../store/memory-store.ts";
import { SegmentBodyCache } from "./segment-body-cache.ts";
import { SegmentPager } from "./segment-pager.ts";

const KIB = 1024;
const PREFIX = segmentPrefix("jobs", 0);

/**
 * A chain of `count` sealed segments of 10 KiB each, the first `cached` of
 * them cached (all of the read-ahead window, so read-ahead plans no read).
 */
function chainOf(count: number, cache: SegmentBodyCache, cached = count, kib = 10) {
  const segments: SegmentState[] = Array.from({ length: count }, (_, i) => ({
    name: `seg-${i}`,
    first: i * 10,
    last: i * 10 + 9,
    count: 10,
    bytes: kib * KIB,
    sha256: "0".repeat(64),
    createdAt: 0,
    priorities: [0, 0],
    runAt: [0, 0],
    gone: new Set<number>(),
    records: [],
    cold: false,
    liveSummary: undefined,
    json: undefined,
    index: undefined,
  }));
  for (const seg of segments.slice(0, cached)) cache.put(PREFIX + seg.name, [], seg.bytes);
  const next = (seg: SegmentState) => segments[segments.indexOf(seg) + 1];
  return { segments, next };
}

/** Whether a segment written after this read-ahead is cached. */
function cachesWritten(pager: SegmentPager, cache: SegmentBodyCache, name: string): boolean {
  pager.offerWritten(name, [], KIB);
  return cache.has(PREFIX + name);
}

describe("segment pager: caching what it has just written", () => {
  // A budget of 400 KiB: a read-ahead window of 100 KiB (10 segments). At most 30 segments are
  // cached, leaving room for more.
  const setup = (count: number, cached = Math.min(count, 30), kib = 10) => {
    const cache = new SegmentBodyCache(400 * KIB);
    const pager = new SegmentPager({
      store: new MemoryStore(),
      queue: "jobs",
      shard: 0,
      cache,
      headMoved: async () => false,
    });
    return { cache, pager, ...chainOf(count, cache, cached, kib) };
  };

  it("caches it when a subscription's window reaches the newest segment", () => {
    const { cache, pager, segments, next } = setup(6);
    pager.readAhead([segments[0] as SegmentState], next);
    expect(cachesWritten(pager, cache, "w1")).toBe(true);
  });

  it("caches it behind a backlog deeper than the window that fits in the cache's budget", () => {
    // 30 segments of 10 KiB: three windows deep, within the budget of 400 KiB.
    const { cache, pager, segments, next } = setup(30);
    pager.readAhead([segments[0] as SegmentState], next);
    expect(cachesWritten(pager, cache, "w1")).toBe(true);
  });

  it("does not cache it behind a backlog deeper than the cache's budget", () => {
    const { cache, pager, segments, next } = setup(50);
    pager.readAhead([segments[0] as SegmentState, segments[5] as SegmentState], next);
    expect(cachesWritten(pager, cache, "w1")).toBe(false);
  });

  it("judges a backlog of many small segments deeper than the budget after 128 past the window", () => {
    // Segments of 1 KiB: the window holds 100 of them, the budget 400.
    const within = setup(228, 228, 1);
    within.pager.readAhead([within.segments[0] as SegmentState], within.next);
    expect(cachesWritten(within.pager, within.cache, "w1")).toBe(true);
    const beyond = setup(229, 229, 1);
    beyond.pager.readAhead([beyond.segments[0] as SegmentState], beyond.next);
    expect(cachesWritten(beyond.pager, beyond.cache, "w1")).toBe(false);
  });

  it("does not cache it when the budget is full, even when the backlog would fit", () => {
    // 39 segments of 10 KiB cached (390 KiB): one of 11 KiB more would pass the budget of 400 KiB.
    const { cache, pager, segments, next } = setup(39, 39);
    pager.readAhead([segments[0] as SegmentState], next);
    pager.offerWritten("w1", [], 11 * KIB);
    expect(cache.has(`${PREFIX}w1`)).toBe(false);
  });

  it("caches it when another subscription is caught up (its next claim is in the head's tail)", () => {
    const { cache, pager, segments, next } = setup(50);
    pager.readAhead([segments[0] as SegmentState], next, true);
    expect(cachesWritten(pager, cache, "w1")).toBe(true);
  });

  it("judges a front inside an earlier front's window by its own reach", () => {
    // The first front's window ends at segment 9; the second starts inside it (segment 8 of 16) and reaches the newest.
    const { cache, pager, segments, next } = setup(16);
    pager.readAhead([segments[0] as SegmentState, segments[8] as SegmentState], next);
    expect(cachesWritten(pager, cache, "w1")).toBe(true);
    // ... and the same fronts the other way round.
    const other = setup(16);
    other.pager.readAhead([other.segments[8] as SegmentState, other.segments[0] as SegmentState], other.next);
    expect(cachesWritten(other.pager, other.cache, "w1")).toBe(true);
  });
});
