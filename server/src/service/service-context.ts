/**
 * What every RPC handler of a casq server shares: the broker and the queue
 * catalog in front of it, the store (for reads that must not take a shard
 * over), the clock, and the server's lifecycle state.
 */
import type { Logger } from "pino";
import type { Broker } from "../broker/broker.ts";
import type { QueueCatalog } from "../broker/queue-catalog.ts";
import type { ShardClaimer } from "../broker/shard-claims.ts";
import type { ObjectStore } from "../store/object-store.ts";
import type { Clock } from "../util/clock.ts";
import type { Random } from "../util/random.ts";
import type { EnqueueStreamRegistry } from "./enqueue-stream-registry.ts";
import type { ShardDirectory } from "./shard-directory.ts";
import type { WorkRegistry } from "./work-registry.ts";

/** Shared state of the service handlers. */
export interface ServiceContext {
  readonly broker: Broker;
  readonly catalog: QueueCatalog;
  readonly store: ObjectStore;
  readonly clock: Clock;
  /** Randomness of the handlers (e.g. Work stream session ids): the engine's, so a simulation can seed it. */
  readonly random: Random;
  readonly directory: ShardDirectory;
  readonly claimer: ShardClaimer;
  readonly logger: Logger;
  /** Enqueue to a queue that does not exist creates it with one shard. */
  readonly autoCreateQueues: boolean;
  /** Open Work streams. */
  readonly work: WorkRegistry;
  /** Open EnqueueStreams. */
  readonly enqueueStreams: EnqueueStreamRegistry;
}
