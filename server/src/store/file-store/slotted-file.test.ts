/**
 * The slotted object file on its own: layout, alternating in-place writes,
 * and what a reader makes of a write cut anywhere (a crash or power loss
 * that persisted any subset of the write's sectors).
 */
import { randomBytes } from "node:crypto";
import { closeSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import fc from "fast-check";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  fitsInPlace,
  isSlotted,
  newSlottedFile,
  parseSlotted,
  readSlottedFd,
  type SlottedState,
  slottedCapacity,
  slottedFileBytes,
  writeSlot,
} from "./slotted-file.ts";

const text = (bytes: Uint8Array | undefined) => new TextDecoder().decode(bytes);
const id = (byte: number) => new Uint8Array(16).fill(byte);
const etagOf = (byte: number) => `"${Buffer.from(id(byte)).toString("hex")}"`;

describe("slotted object file", () => {
  let dir: string;
  let file: string;

  beforeEach(async () => {
    dir = await mkdtemp(path.join(tmpdir(), "casq-slotted-"));
    file = path.join(dir, "object");
  });

  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  function state(): SlottedState {
    const fd = openSync(file, "r");
    try {
      return readSlottedFd(fd);
    } finally {
      closeSync(fd);
    }
  }

  function current() {
    const read = state();
    if (read.kind !== "slotted") throw new Error("damaged");
    return read;
  }

  it("a new file: a text header line, the version in slot 0, every byte written, capacity in whole pages", () => {
    const capacity = slottedCapacity(5_000);
    expect(capacity).toBe(16 * 1024);
    expect(slottedCapacity(100_000)).toBe(200_704);
    const bytes = newSlottedFile(capacity, id(1), new TextEncoder().encode("first"));
    expect(bytes.byteLength).toBe(slottedFileBytes(capacity));
    expect(Buffer.from(bytes.subarray(0, 40)).toString("latin1")).toMatch(
      /^casq-object\/2 capacity=16384\n\0/,
    );
    expect(isSlotted(bytes)).toBe(true);
    expect(isSlotted(new TextEncoder().encode("casq-object/1 "))).toBe(false);
    expect(fitsInPlace(capacity, capacity)).toBe(true);
    expect(fitsInPlace(capacity, capacity + 1)).toBe(false);
    expect(fitsInPlace(slottedCapacity(100_000), 1)).toBe(false); // four times a new file's size: made again
    expect(fitsInPlace(slottedCapacity(100_000), 30_000)).toBe(true);
    writeFileSync(file, bytes);
    expect(current()).toEqual({
      kind: "slotted",
      capacity,
      current: { slot: 0, seq: 1n, etag: etagOf(1), length: 5 },
    });
    expect(text(parseSlotted(bytes)?.body)).toBe("first");
  });

  it("each write goes to the other slot with the next sequence number; the whole file reads the newest", () => {
    writeFileSync(file, newSlottedFile(slottedCapacity(10), id(1), new TextEncoder().encode("v1")));
    for (let version = 2; version <= 6; version++) {
      const before = current();
      const body = new TextEncoder().encode(`v${version}-${"x".repeat(version * 1000)}`);
      expect(writeSlot(file, before, id(version), body)).toBeUndefined();
      const after = current();
      expect(after.current).toEqual({
        slot: 1 - before.current.slot,
        seq: before.current.seq + 1n,
        etag: etagOf(version),
        length: body.byteLength,
      });
      const whole = parseSlotted(readFileSync(file));
      expect(text(whole?.body)).toBe(text(body));
      expect(whole?.etag).toBe(etagOf(version));
    }
  });

  it("a write cut anywhere (any subset of its sectors on disk) reads as the old version or the new one", () => {
    const capacity = slottedCapacity(6_000);
    const first = randomBytes(3_000);
    const base = Buffer.from(newSlottedFile(capacity, id(1), first));
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 6_000 }),
        fc.array(fc.boolean(), { minLength: 20, maxLength: 20 }),
        fc.integer({ min: 0, max: 255 }),
        (length, kept, fill) => {
          // The whole write, done on a copy of the file.
          writeFileSync(file, base);
          const next = Buffer.alloc(length, fill);
          expect(writeSlot(file, current(), id(2), next)).toBeUndefined();
          const written = readFileSync(file);
          // What a crash may leave: each 512-byte sector of the write either new or old.
          const torn = Buffer.from(base);
          let sector = 0;
          for (let at = 0; at < torn.byteLength; at += 512) {
            const end = Math.min(at + 512, torn.byteLength);
            if (written.subarray(at, end).equals(base.subarray(at, end))) continue;
            if (kept[sector++ % kept.length]) written.copy(torn, at, at, end);
          }
          const read = parseSlotted(torn);
          if (read?.etag === etagOf(2)) expect(Buffer.from(read.body).equals(next)).toBe(true);
          else {
            expect(read?.etag).toBe(etagOf(1));
            expect(Buffer.from(read?.body ?? []).equals(first)).toBe(true);
          }
        },
      ),
      { numRuns: 200 },
    );
  });

  it("a newer slot that fails its checksum is ignored; a file with no valid slot is damaged", () => {
    writeFileSync(file, newSlottedFile(slottedCapacity(10), id(1), new TextEncoder().encode("v1")));
    expect(writeSlot(file, current(), id(2), new TextEncoder().encode("v2"))).toBeUndefined();
    expect(current().current.etag).toBe(etagOf(2));
    const bytes = readFileSync(file);
    // Slot 1 holds v2: flip a byte of its body.
    const slot1Body = 4096 + (4096 + current().capacity) + 4096;
    bytes[slot1Body] = (bytes[slot1Body] as number) ^ 0xff;
    writeFileSync(file, bytes);
    expect(current().current).toMatchObject({ slot: 0, etag: etagOf(1) });
    expect(text(parseSlotted(readFileSync(file))?.body)).toBe("v1");
    // Slot 0 too: nothing valid is left.
    bytes[4096 + 4096] = (bytes[4096 + 4096] as number) ^ 0xff;
    writeFileSync(file, bytes);
    expect(state()).toEqual({ kind: "damaged", capacity: 16 * 1024 });
    expect(parseSlotted(readFileSync(file))).toBeUndefined();
  });

  it("refuses a file whose header names no whole-page capacity", () => {
    writeFileSync(file, "casq-object/2 capacity=100\n");
    expect(() => state()).toThrow(/not a slotted object file/);
  });
});
