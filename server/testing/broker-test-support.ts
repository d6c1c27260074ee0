/**
 * Small helpers shared by the broker's tests: a store that counts and can
 * hold writes, and a quick way to build brokers on one store.
 */

import { Broker, type BrokerParams, NO_MANIFESTS } from "../src/broker/broker.ts";
import { ShardLeader, type ShardLeaderParams } from "../src/broker/shard-leader.ts";
import { MemoryStore } from "../src/store/memory-store.ts";
import type {
  CallOptions,
  ObjectStore,
  PutCondition,
  PutResult,
  StoredObject,
} from "../src/store/object-store.ts";
import { StoreError } from "../src/store/store-errors.ts";
import type { Clock } from "../src/util/clock.ts";
import { systemClock } from "../src/util/clock.ts";
import { seededRandom } from "../src/util/random.ts";

/** Wraps a store, counting puts and optionally holding each put until released. */
export class GatedStore implements ObjectStore {
  readonly description = "gated(memory:)";
  puts = 0;
  gets = 0;
  hold = false;
  private waiting: (() => void)[] = [];

  constructor(readonly inner: ObjectStore = new MemoryStore()) {}

  /** Lets every held put proceed. */
  releaseAll(): void {
    for (const go of this.waiting.splice(0)) go();
  }

  /** Number of puts currently held. */
  get held(): number {
    return this.waiting.length;
  }

  async get(key: string, options?: CallOptions) {
    this.gets += 1;
    return this.inner.get(key, options);
  }

  async put(
    key: string,
    body: Uint8Array,
    condition: PutCondition,
    options?: CallOptions,
  ): Promise<PutResult> {
    this.puts += 1;
    if (this.hold) await new Promise<void>((resolve) => this.waiting.push(resolve));
    return this.inner.put(key, body, condition, options);
  }

  delete(key: string, options?: CallOptions & { readonly ifMatch?: string }) {
    return this.inner.delete(key, options);
  }

  list(prefix: string, options?: CallOptions) {
    return this.inner.list(prefix, options);
  }

  close() {
    return this.inner.close();
  }
}

/**
 * A memory store that counts GETs of keys under `prefix` (e.g. a shard's
 * `seg/`), and can fail them, or fail the next `failPuts` PUTs of `failKey`,
 * with `unavailable` (an outage).
 */
export class CountingStore extends MemoryStore {
  gets = 0;
  failGets = false;
  failPuts = 0;

  constructor(
    readonly prefix: string,
    readonly failKey = "",
  ) {
    super();
  }

  override async get(key: string, options?: CallOptions): Promise<StoredObject | undefined> {
    if (key.startsWith(this.prefix)) {
      this.gets += 1;
      if (this.failGets) throw new StoreError("unavailable", "injected 503", { key });
    }
    return super.get(key, options);
  }

  override async put(
    key: string,
    body: Uint8Array,
    condition: PutCondition,
    options?: CallOptions,
  ): Promise<PutResult> {
    if (key === this.failKey && this.failPuts > 0) {
      this.failPuts -= 1;
      throw new StoreError("unavailable", "injected 503", { key });
    }
    return super.put(key, body, condition, options);
  }
}

/** A leader of shard 0 of queue `jobs` with a fixed identity on `store` (`params` adds or overrides). */
export function makeShardLeader(
  store: ObjectStore,
  name: string,
  params: Partial<ShardLeaderParams> & Pick<ShardLeaderParams, "clock">,
): ShardLeader {
  return new ShardLeader({
    store,
    queue: "jobs",
    shard: 0,
    identity: { id: `broker-${name}`, address: `${name}:50051` },
    random: seededRandom(name.length),
    ...params,
  });
}

/** A broker with a fixed identity on `store`. */
export function makeBroker(
  store: ObjectStore,
  name: string,
  overrides: Partial<BrokerParams> & { clock?: Clock } = {},
): Broker {
  return new Broker({
    store,
    identity: { id: `broker-${name}`, address: `${name}.test:50051` },
    clock: overrides.clock ?? systemClock,
    random: seededRandom(name.length * 7919),
    // No manifests here: a missing shard document is a new shard (tests may override).
    documentExpected: NO_MANIFESTS,
    ...overrides,
  });
}

/** Resolves after pending promise callbacks and I/O callbacks ran. */
export function flush(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}
