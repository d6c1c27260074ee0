import { describe, expect, it } from "vitest";
import { T0 } from "../../testing/model-test-helpers.ts";
import { deadLetterJson, dedupEntryJson, messageJson } from "./record-encoder.ts";
import { encodeDeadLetterSegment, encodeDedupSegment, encodeSegment } from "./segment-codec.ts";
import type { DeadLetterRecord, DedupEntry, MessageRecord } from "./shard-records.ts";

const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes);

function record(offset: number, extra: Partial<MessageRecord> = {}): MessageRecord {
  return {
    offset,
    id: `m${offset}-é`,
    enqueuedAt: T0,
    runAt: T0,
    priority: 0,
    key: undefined,
    maxAttempts: undefined,
    dedupId: undefined,
    headers: {},
    traceContext: undefined,
    payload: new TextEncoder().encode(`payload ${offset} 日本 🙂`),
    ...extra,
  } as MessageRecord;
}

describe("segment encoders", () => {
  it("write what joining the records' JSON into one string writes (multi-byte characters included)", () => {
    const records = [record(3), record(4, { key: "k-ü", priority: 2, headers: { h: "v-ä" } }), record(7)];
    const bytes = encodeSegment("jobs", 1, records);
    expect(text(bytes)).toBe(
      `{"format":"casq.segment.v1","queue":"jobs","shard":1,"messages":[${records.map((r) => messageJson(r, undefined)).join(",")}]}`,
    );
    expect(JSON.parse(text(bytes)).messages.map((m: { offset: number }) => m.offset)).toEqual([3, 4, 7]);

    const entries: DedupEntry[] = [
      { dedupId: "d-é", id: "m3", offset: 3, expiresAt: T0 + 1 },
      { dedupId: "d-4", id: "m4", offset: 4, expiresAt: T0 + 2 },
    ];
    const dedup = encodeDedupSegment("jobs", 1, entries);
    expect(text(dedup)).toBe(
      `{"format":"casq.dedup.v1","queue":"jobs","shard":1,"entries":[${entries.map(dedupEntryJson).join(",")}]}`,
    );
    expect(JSON.parse(text(dedup)).entries).toHaveLength(2);

    const letters: DeadLetterRecord[] = records.map((message, i) => ({
      deadAt: T0 + i,
      attempts: 1,
      reason: "nope-ö",
      message,
    }));
    const dead = encodeDeadLetterSegment("jobs", 1, "sub-ß", letters);
    expect(text(dead)).toBe(
      `{"format":"casq.deadletters.v1","queue":"jobs","shard":1,"subscription":"sub-ß","dead_letters":[${letters.map(deadLetterJson).join(",")}]}`,
    );
    expect(JSON.parse(text(dead)).dead_letters).toHaveLength(3);
  });
});
