/**
 * What the settle-timing tests of the shard leader share: a memory store whose
 * writes take time on a manual clock, and a shard with some of its messages
 * claimed, so that a test can time the acks of those claims.
 */
import { expectKind } from "../src/broker/operation-effects.ts";
import type { ShardLeader } from "../src/broker/shard-leader.ts";
import type { Receipt } from "../src/model/operations.ts";
import { MemoryStore } from "../src/store/memory-store.ts";
import type { PutCondition, PutResult } from "../src/store/object-store.ts";
import { flush, makeShardLeader } from "./broker-test-support.ts";
import { ManualClock } from "./manual-clock.ts";

/** A memory store whose every PUT takes `putMs` on the manual clock, counting them. */
export class TimedStore extends MemoryStore {
  /** PUTs so far. */
  puts = 0;
  constructor(
    private readonly clock: ManualClock,
    readonly putMs: number,
  ) {
    super();
  }

  override async put(key: string, body: Uint8Array, condition: PutCondition): Promise<PutResult> {
    this.puts += 1;
    this.clock.advance(this.putMs);
    return super.put(key, body, condition);
  }
}

/** A shard on a {@link TimedStore} holding `total` messages, `claimed` of them claimed by one worker. */
export async function shardWithClaims(putMs: number, total: number, claimed: number) {
  const clock = new ManualClock();
  const store = new TimedStore(clock, putMs);
  const shard = makeShardLeader(store, "a", { clock });
  await shard.submit({
    kind: "enqueue",
    messages: Array.from({ length: total }, (_, i) => ({
      id: `m${i}`,
      payload: new TextEncoder().encode(String(i)),
    })),
  });
  const claim = expectKind(
    await shard.submit({ kind: "claim", subscription: "default", workerId: "w", max: claimed }),
    "claim",
  );
  if (claim.messages.length !== claimed)
    throw new Error(`claimed ${claim.messages.length}, wanted ${claimed}`);
  return { clock, store, shard, receipts: claim.messages.map((m) => m.receipt) };
}

/** Acks `receipts` on the default subscription. */
export function ack(shard: ShardLeader, receipts: readonly Receipt[]) {
  return shard.submit({ kind: "ack", subscription: "default", receipts: [...receipts] });
}

/** Lets `times` rounds of queued promise callbacks run. */
export async function settle(times = 5): Promise<void> {
  for (let i = 0; i < times; i++) await flush();
}
