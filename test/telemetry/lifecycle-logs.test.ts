/**
 * Structured logs: one JSON line per lifecycle event (listening, shard
 * leadership acquired / taken over / lost, a refused document, shutdown),
 * and never a payload or a credential in any line.
 */
import { Writable } from "node:stream";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import { grpcClients, sharedStore, startTestServer } from "../service/support.ts";

/** A pino logger that keeps every line it writes, parsed. */
function capturingLogger() {
  const lines: Record<string, unknown>[] = [];
  const raw: string[] = [];
  const sink = new Writable({
    write(chunk, _encoding, done) {
      for (const line of chunk.toString("utf8").split("\n")) {
        if (line.trim() === "") continue;
        raw.push(line);
        lines.push(JSON.parse(line) as Record<string, unknown>);
      }
      done();
    },
  });
  return { logger: pino({ level: "info" }, sink), lines, raw };
}

const SECRET_PAYLOAD = "payload-that-must-never-be-logged";

describe("lifecycle logs", () => {
  it("writes one JSON line per lifecycle event and no payloads", async () => {
    const memory = new MemoryStore();
    const store = sharedStore(memory);
    const first = capturingLogger();
    const a = await startTestServer({ store, logger: first.logger, commit: { leaseMs: 400 } });
    const clients = grpcClients(a.address);
    await clients.queue.enqueue({
      queue: "jobs",
      messages: [{ payload: new TextEncoder().encode(SECRET_PAYLOAD) }],
    });
    await memory.put("queues/broken/0.json", new TextEncoder().encode("{not json"), { ifAbsent: true });
    // A queue whose shard document is garbage: the broker must refuse it (and say so once in the log).
    const manifest = new TextDecoder().decode((await memory.get("queues/jobs/queue.json"))?.body);
    await memory.put(
      "queues/broken/queue.json",
      new TextEncoder().encode(manifest.replace('"jobs"', '"broken"')),
      {
        ifAbsent: true,
      },
    );
    const refused = await clients.queue
      .enqueue({ queue: "broken", messages: [{ payload: new TextEncoder().encode("x") }] })
      .catch((error: unknown) => error);
    expect(String(refused)).toMatch(/data_loss/);
    // Every later request meets the same refusal; the log says it once, not once per request.
    for (let i = 0; i < 3; i++) {
      await clients.queue
        .enqueue({ queue: "broken", messages: [{ payload: new TextEncoder().encode("x") }] })
        .catch(() => {});
    }
    await a.close({ graceful: true });

    const messages = first.lines.map((line) => line.msg);
    expect(messages).toContain("casq server listening");
    expect(messages).toContain("shard leadership acquired");
    const refusals = first.lines.filter(
      (line) => line.msg === "shard document refused: it cannot be used and will not be overwritten",
    );
    expect(refusals).toHaveLength(1);
    expect(refusals[0]).toMatchObject({ queue: "broken", shard: 0 });
    expect(String(refusals[0]?.reason)).toMatch(/cannot be read and will not be overwritten/);
    expect(messages).toContain("casq server stopped");
    const acquired = first.lines.find(
      (line) => line.msg === "shard leadership acquired" && line.queue === "jobs",
    );
    expect(acquired).toMatchObject({ queue: "jobs", shard: 0, epoch: 1 });
    for (const line of first.lines) {
      expect(typeof line.level).toBe("number");
      expect(typeof line.time).toBe("number");
    }
    expect(first.raw.join("\n")).not.toContain(SECRET_PAYLOAD);

    // A second broker on the same store takes the released shard over with the next epoch.
    const second = capturingLogger();
    const b = await startTestServer({ store, logger: second.logger });
    await grpcClients(b.address).queue.enqueue({
      queue: "jobs",
      messages: [{ payload: new Uint8Array([1]) }],
    });
    await b.close({ graceful: true });
    expect(
      second.lines.find((line) => line.msg === "shard leadership acquired" && line.queue === "jobs"),
    ).toMatchObject({
      epoch: 2,
    });
  });
});
