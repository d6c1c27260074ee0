import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { GetQueueResponseSchema } from "../api.ts";
import { describeQueue } from "./stats.ts";

describe("describeQueue", () => {
  it("uses the singular for one, and explains lag next to ready", () => {
    const one = describeQueue(
      create(GetQueueResponseSchema, {
        queue: "q",
        shardCount: 1,
        totals: { messages: 1n, ready: 2n, lag: 8n },
      }),
    ).join("\n");
    expect(one).toContain("queue q: 1 shard, 1 message stored");
    expect(one).not.toMatch(/\b1 messages\b|\b1 shards\b/);
    expect(one).toContain("offset lag 8");
    expect(one).toMatch(/LAG offsets from the oldest unsettled\s+message to the newest/);
    expect(one).toContain("LAG can exceed READY");

    const many = describeQueue(
      create(GetQueueResponseSchema, { queue: "q", shardCount: 2, totals: { messages: 3n } }),
    );
    expect(many[0]).toContain("queue q: 2 shards, 3 messages stored");
  });
});
