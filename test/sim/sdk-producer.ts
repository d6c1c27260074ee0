/**
 * A producer's {@link EnqueueChannel} that is the real TypeScript SDK
 * `Producer` (`sdk/ts/src/producer.ts`): its failover, redirects, backoff,
 * resend rules for calls that may have been applied and its splitting of
 * batches whose shards have different leaders (BatchRedirect) all run, on
 * the run's ManualClock and seeded jitter, against the brokers' real
 * Enqueue handlers over simulated connections (`sim-connections.ts`).
 *
 * The auditor hears of an enqueue only what the SDK returned: a resolved
 * `enqueueBatch` is an acknowledgement of every message in it; a rejected
 * one is unknown (nothing is assumed; parts of a split batch may be
 * stored) and goes to `Auditor.requestFailed`, for which an SDK error that
 * means a server bug (INTERNAL, DATA_LOSS), or anything that is not a
 * `CasqError`, is a violation.
 *
 * Dedup ids: the SDK would give every message without one a random id
 * (`defaultDedupIds`), from `crypto.randomUUID`, which a seeded run cannot
 * replay (the id also picks the shard of an unkeyed message). So the SDK's
 * default is off and this channel does what it would, with seeded ids: in
 * most producers each message without a dedup id gets a fresh one per call
 * (a resend of the batch by the application is a new call, with new ids, as
 * with the SDK); the others send such messages with none (then the SDK does
 * not resend an attempt that may have landed).
 */
import { Producer as SdkProducerClient } from "../../sdk/ts/src/index.ts";
import type { EnqueueInput } from "../../server/src/broker/broker.ts";
import type { EnqueueAnswer, EnqueueChannel } from "./producer.ts";
import { SimConnections, type WireTap } from "./sim-connections.ts";
import type { SimRandom } from "./sim-random.ts";
import type { SimContext } from "./sim-world.ts";

/** The auditor learns enqueues from the SDK's answers, not from the wire. */
const NO_TAP: WireTap = { request() {}, response() {} };

/** The SDK producer channel of one producer actor (see module header). */
export class SdkEnqueue implements EnqueueChannel {
  readonly splitsBatches = true;
  private readonly producer: SdkProducerClient;
  private readonly defaultIds: boolean;
  private calls = 0;

  constructor(
    private readonly name: string,
    private readonly world: SimContext,
    random: SimRandom,
  ) {
    const { clock, slots, trace } = world;
    const connections = new SimConnections(slots, clock, random.fork(), NO_TAP);
    const addresses = slots.map((s) => s.address);
    const first = random.int(0, addresses.length - 1);
    // Known brokers in a rotated order, sometimes only some of them.
    const known = [...addresses.slice(first), ...addresses.slice(0, first)].slice(
      0,
      random.int(1, addresses.length),
    );
    this.defaultIds = random.chance(0.7);
    this.producer = new SdkProducerClient({
      brokers: known,
      timeoutMs: 5_000,
      retryTimeoutMs: random.int(5_000, 20_000),
      backoffInitialMs: 50,
      backoffMaxMs: 2_000,
      keepaliveMs: 0,
      defaultDedupIds: false,
      clock,
      random: random.fork(),
      transportFactory: (address) => connections.transport(address),
    });
    trace.add(`sdk-producer ${name} brokers=${known.join(",")} default-ids=${this.defaultIds}`);
  }

  async enqueue(inputs: readonly EnqueueInput[]): Promise<EnqueueAnswer | undefined> {
    const { auditor, config } = this.world;
    const call = ++this.calls;
    const sent = inputs.map((m, i) =>
      m.dedupId === undefined && this.defaultIds ? { ...m, dedupId: `${this.name}.call${call}.${i}` } : m,
    );
    auditor.requestSent("enqueue");
    try {
      const results = await this.producer.enqueueBatch(
        config.queue,
        sent.map((m) => ({
          payload: m.payload,
          ...(m.dedupId === undefined ? {} : { dedupId: m.dedupId }),
          ...(m.key === undefined ? {} : { key: m.key }),
          ...(m.priority === undefined ? {} : { priority: m.priority }),
          ...(m.delayMs === undefined ? {} : { delayMs: m.delayMs }),
          ...(m.maxAttempts === undefined ? {} : { maxAttempts: m.maxAttempts }),
        })),
      );
      const outcomes = results.map((r) => ({
        id: r.id,
        shard: r.shard,
        offset: Number(r.offset),
        duplicate: r.duplicate,
      }));
      return { sent, outcomes };
    } catch (error) {
      // Counted and traced; INTERNAL, DATA_LOSS and anything but a CasqError are violations.
      auditor.requestFailed("enqueue", error);
      return undefined;
    }
  }
}
