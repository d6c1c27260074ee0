/**
 * The cross-language run: a Python producer enqueues, a Go worker works, and
 * TypeScript checks the final state — three SDKs, three processes, one
 * `casq serve` — and one trace per message from the Python producer through
 * the broker to the Go worker.
 *
 * Every process exports its spans with its own standard OTLP/HTTP exporter,
 * configured only by `OTEL_*` variables, to a receiver in this test:
 * `sdk/python/examples/producer.py` (service `xl-python-producer`),
 * `casq serve` (`xl-broker`) and `sdk/go/examples/worker` (`xl-go-worker`).
 */
import { join } from "node:path";
import { Admin } from "@casq/sdk";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  type CasqServerProcess,
  ROOT,
  run,
  startServer,
  tempDir,
  waitFor,
} from "../e2e/support/processes.ts";
import { type OtlpReceiver, type ReceivedSpan, startOtlpReceiver } from "../support/otlp-receiver.ts";

const PYTHON = join(ROOT, ".venv", "bin", "python");
const GO_EXAMPLES = join(ROOT, "sdk", "go", "examples");
const QUEUE = "cross-language";
const COUNT = 5;

let receiver: OtlpReceiver;
let broker: CasqServerProcess;
let store: { path: string; remove: () => void };

/** `OTEL_*` settings that send a process's spans to the receiver, fast. */
function otel(service: string): Record<string, string> {
  return {
    OTEL_SERVICE_NAME: service,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: receiver.endpoint,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "http/protobuf",
    OTEL_BSP_SCHEDULE_DELAY: "100",
    OTEL_RESOURCE_ATTRIBUTES: "deployment.environment=cross-language-test",
  };
}

/** Lines of `stdout` of the form `<verb> <id> <payload>`. */
function records(stdout: string, verb: string): { id: string; payload: string }[] {
  return stdout
    .split("\n")
    .filter((line) => line.startsWith(`${verb} `))
    .map((line) => {
      const [, id = "", ...rest] = line.split(" ");
      return { id, payload: rest.join(" ") };
    });
}

beforeAll(async () => {
  receiver = await startOtlpReceiver();
  store = tempDir("cross-language");
  broker = await startServer({
    store: `file:${store.path}`,
    env: { ...otel("xl-broker"), OTEL_TRACES_EXPORTER: "otlp" },
  });
});

afterAll(async () => {
  await broker?.stop();
  await receiver?.close();
  store?.remove();
});

describe("Python produces, Go works, TypeScript checks", () => {
  // Generous: on a machine with a cold Go build cache `go run` first compiles the example and the OTLP exporter.
  it("every message is worked once and each forms one trace across the three processes", {
    timeout: 360_000,
  }, async () => {
    const admin = new Admin({ brokers: [broker.address] });
    await admin.createQueue(QUEUE, { shardCount: 1 });

    const produced = await run(
      PYTHON,
      [
        join(ROOT, "sdk/python/examples/producer.py"),
        "--brokers",
        broker.address,
        "--queue",
        QUEUE,
        "--count",
        String(COUNT),
        "--prefix",
        "xl-",
      ],
      { env: otel("xl-python-producer"), timeoutMs: 60_000 },
    );
    expect(produced.code, produced.stderr).toBe(0);
    const enqueued = records(produced.stdout, "enqueued");
    expect(enqueued.map((r) => r.payload).sort()).toEqual(Array.from({ length: COUNT }, (_, i) => `xl-${i}`));

    // `go run` compiles the example first (cached after the first run).
    const worked = await run(
      "go",
      ["run", "./worker", "-brokers", broker.address, "-queue", QUEUE, "-jobs", String(COUNT)],
      { cwd: GO_EXAMPLES, env: otel("xl-go-worker"), timeoutMs: 300_000 },
    );
    expect(worked.code, worked.stderr).toBe(0);
    const done = records(worked.stdout, "worked");
    expect(done.map((r) => r.id).sort()).toEqual(enqueued.map((r) => r.id).sort());
    expect(done.map((r) => r.payload).sort()).toEqual(enqueued.map((r) => r.payload).sort());

    // TypeScript checks the final state.
    let subscription: Awaited<ReturnType<Admin["getQueue"]>>["subscriptions"][number] | undefined;
    await waitFor("the acks to be visible", async () => {
      const queue = await admin.getQueue(QUEUE);
      subscription = queue.subscriptions.find((s) => s.subscription === "default");
      return subscription?.counters?.acked === BigInt(COUNT);
    });
    expect(subscription).toMatchObject({ ready: 0n, inFlight: 0n, delayed: 0n, dead: 0n, depth: 0n });
    expect(subscription?.counters).toMatchObject({
      enqueued: BigInt(COUNT),
      delivered: BigInt(COUNT),
      acked: BigInt(COUNT),
      redelivered: 0n,
    });

    // One trace per message: Python produce span -> broker Enqueue span -> Go process span.
    const byService = (spans: readonly ReceivedSpan[], service: string) =>
      spans.filter((s) => s.service === service);
    let spans: readonly ReceivedSpan[] = [];
    await waitFor("spans from all three processes", () => {
      spans = receiver.spans();
      const processed = byService(spans, "xl-go-worker").filter((s) => s.name === `process ${QUEUE}`);
      const produce = byService(spans, "xl-python-producer").filter((s) => s.name === `produce ${QUEUE}`);
      const enqueues = byService(spans, "xl-broker").filter((s) => s.name === "casq.v1.QueueService/Enqueue");
      const deliveries = byService(spans, "xl-broker").filter((s) => s.name === "casq.deliver");
      return [processed, produce, enqueues, deliveries].every((found) => found.length >= COUNT);
    });
    const byId = new Map(spans.map((s) => [s.spanId, s]));
    const rootOf = (s: ReceivedSpan): ReceivedSpan => {
      let current = s;
      for (let parent = byId.get(current.parentSpanId); parent; parent = byId.get(current.parentSpanId))
        current = parent;
      return current;
    };
    for (const { id, payload } of enqueued) {
      const processSpan = byService(spans, "xl-go-worker").find(
        (s) => s.name === `process ${QUEUE}` && s.attributes["messaging.message.id"] === id,
      );
      expect(processSpan, `Go process span of ${payload}`).toBeDefined();
      if (!processSpan) continue;
      expect(processSpan.kind).toBe(5); // CONSUMER
      expect(processSpan.attributes).toMatchObject({
        "messaging.system": "casq",
        "messaging.destination.name": QUEUE,
        "messaging.consumer.group.name": "default",
      });
      // Its parent is the broker's Enqueue span (stored with the message), whose parent is the Python span.
      const enqueueSpan = byId.get(processSpan.parentSpanId);
      expect(enqueueSpan?.service).toBe("xl-broker");
      expect(enqueueSpan?.name).toBe("casq.v1.QueueService/Enqueue");
      const root = rootOf(processSpan);
      expect(root.service).toBe("xl-python-producer");
      expect(root.name).toBe(`produce ${QUEUE}`);
      expect(root.parentSpanId).toBe("");
      // The whole trace: spans from all three processes, all reaching the same root.
      const trace = spans.filter((s) => s.traceId === processSpan.traceId);
      expect(new Set(trace.map((s) => s.service))).toEqual(
        new Set(["xl-python-producer", "xl-broker", "xl-go-worker"]),
      );
      for (const s of trace) expect(rootOf(s).spanId, `${s.service} ${s.name}`).toBe(root.spanId);
      // The broker delivered it inside the same trace.
      expect(
        trace.some((s) => s.name === "casq.deliver" && s.attributes["messaging.message.id"] === id),
      ).toBe(true);
    }
  });
});
