/**
 * Seeded fuzz test of the whole API (issue 10): every RPC of QueueService and
 * AdminService, Work streams and EnqueueStreams, get a few thousand random
 * mixes of valid and invalid fields over real gRPC to an in-process server on
 * the memory store. The requests are built from the protobuf descriptors, so a new RPC
 * or field is fuzzed without changing this file; string fields named like
 * a queue, subscription or receipt draw from pools of valid names, names of
 * existing queues and receipts the server issued, besides junk (long,
 * unicode, empty), and numbers mix edge values (negative, huge, zero) with
 * unknown enum values.
 *
 * The server must stay up, never answer INTERNAL or UNKNOWN, and a rejected
 * call must change nothing in the store (a snapshot of every key and body,
 * before and after; housekeeping that fell due in between, such as giving
 * back a lease an earlier call took, is told apart by the commits that wrote
 * it, which applied no operation). A successful call may change state.
 *
 * CASQ_FUZZ_SEED and CASQ_FUZZ_RUNS set the seed and the number of calls
 * (default 2000, ~45 s here) for longer local runs; a failure names the seed and the call.
 */
import {
  create,
  type DescField,
  type DescMessage,
  type DescMethod,
  type DescService,
} from "@bufbuild/protobuf";
import { AdminService } from "@casq/api/casq/v1/admin_service_pb.ts";
import {
  EnqueueStreamRequestSchema,
  type EnqueueStreamResponse,
  QueueService,
} from "@casq/api/casq/v1/queue_service_pb.ts";
import { WorkRequestSchema } from "@casq/api/casq/v1/work_pb.ts";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import type { CommitInfo, ShardObserver } from "../../server/src/broker/shard-observer.ts";
import type { ObjectStore } from "../../server/src/store/object-store.ts";
import { useTestServers } from "./support.ts";

const server = useTestServers();

const SEED = Number(process.env.CASQ_FUZZ_SEED ?? 20_101);
const RUNS = Number(process.env.CASQ_FUZZ_RUNS ?? 2000);

/** Queues that exist at the start (their lease TTL is long: no lease expires by itself during the run). */
const EXISTING_QUEUES = ["fz-a", "fz-b"];
const LONG_LEASE_MS = 3_600_000;

/** Receipts the server issued during the run, for acks, nacks and heartbeats that may be valid. */
const issuedReceipts: string[] = [];

/** Junk every string field may get. */
const junkString = fc.oneof(
  fc.constantFrom("", " ", "Bad Name", "default", "é😀\u0000", "\uD800", "0.0.1", "-1", "../x"),
  fc.string({ maxLength: 40 }),
  fc.string({ unit: "grapheme", maxLength: 20 }),
  fc.constantFrom("x".repeat(129), "a".repeat(1025), "q".repeat(70_000)),
);

const queueName = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom(...EXISTING_QUEUES) },
  { weight: 1, arbitrary: fc.constantFrom("fz-new-1", "fz-new-2") },
  { weight: 2, arbitrary: junkString },
);
const subscriptionName = fc.oneof(
  { weight: 3, arbitrary: fc.constantFrom("", "default", "fz-sub") },
  { weight: 1, arbitrary: junkString },
);
const receipt = fc.oneof(
  { weight: 3, arbitrary: fc.constant(undefined) }, // replaced by an issued receipt when there is one
  {
    weight: 1,
    arbitrary: fc.constantFrom("0.0.1", "1.0.1", "0.99999999999999999.1", "4294967296.0.1", "0.0.0"),
  },
  { weight: 1, arbitrary: junkString },
);

const INT32_EDGES = [0, 1, -1, 2, 1000, 1001, -1000, -1001, 2 ** 31 - 1, -(2 ** 31)];
const UINT32_EDGES = [0, 1, 2, 3, 16, 1000, 1001, 1024, 65_536, 2 ** 31, 2 ** 32 - 1];
const INT64_EDGES = [
  0n,
  1n,
  -1n,
  59n,
  3600n,
  315_576_000_000n,
  315_576_000_001n,
  2n ** 63n - 1n,
  -(2n ** 63n),
];
const UINT64_EDGES = [0n, 1n, 2n, 1000n, 2n ** 53n, 2n ** 64n - 1n];

/** Mostly `valid`, sometimes an edge value or anything. */
function mix<T>(valid: fc.Arbitrary<T>, edge: fc.Arbitrary<T>, any: fc.Arbitrary<T>): fc.Arbitrary<T> {
  return fc.oneof(
    { weight: 5, arbitrary: valid },
    { weight: 2, arbitrary: edge },
    { weight: 1, arbitrary: any },
  );
}

/** A value for one scalar field; `name` biases strings towards meaningful values. */
function scalarValue(g: fc.GeneratorValue, field: DescField, scalar: number): unknown {
  const name = field.name;
  switch (scalar) {
    case 9: // string
      if (name === "queue") return g(() => queueName);
      if (name === "subscription") return g(() => subscriptionName);
      if (name === "receipts" || name === "receipt") {
        const r = g(() => receipt);
        if (r === undefined && issuedReceipts.length > 0)
          return issuedReceipts[g(() => fc.nat(issuedReceipts.length - 1))];
        return r ?? "0.0.1";
      }
      if (name.endsWith("worker_id")) return g(() => fc.oneof(fc.constantFrom("w1", "w2"), junkString));
      return g(() => mix(fc.stringMatching(/^[a-z0-9]{1,12}$/), junkString, fc.string({ maxLength: 12 })));
    case 12: // bytes
      return g(() =>
        fc.oneof(
          fc.uint8Array({ maxLength: 64 }),
          fc.constant(new Uint8Array(300_000)),
          fc.constant(new Uint8Array(0)),
        ),
      );
    case 8: // bool
      return g(() => fc.boolean());
    case 1:
    case 2: // double, float
      return g(() => fc.oneof(fc.double(), fc.constantFrom(0, -1, Number.NaN, Number.POSITIVE_INFINITY)));
    case 5:
    case 15:
    case 17: // int32, sfixed32, sint32
      return g(() => mix(fc.integer({ min: 0, max: 10 }), fc.constantFrom(...INT32_EDGES), fc.integer()));
    case 7:
    case 13: // fixed32, uint32
      return g(() =>
        mix(fc.integer({ min: 0, max: 10 }), fc.constantFrom(...UINT32_EDGES), fc.nat({ max: 2 ** 32 - 1 })),
      );
    case 3:
    case 16:
    case 18: // int64, sfixed64, sint64
      return g(() =>
        mix(fc.bigInt(0n, 10n), fc.constantFrom(...INT64_EDGES), fc.bigInt(-(2n ** 63n), 2n ** 63n - 1n)),
      );
    default: // uint64, fixed64
      return g(() =>
        mix(fc.bigInt(0n, 10n), fc.constantFrom(...UINT64_EDGES), fc.bigInt(0n, 2n ** 64n - 1n)),
      );
  }
}

/** A value of one (non-list, non-map) field. */
function singleValue(g: fc.GeneratorValue, field: DescField, depth: number): unknown {
  if (field.fieldKind === "scalar" || (field.fieldKind === "list" && field.listKind === "scalar"))
    return scalarValue(g, field, field.scalar);
  if (field.fieldKind === "enum" || (field.fieldKind === "list" && field.listKind === "enum")) {
    const known = field.enum.values.map((v) => v.number);
    return g(() => mix(fc.constantFrom(...known), fc.constantFrom(-1, 99, 2 ** 31 - 1), fc.constant(0)));
  }
  if (field.fieldKind === "message" || (field.fieldKind === "list" && field.listKind === "message"))
    return messageInit(g, field.message, depth + 1);
  return undefined;
}

/** A random init object for `desc`: each field set or not, oneofs on one random case. */
function messageInit(g: fc.GeneratorValue, desc: DescMessage, depth = 0): Record<string, unknown> {
  const init: Record<string, unknown> = {};
  if (depth > 3) return init;
  for (const oneof of desc.oneofs) {
    const choice = g(() => fc.nat(oneof.fields.length));
    const field = oneof.fields[choice];
    if (field !== undefined)
      init[oneof.localName] = { case: field.localName, value: singleValue(g, field, depth) };
  }
  for (const field of desc.fields) {
    if (field.oneof !== undefined) continue;
    // The fields a call cannot do without are usually set; a third of the others.
    const key = ["queue", "worker_id", "messages", "receipts", "payload"].includes(field.name);
    if (key ? g(() => fc.nat(9)) === 0 : g(() => fc.nat(2)) !== 0) continue;
    if (field.fieldKind === "list") {
      const n = g(() => fc.oneof(fc.nat(4), fc.constantFrom(0, 1001)));
      // Past the first few, a list repeats one small value: too many entries, not a huge request
      // (hundreds of MB on one connection make Node refuse new streams with ENHANCE_YOUR_CALM).
      const filler = field.listKind === "message" ? {} : singleValue(g, field, depth);
      const small = typeof filler === "string" && filler.length > 100 ? "x" : filler;
      init[field.localName] = Array.from({ length: n }, (_, i) =>
        i < 4 ? singleValue(g, field, depth) : small,
      );
    } else if (field.fieldKind === "map") {
      const entries = g(() => fc.nat(3));
      const map: Record<string, unknown> = {};
      for (let i = 0; i < entries; i++) {
        const key = g(() => fc.oneof(fc.string({ maxLength: 8 }), fc.constantFrom("", "k".repeat(5000))));
        map[key] =
          field.mapKind === "scalar"
            ? scalarValue(g, field, field.scalar)
            : field.mapKind === "enum"
              ? 0
              : messageInit(g, field.message, depth + 1);
      }
      init[field.localName] = map;
    } else {
      init[field.localName] = singleValue(g, field, depth);
    }
  }
  return init;
}

/** A short text of a request, for failure messages. */
function describeInput(input: unknown): string {
  if (input === undefined) return "";
  return JSON.stringify(input, (_k, v: unknown) => {
    if (typeof v === "bigint") return `${v}n`;
    if (typeof v === "string" && v.length > 40) return `${v.slice(0, 20)}...(${v.length} chars)`;
    if (v instanceof Uint8Array) return `<${v.length} bytes>`;
    return v;
  }).slice(0, 600);
}

/** Every key and body in the store. */
async function snapshot(store: ObjectStore): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  for (const entry of await store.list("")) {
    const got = await store.get(entry.key);
    if (got !== undefined) out.set(entry.key, Buffer.from(got.body).toString("base64"));
  }
  return out;
}

/**
 * The keys whose bodies differ between two snapshots, but those of the shards
 * in `swept`. A function of its own, not a closure in the property: the
 * functions the property hands to fast-check's `g` are kept by its memo, and
 * with them every variable of the property's scope that some closure there
 * captures (two snapshots per call, ~2 MB each: gigabytes within a few
 * thousand calls).
 */
function changedKeys(before: Map<string, string>, after: Map<string, string>, swept: Set<string>): string[] {
  const keys = new Set([...before.keys(), ...after.keys()]);
  return [...keys].filter((k) => before.get(k) !== after.get(k) && !belongsTo(k, swept));
}

/** Codes after which the outcome is unknown or nothing was refused: no snapshot check. */
const NOT_A_REFUSAL = new Set([Code.DeadlineExceeded, Code.Canceled]);

interface Outcome {
  readonly code: Code | undefined; // undefined: OK
  readonly message: string;
  /** A Work stream or EnqueueStream: the codes of its failed requests. */
  readonly requestFailures?: number[];
  /** A Work stream that was opened (it may have claimed jobs: state may change even if it then failed). */
  readonly opened?: boolean;
}

async function callUnary(transport: Transport, method: DescMethod, input: unknown) {
  const request = create(method.input, input as never);
  const response = await transport.unary(
    method as never,
    undefined,
    5_000,
    undefined,
    request as never,
    undefined,
  );
  const message = response.message as { messages?: { receipt?: string }[] };
  for (const m of message.messages ?? []) if (m.receipt) issuedReceipts.push(m.receipt);
}

/** A streaming call of `method` with `requests`, a 5 s deadline; its answers. */
async function openStream(
  transport: Transport,
  method: DescMethod,
  requests: AsyncIterable<unknown>,
): Promise<AsyncIterable<unknown>> {
  const response = await transport.stream(
    method as never,
    undefined,
    5_000,
    undefined,
    requests as never,
    undefined,
  );
  return response.message;
}

async function callServerStream(transport: Transport, method: DescMethod, input: unknown) {
  const request = create(method.input, input as never);
  async function* one() {
    yield request;
  }
  for await (const _ of await openStream(transport, method, one()));
}

async function callWork(g: fc.GeneratorValue, transport: Transport, method: DescMethod): Promise<Outcome> {
  const requests: unknown[] = [];
  // Usually a plausible open first; sometimes anything at all.
  if (g(() => fc.nat(4)) > 0) {
    const openSchema = WorkRequestSchema.fields.find((f) => f.name === "open");
    const open = openSchema?.message ? messageInit(g, openSchema.message, 1) : {};
    if (g(() => fc.boolean())) open.leaseTtl = { seconds: BigInt(LONG_LEASE_MS / 1000), nanos: 0 };
    requests.push({ requestId: 1n, command: { case: "open", value: open } });
  }
  const more = g(() => fc.nat(4));
  for (let i = 0; i < more; i++) requests.push(messageInit(g, WorkRequestSchema));
  async function* send() {
    for (const r of requests) yield create(WorkRequestSchema, r as never);
  }
  const failures: number[] = [];
  let opened = false;
  try {
    const replies = await openStream(transport, method, send());
    for await (const reply of replies as AsyncIterable<{
      event: { case: string; value: { status?: { code: number }; receipt?: string } };
    }>) {
      if (reply.event.case === "opened") opened = true;
      if (reply.event.case === "job" && reply.event.value.receipt)
        issuedReceipts.push(reply.event.value.receipt);
      if (reply.event.case === "requestFailed") failures.push(reply.event.value.status?.code ?? -1);
    }
    return { code: undefined, message: "", requestFailures: failures, opened };
  } catch (error) {
    const e = ConnectError.from(error);
    return { code: e.code, message: e.rawMessage, requestFailures: failures, opened };
  }
}

/**
 * An EnqueueStream with a few random requests (usually with distinct
 * request ids). `opened`: some request was stored, or left unanswered when
 * the stream ended (it may have been), so state may have changed. A stream
 * that ended OK with every request refused is reported as that refusal.
 */
async function callEnqueueStream(
  g: fc.GeneratorValue,
  transport: Transport,
  method: DescMethod,
): Promise<Outcome> {
  const count = 1 + g(() => fc.nat(3));
  const distinctIds = g(() => fc.nat(4)) > 0;
  const requests = Array.from({ length: count }, (_, i) => {
    const init = messageInit(g, EnqueueStreamRequestSchema);
    return distinctIds ? { ...init, requestId: BigInt(i + 1) } : init;
  });
  async function* send() {
    for (const r of requests) yield create(EnqueueStreamRequestSchema, r as never);
  }
  const failures: number[] = [];
  let answered = 0;
  let stored = false;
  let code: Code | undefined;
  let message = "";
  try {
    const answers = await openStream(transport, method, send());
    for await (const answer of answers as AsyncIterable<EnqueueStreamResponse>) {
      answered += 1;
      if (answer.result.case === "enqueued") stored = true;
      else failures.push(answer.result.value?.code ?? -1);
    }
  } catch (error) {
    const e = ConnectError.from(error);
    code = e.code;
    message = e.rawMessage;
  }
  // A request answered DEADLINE_EXCEEDED or CANCELLED may still be applied after its answer.
  const unknown = failures.some((c) => c === Code.DeadlineExceeded || c === Code.Canceled);
  const opened = stored || unknown || answered < requests.length;
  if (code === undefined && !opened && failures.length > 0)
    return { code: failures[0] as Code, message: "every request refused", requestFailures: failures, opened };
  return { code, message, requestFailures: failures, opened };
}

/**
 * The shards written since the last `take()` only for housekeeping that fell
 * due (lease expiries, retention, dedup pruning, renewing the leader's lease):
 * every commit that wrote there applied no operation. Such a write comes from
 * the clock, not from the call under test: a job an earlier call claimed with
 * a 4 s lease is given back 4 s later, by the leader's timer or by whatever
 * batch runs the sweep then (a read of the call, or its refused operation). A
 * shard where some written commit applied an operation is not in the set: a
 * change there is the call's to explain.
 */
class HousekeepingWrites implements ShardObserver {
  private swept = new Set<string>();
  private applied = new Set<string>();
  onCommit(info: CommitInfo): void {
    if (info.outcome !== "ok") return;
    const shard = `queues/${info.queue}/${info.shard}`;
    if ((info.applied?.length ?? 0) === 0) this.swept.add(shard);
    else this.applied.add(shard);
  }
  /** The key prefixes (`queues/<queue>/<shard>`) of those shards since the last call, and forgets them. */
  take(): Set<string> {
    const only = new Set([...this.swept].filter((shard) => !this.applied.has(shard)));
    this.swept = new Set();
    this.applied = new Set();
    return only;
  }
}

/** True when `key` is a shard's head or one of its objects (`queues/<q>/<n>.json`, `queues/<q>/<n>/...`). */
function belongsTo(key: string, shards: Set<string>): boolean {
  for (const shard of shards) if (key === `${shard}.json` || key.startsWith(`${shard}/`)) return true;
  return false;
}

describe("fuzz", () => {
  it(`keeps serving, never answers INTERNAL or UNKNOWN, and refuses without side effects (seed ${SEED}, ${RUNS} calls)`, async () => {
    const housekeeping = new HousekeepingWrites();
    const s = await server({ commit: { leaseMs: 600_000 }, observer: housekeeping });
    const transport = createGrpcTransport({ baseUrl: `http://${s.address}` });
    const admin = createClient(AdminService, transport);
    for (const queue of EXISTING_QUEUES)
      await admin.createQueue({
        queue,
        shardCount: 2,
        config: { leaseTtl: { seconds: BigInt(LONG_LEASE_MS / 1000), nanos: 0 } },
      });

    const methods: [DescService, DescMethod][] = [QueueService, AdminService].flatMap((service) =>
      service.methods.map((m) => [service, m] as [DescService, DescMethod]),
    );
    const problems: string[] = [];
    let index = 0;
    let sweptDuringRefusals = 0;
    const codes = new Map<string, number>();

    await fc.assert(
      fc.asyncProperty(fc.gen(), async (g) => {
        index += 1;
        const [service, method] = methods[g(() => fc.nat(methods.length - 1))] as [DescService, DescMethod];
        const rpc = `${service.name}/${method.name}`;
        housekeeping.take(); // before the snapshot: a commit reported while it is read counts for this call
        const before = await snapshot(s.store);
        let outcome: Outcome;
        let input: unknown;
        if (method.methodKind === "bidi_streaming") {
          outcome =
            method.name === "EnqueueStream"
              ? await callEnqueueStream(g, transport, method)
              : await callWork(g, transport, method);
        } else {
          input = messageInit(g, method.input);
          try {
            if (method.methodKind === "unary") await callUnary(transport, method, input);
            else await callServerStream(transport, method, input);
            outcome = { code: undefined, message: "" };
          } catch (error) {
            const e = ConnectError.from(error);
            outcome = { code: e.code, message: e.rawMessage };
          }
        }
        const label = `${rpc}:${outcome.code === undefined ? "OK" : Code[outcome.code]}`;
        codes.set(label, (codes.get(label) ?? 0) + 1);
        const where = `call #${index} ${rpc} ${describeInput(input)} (seed ${SEED})`;
        if (outcome.code === Code.Internal || outcome.code === Code.Unknown)
          problems.push(`${where}: ${Code[outcome.code]} ${outcome.message.slice(0, 300)}`);
        for (const code of outcome.requestFailures ?? [])
          if (code === Code.Internal || code === Code.Unknown)
            problems.push(`${where}: a stream request failed with ${Code[code]}`);
        const refused = outcome.code !== undefined && !NOT_A_REFUSAL.has(outcome.code) && !outcome.opened;
        if (refused) {
          const after = await snapshot(s.store);
          // The clock's own writes in the meantime are not the call's side effects.
          const swept = housekeeping.take();
          const changed = changedKeys(before, after, swept);
          sweptDuringRefusals += swept.size;
          if (changed.length > 0)
            problems.push(
              `${where}: refused with ${Code[outcome.code as Code]} (${outcome.message.slice(0, 200)}) but changed ${changed.join(", ")}`,
            );
        }
        expect(problems.slice(0, 5)).toEqual([]);
      }),
      { seed: SEED, numRuns: RUNS, endOnFailure: true },
    );
    // The server is still up and serving.
    const listed = await admin.listQueues({});
    expect(listed.queues.length).toBeGreaterThan(0);
    if (process.env.CASQ_FUZZ_VERBOSE) {
      console.log(Object.fromEntries([...codes].sort()));
      console.log(`housekeeping sweeps written while a refused call ran: ${sweptDuringRefusals}`);
    }
  }, 240_000);
});
