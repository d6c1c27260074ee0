/**
 * Engine benchmark: ops/s of enqueue, claim and ack through the broker on the
 * memory store, with 0 ms and 100 ms of PUT latency and 64 concurrent callers,
 * with group commit on and off (off = one CAS write per operation, the
 * baseline every naive object-store queue pays). Also measures the cost of
 * serializing a shard document, the one part of the commit path that grows
 * with the queue.
 *
 *   npm run bench:engine            # a table
 *   npm run -s bench:engine -- --json  # one JSON object (-s: no npm header)
 *
 * Numbers are only comparable within one run on one machine.
 */
import { parseArgs } from "node:util";
import { Broker, type Delivery, NO_MANIFESTS } from "../server/src/broker/broker.ts";
import { applyOperation } from "../server/src/model/apply-operation.ts";
import { ShardState } from "../server/src/model/shard-state.ts";
import { MemoryStore } from "../server/src/store/memory-store.ts";
import { systemClock } from "../server/src/util/clock.ts";
import { seededRandom } from "../server/src/util/random.ts";
import { FaultInjectingStore } from "../server/testing/fault-injecting-store.ts";

const { values } = parseArgs({
  options: {
    json: { type: "boolean", default: false },
    seconds: { type: "string", default: "2" },
    callers: { type: "string", default: "64" },
  },
});
const seconds = Number(values.seconds);
const callers = Number(values.callers);

type Op = "enqueue" | "claim" | "ack";
interface Case {
  op: Op;
  put_latency_ms: number;
  group_commit: boolean;
  callers: number;
  /** Messages in the queue before the run (claim and ack need a backlog). */
  backlog: number;
  ops: number;
  seconds: number;
  ops_per_s: number;
  puts: number;
  ops_per_put: number;
}

const payload = new Uint8Array(256).fill(97);

function makeBroker(latencyMs: number, groupCommit: boolean) {
  const memory = new MemoryStore();
  const store = new FaultInjectingStore(memory, {
    latency: { put: latencyMs > 0 ? { kind: "fixed", ms: latencyMs } : { kind: "none" } },
    random: seededRandom(1),
  });
  const broker = new Broker({
    store,
    identity: { id: "bench", address: "127.0.0.1:0" },
    clock: systemClock,
    random: seededRandom(2),
    commit: { groupCommit },
    initialConfig: { leaseTtlMs: 600_000 },
    documentExpected: NO_MANIFESTS,
  });
  return { broker, store };
}

async function runCase(op: Op, latencyMs: number, groupCommit: boolean): Promise<Case> {
  const { broker, store } = makeBroker(latencyMs, groupCommit);
  const queue = "bench";
  // Enough messages for the run, loaded without latency. The backlog (and so
  // the document each commit serializes) is the same with and without group
  // commit, so the two are compared at equal document sizes.
  const prefill = op === "enqueue" ? 0 : latencyMs === 0 ? 20_000 : 2_000;
  store.setLatency({ put: { kind: "none" } });
  for (let i = 0; i < prefill; i += 1000) {
    await broker.enqueue(
      queue,
      Array.from({ length: Math.min(1000, prefill - i) }, () => ({ payload })),
    );
  }
  const claimedForAck: Delivery[] = [];
  if (op === "ack") {
    for (;;) {
      const got = await broker.claim(queue, { subscription: "default", workerId: "w", max: 1000 });
      if (got.length === 0) break;
      claimedForAck.push(...got);
    }
  }
  store.setLatency({ put: latencyMs > 0 ? { kind: "fixed", ms: latencyMs } : { kind: "none" } });
  const putsBefore = store.stats().calls.put;
  let done = 0;
  const started = performance.now();
  const deadline = started + seconds * 1000;
  await Promise.all(
    Array.from({ length: callers }, async (_, caller) => {
      while (performance.now() < deadline) {
        if (op === "enqueue") {
          await broker.enqueue(queue, [{ payload }]);
        } else if (op === "claim") {
          const got = await broker.claim(queue, { subscription: "default", workerId: `w${caller}`, max: 1 });
          if (got.length === 0) break;
        } else {
          const delivery = claimedForAck.pop();
          if (!delivery) break;
          await broker.ack(queue, "default", [{ shard: delivery.shard, ...delivery.message.receipt }]);
        }
        done += 1;
      }
    }),
  );
  const elapsed = (performance.now() - started) / 1000;
  const puts = store.stats().calls.put - putsBefore;
  await broker.stop({ release: false });
  return {
    op,
    put_latency_ms: latencyMs,
    group_commit: groupCommit,
    callers,
    backlog: prefill,
    ops: done,
    seconds: round(elapsed),
    ops_per_s: round(done / elapsed),
    puts,
    ops_per_put: round(puts === 0 ? 0 : done / puts),
  };
}

function measureEncode(messages: number) {
  const state = ShardState.create({
    queue: "bench",
    shard: 0,
    now: Date.now(),
    config: { maxDocumentBytes: 5 * 1024 ** 3 },
  });
  for (let i = 0; i < messages; i += 1000) {
    applyOperation(
      state,
      {
        kind: "enqueue",
        messages: Array.from({ length: Math.min(1000, messages - i) }, (_, j) => ({
          id: `m${i + j}`,
          payload,
        })),
      },
      Date.now(),
    );
  }
  const runs = 5;
  let bytes = 0;
  const t0 = performance.now();
  for (let i = 0; i < runs; i++) bytes = state.encode().byteLength;
  const encodeMs = (performance.now() - t0) / runs;
  const encoded = state.encode();
  const t1 = performance.now();
  for (let i = 0; i < runs; i++) ShardState.decode(encoded);
  const decodeMs = (performance.now() - t1) / runs;
  return { messages, document_bytes: bytes, encode_ms: round(encodeMs), decode_ms: round(decodeMs) };
}

function round(n: number): number {
  return Math.round(n * 100) / 100;
}

const cases: Case[] = [];
for (const op of ["enqueue", "claim", "ack"] as const) {
  for (const latency of [0, 100]) {
    for (const groupCommit of [true, false]) {
      const result = await runCase(op, latency, groupCommit);
      cases.push(result);
      if (!values.json)
        process.stderr.write(
          `  ${op} latency=${latency}ms group_commit=${groupCommit}: ${result.ops_per_s} ops/s\n`,
        );
    }
  }
}
const speedups = (["enqueue", "claim", "ack"] as const).map((op) => {
  const on = cases.find((c) => c.op === op && c.put_latency_ms === 100 && c.group_commit);
  const off = cases.find((c) => c.op === op && c.put_latency_ms === 100 && !c.group_commit);
  return {
    op,
    put_latency_ms: 100,
    group_commit_speedup: round((on?.ops_per_s ?? 0) / (off?.ops_per_s || 1)),
  };
});
const serialization = [1_000, 10_000, 100_000].map(measureEncode);
const report = { callers, seconds_per_case: seconds, cases, speedups, serialization };

if (values.json) {
  process.stdout.write(`${JSON.stringify(report)}\n`);
} else {
  console.log(
    `\ncasq engine benchmark — memory store, ${callers} concurrent callers, ${seconds}s per case\n`,
  );
  console.log("op       put_latency  group_commit  backlog     ops/s     puts  ops/put");
  for (const c of cases)
    console.log(
      `${c.op.padEnd(8)} ${`${c.put_latency_ms} ms`.padStart(11)}  ${String(c.group_commit).padEnd(12)} ${String(c.backlog).padStart(8)} ${String(c.ops_per_s).padStart(9)} ${String(c.puts).padStart(8)} ${String(c.ops_per_put).padStart(8)}`,
    );
  console.log("\ngroup commit speedup at 100 ms PUT latency (goal: >= 50x):");
  for (const s of speedups) console.log(`  ${s.op.padEnd(8)} ${s.group_commit_speedup}x`);
  console.log("\nshard document serialization (256-byte payloads):");
  console.log("messages   document_bytes  encode_ms  decode_ms");
  for (const s of serialization)
    console.log(
      `${String(s.messages).padStart(8)} ${String(s.document_bytes).padStart(16)} ${String(s.encode_ms).padStart(10)} ${String(s.decode_ms).padStart(10)}`,
    );
}
