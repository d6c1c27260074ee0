/**
 * Mixed versions during an upgrade (issue 11, "Upgrade"; docs/operations.md,
 * "Upgrading"): a v2 broker reads v1 and writes v2 from its first write; a v1
 * broker left running refuses what a v2 broker wrote as an unknown format
 * (`data_loss`, "upgrade this broker") and never writes over it.
 *
 * The v1 side is the frozen entry point of v1's parser
 * (`frozen-v1-document-gate.ts`), which every v1 load runs first. That a
 * broker whose gate rejects a head never writes over it is shown on this
 * casq's own leader with a head from a newer format than it knows: the same
 * refuse-and-never-write path v1's leader has.
 *
 * The same for a v2 broker from before dead-letter segments: its parser
 * (the frozen field checks of `frozen-v2-field-gate.ts`) reads heads without
 * them, and refuses a head whose subscriptions index dead-letter segments as
 * corrupt (an unknown field), which its leader never writes over.
 */
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { ShardLeader } from "../../server/src/broker/shard-leader.ts";
import { isCasqError } from "../../server/src/errors.ts";
import { ShardState } from "../../server/src/model/shard-state.ts";
import { FileStore } from "../../server/src/store/file-store.ts";
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import type { ObjectStore } from "../../server/src/store/object-store.ts";
import { seededRandom } from "../../server/src/util/random.ts";
import { ManualClock } from "../../server/testing/manual-clock.ts";
import { V1_SHARD_FORMAT, v1DocumentGate } from "./frozen-v1-document-gate.ts";
import { v2FieldGate } from "./frozen-v2-field-gate.ts";

const HEAD = "queues/jobs/0.json";
const SEG = "queues/jobs/0/seg/";
const body = (i: number) => new TextEncoder().encode(`job-${i}-${"x".repeat(200)}`);

function leader(store: ObjectStore, name: string, clock: ManualClock, indexSegmentSize = 64): ShardLeader {
  return new ShardLeader({
    store,
    queue: "jobs",
    shard: 0,
    identity: { id: `broker-${name}`, address: `${name}:50051` },
    clock,
    random: seededRandom(name.length),
    options: { tailBytes: 2048, indexSegmentSize },
  });
}

/** What the frozen v2 field gate throws for `bytes` (undefined: it reads them). */
function gateRefusal(bytes: Uint8Array | undefined): unknown {
  try {
    v2FieldGate(bytes ?? new Uint8Array());
    return undefined;
  } catch (error) {
    return error;
  }
}

async function failure(call: Promise<unknown>): Promise<unknown> {
  return call.then(
    () => undefined,
    (error: unknown) => error,
  );
}

describe("mixed versions: v1 and v2 brokers on one store", () => {
  it("a v2 broker reads a v1 document and its first write is a v2 head, which a v1 broker refuses as an unknown format", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const v1 = ShardState.create({ queue: "jobs", shard: 0, now: clock.now() });
    const v1Bytes = v1.encodeV1();
    v1DocumentGate(v1Bytes); // what a v1 broker wrote, it reads
    await store.put(HEAD, v1Bytes, { ifAbsent: true });

    const v2 = leader(store, "v2", clock);
    for (let i = 0; i < 60; i += 10) {
      const messages = Array.from({ length: 10 }, (_, k) => ({ id: `m${i + k}`, payload: body(i + k) }));
      await v2.submit({ kind: "enqueue", messages });
    }
    const head = await store.get(HEAD);
    const doc = JSON.parse(new TextDecoder().decode(head?.body));
    expect(doc.format).toBe("casq.shard.v2");
    expect(doc.segments.length).toBeGreaterThan(0);

    let refusal: unknown;
    try {
      v1DocumentGate(head?.body ?? new Uint8Array());
    } catch (error) {
      refusal = error;
    }
    expect(isCasqError(refusal, "data_loss"), String(refusal)).toBe(true);
    expect(String(refusal)).toContain(
      `format "casq.shard.v2", this casq only understands ${V1_SHARD_FORMAT}`,
    );
    expect(String(refusal)).toContain("upgrade this broker");
    // Segment objects are no v1 shard documents either: a v1 broker never takes one for a shard.
    const segment = (await store.list(SEG))[0];
    expect(segment).toBeDefined();
    const segmentBytes = (await store.get(segment?.key ?? ""))?.body ?? new Uint8Array();
    expect(() => v1DocumentGate(segmentBytes)).toThrow(/not a casq shard document/);
  });

  it("an older broker's file store reads a slotted head file whole, which its parser refuses (so it never writes over it)", async () => {
    const root = await mkdtemp(path.join(tmpdir(), "casq-compat-slotted-"));
    const store = new FileStore({ root });
    try {
      const writer = leader(store, "writer", new ManualClock());
      for (let i = 0; i < 3; i++)
        await writer.submit({ kind: "enqueue", messages: [{ id: `m${i}`, payload: body(i) }] });
      // Overwritten heads live in slotted files (casq-object/2); a file store from before them
      // finds no `casq-object/1` header and hands the whole file to its broker as the document.
      const raw = await readFile(path.join(root, ...HEAD.split("/")));
      expect(raw.subarray(0, 14).toString("latin1")).toBe("casq-object/2 ");
      const refusal = gateRefusal(raw);
      expect(isCasqError(refusal, "data_loss"), String(refusal)).toBe(true);
      expect(() => v1DocumentGate(raw)).toThrow(/not valid UTF-8 JSON/);
    } finally {
      await store.close();
      await rm(root, { recursive: true, force: true });
    }
  });

  it("a broker refuses a head of a newer format with data_loss and never writes over it, not even to renew or take over", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const writer = leader(store, "writer", clock);
    await writer.submit({ kind: "enqueue", messages: [{ id: "m0", payload: body(0) }] });
    await writer.stop({ release: true });
    // The head as a casq newer than this one would write it.
    const current = await store.get(HEAD);
    const newer = new TextDecoder()
      .decode(current?.body)
      .replace('"format":"casq.shard.v2"', '"format":"casq.shard.v3"');
    await store.put(HEAD, new TextEncoder().encode(newer), { ifMatch: current?.etag ?? "" });
    const before = await store.get(HEAD);

    const old = leader(store, "old", clock);
    const errors = [
      await failure(old.submit({ kind: "enqueue", messages: [{ id: "m1", payload: body(1) }] })),
      await failure(old.submit({ kind: "claim", subscription: "default", workerId: "w", max: 1 })),
      await failure(old.submit({ kind: "purge", subscription: "default" })),
    ];
    for (const error of errors) {
      expect(isCasqError(error, "data_loss"), String(error)).toBe(true);
      expect(String(error)).toContain('format "casq.shard.v3"');
    }
    expect(old.currentMode).toBe("refused");
    clock.advance(60_000); // past any lease: still nothing to take over
    await failure(old.read(() => undefined));
    const after = await store.get(HEAD);
    expect(after?.etag).toBe(before?.etag);
    expect(new TextDecoder().decode(after?.body)).toBe(newer);
  });
});

describe("mixed versions: a v2 broker from before dead-letter segments", () => {
  async function deadLetter(shard: ShardLeader, from: number, count: number) {
    const messages = Array.from({ length: count }, (_, k) => ({
      id: `d${from + k}`,
      payload: body(from + k),
    }));
    await shard.submit({ kind: "enqueue", messages });
    const claim = await shard.submit({ kind: "claim", subscription: "default", workerId: "w", max: count });
    if (claim.kind !== "claim") throw new Error("not a claim");
    await shard.submit({
      kind: "nack",
      subscription: "default",
      receipts: claim.messages.map((m) => m.receipt),
      deadLetter: true,
    });
  }

  it("reads a head whose dead letters are all in the head, and refuses one that indexes dead-letter segments as corrupt", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const writer = leader(store, "writer", clock);
    await deadLetter(writer, 0, 2); // far below the budget: in the head
    let head = await store.get(HEAD);
    expect(() => v2FieldGate(head?.body ?? new Uint8Array())).not.toThrow();
    for (let i = 2; i < 40; i += 5) await deadLetter(writer, i, 5); // past it: sealed
    head = await store.get(HEAD);
    const doc = JSON.parse(new TextDecoder().decode(head?.body));
    expect(doc.format).toBe("casq.shard.v2");
    expect(doc.subscriptions[0].dead_letter_segments.length).toBeGreaterThan(0);
    const refusal = gateRefusal(head?.body);
    expect(isCasqError(refusal, "data_loss"), String(refusal)).toBe(true);
    expect(String(refusal)).toContain('unknown field "dead_letter_segments"');
    expect(String(refusal)).toContain("refusing to load or overwrite it");
  });

  it("a broker refuses a head with a subscription field it does not know and never writes over it", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const writer = leader(store, "writer", clock);
    await deadLetter(writer, 0, 2);
    await writer.stop({ release: true });
    // A head with a field this casq does not know, as an older broker sees dead_letter_segments.
    const current = await store.get(HEAD);
    const unknown = new TextDecoder()
      .decode(current?.body)
      .replace('"dead_letters":[', '"future_index":[],"dead_letters":[');
    await store.put(HEAD, new TextEncoder().encode(unknown), { ifMatch: current?.etag ?? "" });
    const before = await store.get(HEAD);

    const old = leader(store, "old", clock);
    for (const call of [
      old.submit({ kind: "enqueue", messages: [{ id: "m1", payload: body(1) }] }),
      old.submit({ kind: "redrive", subscription: "default" }),
      old.submit({ kind: "purge", subscription: "default", deadLetters: true }),
    ]) {
      const error = await failure(call);
      expect(isCasqError(error, "data_loss"), String(error)).toBe(true);
      expect(String(error)).toContain('unknown field "future_index"');
    }
    expect(old.currentMode).toBe("refused");
    clock.advance(60_000); // past any lease: still nothing to take over
    await failure(old.read(() => undefined));
    const after = await store.get(HEAD);
    expect(after?.etag).toBe(before?.etag);
    expect(new TextDecoder().decode(after?.body)).toBe(unknown);
  });
});

describe("mixed versions: a v2 broker from before index segments", () => {
  it("reads a head that lists its segments itself, and refuses one with index segments as corrupt", async () => {
    const store = new MemoryStore();
    const clock = new ManualClock();
    const writer = leader(store, "writer", clock, 1);
    for (let i = 0; i < 12; i++)
      await writer.submit({ kind: "enqueue", messages: [{ id: `m${i}`, payload: body(i) }] });
    let head = await store.get(HEAD);
    let doc = JSON.parse(new TextDecoder().decode(head?.body));
    expect(doc.segments.length).toBeGreaterThan(0);
    expect(doc.index_segments).toBeUndefined(); // not past twice the size yet
    expect(() => v2FieldGate(head?.body ?? new Uint8Array())).not.toThrow();
    for (let i = 12; i < 60; i++)
      await writer.submit({ kind: "enqueue", messages: [{ id: `m${i}`, payload: body(i) }] });
    head = await store.get(HEAD);
    doc = JSON.parse(new TextDecoder().decode(head?.body));
    expect(doc.index_segments.length).toBeGreaterThan(0);
    const refusal = gateRefusal(head?.body);
    expect(isCasqError(refusal, "data_loss"), String(refusal)).toBe(true);
    expect(String(refusal)).toContain('unknown field "index_segments"');
    expect(String(refusal)).toContain("refusing to load or overwrite it");
  });
});
