/**
 * The executor frees a handler's slot when the handler finishes, not when
 * its ack is answered: on a slow store an ack is durable a whole commit
 * later, and jobs waiting in the buffer would sit idle until then.
 */
import { create } from "@bufbuild/protobuf";
import { trace } from "@opentelemetry/api";
import { describe, expect, it } from "vitest";
import { ClaimedMessageSchema, MessageSchema } from "../gen/casq/v1/message_pb.ts";
import { jobFromClaim } from "../job.ts";
import type { Session } from "../work-session.ts";
import { Executor } from "./executor.ts";
import type { Held } from "./held-job.ts";
import { LazyAbort } from "./lazy-abort.ts";
import { Reporter } from "./reporter.ts";
import type { Outcome, Settler } from "./settler.ts";

function held(id: string): Held {
  const abort = new LazyAbort();
  const claim = create(ClaimedMessageSchema, {
    message: create(MessageSchema, { id, queue: "jobs" }),
    subscription: "default",
    receipt: `r-${id}`,
  });
  const session = {} as Session;
  return {
    job: jobFromClaim(claim, () => abort.signal),
    abort,
    session,
    creditTo: session,
    creditReturned: false,
    started: false,
    settled: false,
    abandoned: false,
  };
}

describe("Executor", () => {
  it("starts the next waiting job when a handler finishes, before its ack is answered", async () => {
    const completed: [string, Outcome["kind"]][] = [];
    // Acks that are never answered (a write that takes long).
    const settler = {
      complete: (h: Held, outcome: Outcome) => {
        completed.push([h.job.id, outcome.kind]);
        return new Promise<void>(() => {});
      },
    } as unknown as Settler;
    const ran: string[] = [];
    const executor = new Executor({
      tracer: trace.getTracer("test"),
      handler: (job) => {
        ran.push(job.id);
      },
      subscription: "default",
      concurrency: 1,
      reporter: new Reporter("jobs", null, {}),
      settler,
      stopping: () => false,
    });
    for (const id of ["a", "b", "c"]) executor.enqueue(held(id));
    for (let i = 0; i < 10; i++) await new Promise((r) => setImmediate(r));
    expect(ran).toEqual(["a", "b", "c"]);
    expect(completed).toEqual([
      ["a", "ack"],
      ["b", "ack"],
      ["c", "ack"],
    ]);
    expect(executor.running).toBe(0);
  });
});
