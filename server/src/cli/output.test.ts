import { create } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { describe, expect, it } from "vitest";
import { GetQueueResponseSchema, QueueConfigSchema } from "./api.ts";
import { messageJson } from "./output.ts";

describe("messageJson", () => {
  it("prints 64-bit integers as numbers, everywhere in the message, and keeps durations as strings", () => {
    const response = create(GetQueueResponseSchema, {
      queue: "jobs",
      shardCount: 2,
      totals: { messages: 3n, ready: 2n, lag: 8n, oldestUnackedAge: durationFromMs(1500) },
      subscriptions: [
        { subscription: "default", ready: 2n, counters: { delivered: 9_007_199_254_740_991n } },
      ],
      shards: [{ shard: 1, messages: 3n, nextOffset: 11n, leader: { epoch: 4n, address: "a:1" } }],
      config: create(QueueConfigSchema, { maxAttempts: 5, limits: { maxDocumentBytes: 67_108_864n } }),
    });
    // biome-ignore lint/suspicious/noExplicitAny: a deep look into untyped JSON output
    const json = messageJson(GetQueueResponseSchema, response) as Record<string, any>;
    expect(json.shardCount).toBe(2);
    expect(json.totals.messages).toBe(3);
    expect(json.totals.ready).toBe(2);
    expect(json.totals.lag).toBe(8);
    expect(json.totals.oldestUnackedAge).toBe("1.500s");
    expect(json.subscriptions[0].ready).toBe(2);
    expect(json.subscriptions[0].counters.delivered).toBe(Number.MAX_SAFE_INTEGER);
    expect(json.shards[0].nextOffset).toBe(11);
    expect(json.shards[0].leader.epoch).toBe(4);
    expect(json.config.limits.maxDocumentBytes).toBe(67_108_864);
    expect(JSON.stringify(json)).not.toMatch(/":"\d+"/);
  });
});
