import { describe, expect, it } from "vitest";
import { seededRandom } from "../util/random.ts";
import { DedupChunk, DedupIdsPagedOut, dedupHash, dedupPrint } from "./dedup-chunk.ts";
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

  it("packs canonical UUIDs and broker message ids, and gives back exactly what it was given", () => {
    const uuids = [
      "00000000-0000-0000-0000-000000000000",
      "ffffffff-ffff-ffff-ffff-ffffffffffff",
      "6b4896d6-b191-407b-8821-d38e4eca180a",
    ];
    const ids = ["00000000000000000000000000", "ZZZZZZZZZZZZZZZZZZZZZZZZZZ", "01M8TWVAYQH46VX0ABCDEFGHJK"];
    const entries = uuids.map((u, i) => entry(u, 2 ** 40 + i, 1.7e12 + 1_000 * (2 - i), ids[i]));
    const chunk = DedupChunk.from(entries);
    expect(chunk.packed).toBe(true);
    expect(chunk.entries()).toEqual(entries);
    for (let i = 0; i < entries.length; i++) {
      const e = entries[i] as DedupEntry;
      expect(chunk.hashAt(i)).toBe(dedupHash(e.dedupId));
      expect(chunk.hasDedupId(i, e.dedupId)).toBe(true);
      // not the same id: another case, no hyphens, one digit off
      expect(chunk.hasDedupId(i, e.dedupId.toUpperCase())).toBe(e.dedupId === e.dedupId.toUpperCase());
      expect(chunk.hasDedupId(i, e.dedupId.replaceAll("-", ""))).toBe(false);
      expect(chunk.hasDedupId(i, `${e.dedupId.slice(0, 35)}${e.dedupId.endsWith("1") ? "2" : "1"}`)).toBe(
        false,
      );
    }
    expect([0, 1, 2].map((k) => chunk.byExpiry(k))).toEqual([2, 1, 0]);
    // one id of another shape, or numbers beyond 32-bit differences: the plain layout, same answers
    const mixed = [...entries, entry("6B4896D6-B191-407B-8821-D38E4ECA180A", 2 ** 40 + 3, 1.7e12, ids[0])];
    expect(DedupChunk.from(mixed).packed).toBe(false);
    expect(DedupChunk.from(mixed).entries()).toEqual(mixed);
    const wide = [entry(uuids[0] as string, 0, 1), entry(uuids[1] as string, 2 ** 33, 2 ** 52, ids[1])];
    expect(DedupChunk.from(wide).entries()).toEqual(wide);
    const mid = [entry(uuids[0] as string, 5, 7), entry(uuids[1] as string, 70_005, 100_007, ids[1])]; // 32-bit differences
    expect(DedupChunk.from(mid).entries()).toEqual(mid);
  });

  it("the colliding test ids do collide, in the first hash only", () => {
    expect(dedupHash(COLLIDING[0])).toBe(dedupHash(COLLIDING[1]));
    expect(dedupPrint(COLLIDING[0])).not.toBe(dedupPrint(COLLIDING[1]));
    const chunk = DedupChunk.from([entry(COLLIDING[0], 0, 1), entry(COLLIDING[1], 1, 1)]);
    expect([chunk.printAt(0), chunk.printAt(1)]).toEqual(COLLIDING.map(dedupPrint));
  });
});

describe("SealedDedup", () => {
  it("a hash collision is never taken for the other id", () => {
    const index = new SealedDedup();
    const no = index.addChunk(DedupChunk.from([entry(COLLIDING[0], 0, 100, "m0")]), "a");
    index.put(no, 0);
    expect(index.get(COLLIDING[1])).toBeUndefined();
    const no2 = index.addChunk(DedupChunk.from([entry(COLLIDING[1], 1, 100, "m1")]), "b");
    index.put(no2, 0);
    expect(index.get(COLLIDING[0])?.id).toBe("m0");
    expect(index.get(COLLIDING[1])?.id).toBe("m1");
    expect(index.size).toBe(2);
  });

  it("answers the newest entry of an id indexed twice, and the older one expires on its own", () => {
    const index = new SealedDedup();
    const old = index.addChunk(DedupChunk.from([entry("d", 0, 10, "m0")]), "old");
    index.put(old, 0);
    const fresh = index.addChunk(DedupChunk.from([entry("d", 5, 30, "m5")]), "new");
    index.put(fresh, 0);
    expect(index.get("d")).toEqual(entry("d", 5, 30, "m5"));
    expect(index.size).toBe(2);
    expect(index.expire(10)).toBe(1);
    expect(index.get("d")).toEqual(entry("d", 5, 30, "m5"));
    expect(index.expire(30)).toBe(1);
    expect(index.get("d")).toBeUndefined();
    expect(index.chunks).toBe(0);
  });

  it("needs a chunk's ids only for an entry whose two hashes match, and names its segment", () => {
    const index = new SealedDedup();
    const entries = Array.from({ length: 300 }, (_, i) => entry(`id-${i}`, i, 100));
    const chunk = DedupChunk.from(entries);
    const no = index.addChunk(chunk, "seg-a");
    for (let i = 0; i < entries.length; i++) index.put(no, i);
    const idBytes = chunk.idBytes;
    expect(idBytes).toBeGreaterThan(0);
    chunk.dropIds();
    expect(chunk.resident).toBe(false);
    expect(chunk.idBytes).toBe(0);
    // a new id: answered without the ids (even one sharing the first hash: COLLIDING)
    for (let i = 300; i < 1_300; i++) expect(index.get(`id-${i}`)).toBeUndefined();
    const twin = index.addChunk(DedupChunk.from([entry(COLLIDING[0], 400, 100)]), "seg-b");
    index.put(twin, 0);
    expect(index.get(COLLIDING[1])).toBeUndefined();
    // one it holds: the ids are needed
    expect(index.candidates("id-7", 0)).toEqual([{ chunk, name: "seg-a" }]);
    expect(index.candidates("id-7", 100)).toEqual([]); // expired: no duplicate, no read
    expect(index.get("id-7", 100)).toBeUndefined();
    expect(index.candidates("id-7000", 0)).toEqual([]);
    expect(() => index.get("id-7")).toThrow(DedupIdsPagedOut);
    // restored from the same entries read again: answered; from other entries: refused
    expect(chunk.restoreIds(DedupChunk.from(entries.slice(1)))).toBe(false);
    expect(chunk.restoreIds(DedupChunk.from(entries.map((e) => ({ ...e, offset: e.offset + 1 }))))).toBe(
      false,
    );
    expect(chunk.resident).toBe(false);
    expect(chunk.restoreIds(DedupChunk.from(entries))).toBe(true);
    expect(chunk.idBytes).toBe(idBytes);
    expect(index.candidates("id-7", 0)).toEqual([{ chunk, name: "seg-a" }]);
    expect(index.get("id-7")).toEqual(entries[7]);
  });

  it("answers exactly as a map of the ids would, through inserts, replacements after expiry, expiries and paging", () => {
    for (let seed = 1; seed <= 20; seed++) {
      const random = seededRandom(seed);
      const pick = (n: number) => Math.floor(random.next() * n);
      const index = new SealedDedup();
      const model = new Map<string, DedupEntry>();
      /** Every indexed entry (a replaced one too, until it expires). */
      let all: DedupEntry[] = [];
      const chunks = new Map<string, DedupChunk>();
      const paged = new Map<string, DedupEntry[]>();
      // Few distinct ids (so replacements and probe-run deletions are common): colliding ones among
      // them, or (even seeds) UUIDs and broker-shaped message ids, which chunks pack.
      const packable = seed % 2 === 0;
      const ids = packable
        ? Array.from(
            { length: 60 },
            (_, i) => `${i.toString(16).padStart(8, "0")}-0000-4000-8000-00000000000${i % 10}`,
          )
        : [...COLLIDING, ...Array.from({ length: 60 }, (_, i) => `d${i}`)];
      const messageId = (offset: number) => (packable ? String(offset).padStart(26, "0") : `m${offset}`);
      let offset = 0;
      let now = 0;
      for (let step = 0; step < 400; step++) {
        const action = pick(10);
        if (action < 5) {
          // a chunk of fresh entries (distinct ids), as a seal would add: each replaces its id's
          // entry, which an enqueue does only once that expired
          const chosen = [
            ...new Set(Array.from({ length: 1 + pick(8) }, () => ids[pick(ids.length)] as string)),
          ].filter((d) => (model.get(d)?.expiresAt ?? 0) <= now);
          if (chosen.length === 0) continue;
          const entries = chosen.map((d) => {
            const at = offset++;
            return entry(d, at, now + 1 + pick(50), messageId(at));
          });
          const chunk = DedupChunk.from(entries);
          expect(chunk.packed).toBe(packable);
          const no = index.addChunk(chunk, `seg-${step}`);
          chunks.set(`seg-${step}`, chunk);
          entries.forEach((e, pos) => {
            index.put(no, pos);
            all.push(e);
            model.set(e.dedupId, e);
          });
          // some chunks page their ids out, and are read back when a lookup needs them
          if (pick(3) === 0) {
            chunk.dropIds();
            paged.set(`seg-${step}`, entries);
          }
        } else {
          now += pick(20);
          const due = all.filter((e) => e.expiresAt <= now).length;
          all = all.filter((e) => e.expiresAt > now);
          for (const [d, e] of model) if (e.expiresAt <= now) model.delete(d);
          expect(index.expire(now)).toBe(due);
          const next = index.nextExpiry();
          if (next !== undefined) expect(next).toBeGreaterThan(now);
        }
        expect(index.size).toBe(all.length);
        for (const d of ids) {
          for (const { chunk, name } of index.candidates(d, now)) {
            if (chunk.resident) continue;
            expect(chunk.restoreIds(DedupChunk.from(paged.get(name) as DedupEntry[]))).toBe(true);
          }
          expect(index.candidates(d, now).every((c) => c.chunk.resident)).toBe(true);
        }
        const live = (d: string) => {
          const e = model.get(d);
          return e !== undefined && e.expiresAt > now ? e : undefined;
        };
        const wrong = ids.filter((d) => JSON.stringify(index.get(d, now)) !== JSON.stringify(live(d)));
        expect(wrong).toEqual([]);
      }
      for (const [name, back] of paged) chunks.get(name)?.restoreIds(DedupChunk.from(back));
      const values = [...index.values()].sort((a, b) => a.offset - b.offset);
      expect(values).toEqual(all.sort((a, b) => a.offset - b.offset));
      // everything expires in the end, and then no chunk is held
      index.expire(Number.MAX_SAFE_INTEGER);
      expect(index.size).toBe(0);
      expect(index.chunks).toBe(0);
    }
  });

  it("costs 8 bytes a slot, holds no chunk once all expired, and reuses chunk numbers", () => {
    const index = new SealedDedup();
    const entries = Array.from({ length: 1_000 }, (_, i) => entry(`id-${i}`, i, 10));
    const no = index.addChunk(DedupChunk.from(entries), "seg");
    for (let i = 0; i < entries.length; i++) index.put(no, i);
    // 1,000 entries at most 70% full: a table of 2,048 slots, 8 bytes each (chunk and position, and the hash)
    expect(index.tableBytes).toBe(2_048 * 8);
    expect(index.expire(10)).toBe(1_000);
    expect(index.chunks).toBe(0);
    const again = index.addChunk(DedupChunk.from([entry("id-0", 2_000, 20)]), "seg2");
    expect(again).toBe(no);
    index.put(again, 0);
    expect(index.get("id-0")).toEqual(entry("id-0", 2_000, 20));
    expect(index.addChunk(DedupChunk.from([]), "empty")).toBe(-1);
  });

  it("grows past its initial table and still finds every id", () => {
    const index = new SealedDedup();
    const entries = Array.from({ length: 5_000 }, (_, i) => entry(`id-${i}`, i, 10 + (i % 7)));
    const no = index.addChunk(DedupChunk.from(entries), "seg");
    for (let i = 0; i < entries.length; i++) index.put(no, i);
    expect(index.size).toBe(5_000);
    for (const e of entries) expect(index.get(e.dedupId)).toEqual(e);
    expect(index.get("id-5000")).toBeUndefined();
    expect(index.expire(12)).toBe(entries.filter((e) => e.expiresAt <= 12).length);
    for (const e of entries) expect(index.get(e.dedupId)).toEqual(e.expiresAt <= 12 ? undefined : e);
  });
});
