import { describe, expect, it } from "vitest";
import { seededRandom } from "../util/random.ts";
import { DedupChunk, dedupHash } from "./dedup-chunk.ts";
import { SealedDedup } from "./sealed-dedup.ts";
import type { DedupEntry } from "./shard-records.ts";

/** Two dedup ids with the same 32-bit hash (found by search). */
const COLLIDING = ["job-439599", "job-622382"] as const;

const entry = (dedupId: string, offset: number, expiresAt: number, id = `m${offset}`): DedupEntry => ({
  dedupId,
  id,
  offset,
  expiresAt,
});

describe("DedupChunk", () => {
  it("holds its entries as they were given, whatever their characters", () => {
    const entries = [
      entry("a", 0, 5),
      entry("", 1, 9, "id-é"),
      entry("dédup-✓-🙂", 2, 7),
      entry("01J9Z-uuid-0f9e", 3, 7),
    ];
    const chunk = DedupChunk.from(entries);
    expect(chunk.length).toBe(4);
    expect(chunk.entries()).toEqual(entries);
    expect(chunk.maxExpiresAt).toBe(9);
    expect(chunk.hasDedupId(2, "dédup-✓-🙂")).toBe(true);
    expect(chunk.hasDedupId(2, "dédup-✓-")).toBe(false);
    expect(chunk.hasDedupId(1, "")).toBe(true);
    expect(chunk.hasDedupId(0, "")).toBe(false);
    expect(chunk.hashAt(2)).toBe(dedupHash("dédup-✓-🙂"));
    // expiry order: (expiresAt, dedup id)
    expect([0, 1, 2, 3].map((k) => chunk.byExpiry(k))).toEqual([0, 3, 2, 1]);
    expect(DedupChunk.from(chunk)).toBe(chunk);
  });

  it("the colliding test ids do collide", () => {
    expect(dedupHash(COLLIDING[0])).toBe(dedupHash(COLLIDING[1]));
  });
});

describe("SealedDedup", () => {
  it("a hash collision is never taken for the other id", () => {
    const index = new SealedDedup();
    const no = index.addChunk(DedupChunk.from([entry(COLLIDING[0], 0, 100, "m0")]));
    index.put(no, 0);
    expect(index.get(COLLIDING[1])).toBeUndefined();
    expect(index.delete(COLLIDING[1])).toBe(false);
    const no2 = index.addChunk(DedupChunk.from([entry(COLLIDING[1], 1, 100, "m1")]));
    index.put(no2, 0);
    expect(index.get(COLLIDING[0])?.id).toBe("m0");
    expect(index.get(COLLIDING[1])?.id).toBe("m1");
    expect(index.delete(COLLIDING[0])).toBe(true);
    expect(index.get(COLLIDING[0])).toBeUndefined();
    expect(index.get(COLLIDING[1])?.id).toBe("m1");
    expect(index.size).toBe(1);
  });

  it("answers exactly as a map of the ids would, through inserts, replacements, deletes and expiries", () => {
    for (let seed = 1; seed <= 20; seed++) {
      const random = seededRandom(seed);
      const pick = (n: number) => Math.floor(random.next() * n);
      const index = new SealedDedup();
      const model = new Map<string, DedupEntry>();
      // Few distinct ids (so replacements and probe-run deletions are common), colliding ones among them.
      const ids = [...COLLIDING, ...Array.from({ length: 60 }, (_, i) => `d${i}`)];
      let offset = 0;
      let now = 0;
      for (let step = 0; step < 400; step++) {
        const action = pick(10);
        if (action < 5) {
          // a chunk of fresh entries (distinct ids), as a seal would add: each replaces its id's entry
          const chosen = [
            ...new Set(Array.from({ length: 1 + pick(8) }, () => ids[pick(ids.length)] as string)),
          ];
          const entries = chosen.map((d) => entry(d, offset++, now + 1 + pick(50)));
          const no = index.addChunk(DedupChunk.from(entries));
          entries.forEach((e, pos) => {
            index.delete(e.dedupId);
            index.put(no, pos);
            model.set(e.dedupId, e);
          });
        } else if (action < 7) {
          const d = ids[pick(ids.length)] as string;
          expect(index.delete(d)).toBe(model.delete(d));
        } else {
          now += pick(20);
          let due = 0;
          for (const [d, e] of model)
            if (e.expiresAt <= now) {
              model.delete(d);
              due += 1;
            }
          expect(index.expire(now)).toBe(due);
          const next = index.nextExpiry();
          if (next !== undefined) expect(next).toBeGreaterThan(now);
        }
        expect(index.size).toBe(model.size);
        const wrong = ids.filter((d) => JSON.stringify(index.get(d)) !== JSON.stringify(model.get(d)));
        expect(wrong).toEqual([]);
      }
      const values = [...index.values()].sort((a, b) => a.offset - b.offset);
      expect(values).toEqual([...model.values()].sort((a, b) => a.offset - b.offset));
      // everything expires in the end, and then no chunk is held
      index.expire(Number.MAX_SAFE_INTEGER);
      expect(index.size).toBe(0);
      expect(index.chunks).toBe(0);
    }
  });

  it("grows past its initial table and still finds every id", () => {
    const index = new SealedDedup();
    const entries = Array.from({ length: 5_000 }, (_, i) => entry(`id-${i}`, i, 10 + (i % 7)));
    const no = index.addChunk(DedupChunk.from(entries));
    for (let i = 0; i < entries.length; i++) index.put(no, i);
    expect(index.size).toBe(5_000);
    for (const e of entries) expect(index.get(e.dedupId)).toEqual(e);
    expect(index.get("id-5000")).toBeUndefined();
    expect(index.expire(12)).toBe(entries.filter((e) => e.expiresAt <= 12).length);
    for (const e of entries) expect(index.get(e.dedupId)).toEqual(e.expiresAt <= 12 ? undefined : e);
  });
});
