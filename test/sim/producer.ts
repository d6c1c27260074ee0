/**
 * A producer actor: during the chaos phase it enqueues small batches at
 * random intervals — some messages with dedup ids, keys, priorities, delays
 * or their own max attempts.
 *
 * How a batch reaches the brokers is the producer's {@link EnqueueChannel}:
 * the direct one below ({@link DirectEnqueue}: broker calls through
 * `sim-client.ts`, one call per shard, like an SDK), or the real TypeScript
 * SDK `Producer` (`sdk-producer.ts`), which gets whole batches and splits
 * them itself when their shards have different leaders.
 *
 * When a call gives up (outcome unknown), a batch whose messages all carry
 * dedup ids is resent with the same ids, which is safe: a message that did
 * land comes back as a duplicate naming the original. Other batches are
 * sometimes resent anyway (a careless producer: a second copy is a new,
 * separate message) and otherwise dropped. Only returned outcomes go to the
 * auditor.
 *
 * Now and then a producer also resends one of its earlier messages with a
 * dedup id, seconds later (a retry from a restarted client): by then its
 * dedup id has often been sealed into a dedup segment, a new leader has
 * loaded it, or its message was acked and collected; within the window it
 * must come back as a duplicate, and the history checks that nothing new
 * was stored (`committed-history.ts`, invariant "dedup").
 */
import type { EnqueueInput, EnqueueOutcome } from "../../server/src/broker/broker.ts";
import { shardForKey } from "../../server/src/broker/shard-routing.ts";
import type { SimClient } from "./sim-client.ts";
import type { SimRandom } from "./sim-random.ts";
import type { SimContext } from "./sim-world.ts";

/** What an enqueue call that returned sent (ids a client added included) and was told. */
export interface EnqueueAnswer {
  readonly sent: readonly EnqueueInput[];
  readonly outcomes: readonly EnqueueOutcome[];
}

/** How a producer's batches reach the brokers (see module header). */
export interface EnqueueChannel {
  /** True when the channel takes a batch whose messages go to several shards as it is. */
  readonly splitsBatches: boolean;
  /**
   * One enqueue call, retried as the client does; its answer, or `undefined`
   * when it gave up (the outcome is unknown: nothing is assumed).
   */
  enqueue(inputs: readonly EnqueueInput[]): Promise<EnqueueAnswer | undefined>;
}

/** The direct channel: `Broker.enqueue` through {@link SimClient}'s retries and redirects. */
export class DirectEnqueue implements EnqueueChannel {
  readonly splitsBatches = false;

  constructor(
    private readonly world: SimContext,
    private readonly client: SimClient,
  ) {}

  async enqueue(inputs: readonly EnqueueInput[]): Promise<EnqueueAnswer | undefined> {
    const { queue } = this.world.config;
    const result = await this.client.call("enqueue", (broker, signal) =>
      broker.enqueue(queue, [...inputs], signal),
    );
    return result.ok ? { sent: inputs, outcomes: result.value } : undefined;
  }
}

/** One producer (see module header). */
export class Producer {
  private sequence = 0;
  /** Messages with a dedup id this producer sent, to resend some later. */
  private readonly withDedup: EnqueueInput[] = [];

  constructor(
    private readonly name: string,
    private readonly world: SimContext,
    private readonly random: SimRandom,
    private readonly channel: EnqueueChannel,
  ) {}

  /** Runs until the chaos phase ends. */
  async run(): Promise<void> {
    const { clock, config } = this.world;
    while (this.world.phase === "chaos") {
      await clock.sleep(this.random.exp(config.enqueueGapMs, 10));
      if (this.world.phase !== "chaos") break;
      if (this.withDedup.length > 0 && this.random.chance(0.15)) {
        const earlier = this.withDedup[this.random.int(0, this.withDedup.length - 1)] as EnqueueInput;
        await this.send([earlier]);
        continue;
      }
      const batch = Array.from({ length: this.random.int(1, 3) }, () => this.message());
      for (const m of batch) if (m.dedupId !== undefined) this.withDedup.push(m);
      if (this.channel.splitsBatches) await this.send(batch);
      else for (const inputs of this.splitByShard(batch)) await this.send(inputs);
    }
  }

  /**
   * Like an SDK: messages routed by key (or dedup id) go in one call per
   * shard, since their shards may be led by different brokers; the others go
   * together (any broker can place them).
   */
  private splitByShard(batch: EnqueueInput[]): EnqueueInput[][] {
    const groups = new Map<string, EnqueueInput[]>();
    for (const message of batch) {
      const routeBy = message.key || message.dedupId;
      const group = routeBy ? String(shardForKey(routeBy, this.world.config.shards)) : "any";
      groups.set(group, [...(groups.get(group) ?? []), message]);
    }
    return [...groups.values()];
  }

  private async send(inputs: EnqueueInput[]): Promise<void> {
    const { clock, auditor } = this.world;
    const idempotent = inputs.every((m) => m.dedupId !== undefined);
    for (let tries = 1; ; tries++) {
      const answer = await this.channel.enqueue(inputs);
      if (answer !== undefined) {
        auditor.enqueueAcknowledged(answer.sent, answer.outcomes);
        return;
      }
      if (tries >= 4 || (!idempotent && !this.random.chance(0.3))) return;
      await clock.sleep(this.random.int(50, 500));
    }
  }

  private message(): EnqueueInput {
    const n = this.sequence++;
    const r = this.random;
    const text = `${this.name}-${n}`;
    return {
      payload: new TextEncoder().encode(text),
      ...(r.chance(0.4) ? { dedupId: text } : {}),
      ...(r.chance(0.3) ? { key: `k${r.int(0, 4)}` } : {}),
      ...(r.chance(0.3) ? { priority: r.int(-2, 2) } : {}),
      ...(r.chance(0.15) ? { delayMs: r.int(100, 5_000) } : {}),
      ...(r.chance(0.1) ? { maxAttempts: r.int(1, 5) } : {}),
    };
  }
}
