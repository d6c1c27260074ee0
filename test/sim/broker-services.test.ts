/**
 * The simulated broker's RPC face (`broker-services.ts`) ends a Work stream
 * whose client is gone, as a real server does: without that, a stream whose
 * client stopped reading when its connection was cut stays open at the
 * broker, and a graceful stop (which waits for every Work stream to end)
 * never finishes (found by simulation seed 800069 with SDK workers).
 */

import type { MessageInitShape } from "@bufbuild/protobuf";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import type { WorkRequestSchema } from "@casq/api/casq/v1/work_pb.ts";
import { createClient } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { SimWorld } from "./sim-world.ts";

/** Requests of a worker that opens a stream and then sends nothing until `signal` aborts. */
async function* openThenWait(
  queue: string,
  signal: AbortSignal,
): AsyncIterable<MessageInitShape<typeof WorkRequestSchema>> {
  yield {
    requestId: 1n,
    command: { case: "open", value: { queue, subscription: "default", workerId: "w-1", credits: 1 } },
  };
  await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
}

/** Turns the world's clock until `promise` settles, for at most 30 virtual seconds. */
async function settled<T>(world: SimWorld, promise: Promise<T>): Promise<T> {
  let done = false;
  const watched = promise.finally(() => {
    done = true;
  });
  for (let i = 0; i < 300 && !done; i++) await world.clock.runUntil(world.clock.now() + 100);
  if (!done) throw new Error("still pending after 30 virtual seconds");
  return watched;
}

describe("simulated broker services", () => {
  it("end a Work stream whose client is gone, so that a graceful stop finishes", async () => {
    const world = new SimWorld(1, { brokers: 1, shards: 1, sdkWorkers: "instead" });
    await world.setup();
    const slot = world.slots[0];
    const services = slot?.services;
    if (slot === undefined || services === undefined) throw new Error("the broker did not start");
    const client = createClient(QueueService, services.transport);
    const call = new AbortController();
    const responses = client.work(openThenWait(world.config.queue, call.signal), { signal: call.signal });
    // The client reads the `opened` answer, then stops reading: its connection is cut.
    const first = await settled(world, responses[Symbol.asyncIterator]().next());
    expect((first.value as { event: { case: string } } | undefined)?.event.case).toBe("opened");
    expect(services.work.openStreams).toBe(1);
    call.abort(new Error("connection reset"));

    // Far past the drain's grace (at most 3 s) and the broker's lease hand-back.
    await settled(world, slot.stop());
    expect(services.work.openStreams).toBe(0);
    expect(slot.isUp || slot.isStopping).toBe(false);
  });
});
