/**
 * The RPC face of one simulated broker process: casq.v1.QueueService built
 * the way `casq-server.ts` builds it (`createQueueService` over a
 * {@link ServiceContext}: the broker, a queue catalog and a shard directory
 * over the process's store, a Work-stream registry), behind the server's
 * error interceptor (engine errors become gRPC statuses in the one place
 * they do in production), served by connect's in-memory router transport:
 * the SDK's clients reach it with no socket, and every call takes the same
 * path through connect's protocol code as over HTTP/2 (requests and
 * responses are serialized, statuses travel as trailers).
 *
 * One thing the in-memory transport does not do as a real server does: over
 * HTTP/2, connect-node's writer pulls a response stream on its own and ends
 * it (`return()`) once the client is gone; in memory, a stream is pulled
 * only as its client reads, so a Work session whose client was cut would
 * stay parked at a `yield` for ever and never end (and a graceful stop,
 * which waits for every stream to end, would never finish).
 * {@link endStreamsOfGoneClients} ends such a stream as the server would.
 *
 * What the server adds around it and the simulation leaves out: the HTTP
 * listener, auth, telemetry and the malformed-request log. A graceful stop
 * drains the Work streams as the server's close does (`draining`, requests
 * answered for a grace period, then UNAVAILABLE).
 */
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import { createRouterTransport, type Interceptor, type Transport } from "@connectrpc/connect";
import { pino } from "pino";
import type { Broker } from "../../server/src/broker/broker.ts";
import { QueueCatalog } from "../../server/src/broker/queue-catalog.ts";
import { EnqueueStreamRegistry } from "../../server/src/service/enqueue-stream-registry.ts";
import { createErrorInterceptor } from "../../server/src/service/grpc-errors.ts";
import { createQueueService } from "../../server/src/service/queue-service.ts";
import type { ServiceContext } from "../../server/src/service/service-context.ts";
import { ShardDirectory } from "../../server/src/service/shard-directory.ts";
import { WorkRegistry } from "../../server/src/service/work-registry.ts";
import type { ObjectStore } from "../../server/src/store/object-store.ts";
import type { Clock } from "../../server/src/util/clock.ts";
import { seededRandom } from "../../server/src/util/random.ts";

/** The service handlers of one broker process, as an in-memory transport (see module header). */
export class BrokerServices {
  /** The process's open Work streams. */
  readonly work = new WorkRegistry();
  /** Calls into the handlers (not yet subject to the slot's network: see `sim-connections.ts`). */
  readonly transport: Transport;

  constructor(broker: Broker, store: ObjectStore, clock: Clock) {
    // Silent, and without timestamps: nothing in a run reads the wall clock.
    const logger = pino({ level: "silent", timestamp: false });
    const ctx: ServiceContext = {
      broker,
      catalog: new QueueCatalog({ store, clock }),
      store,
      clock,
      // Its own seeded stream (session ids only), so that no draw of the broker's changes.
      random: seededRandom(0x5e551),
      directory: new ShardDirectory({ broker, store, clock }),
      claimer: broker.claims,
      logger,
      autoCreateQueues: false,
      work: this.work,
      enqueueStreams: new EnqueueStreamRegistry(),
    };
    this.transport = createRouterTransport(
      (router) => {
        router.service(QueueService, createQueueService(ctx));
      },
      { router: { interceptors: [endStreamsOfGoneClients, createErrorInterceptor(logger)] } },
    );
  }

  /**
   * Graceful stop of the Work streams, as the server's close does: no more
   * jobs, `draining`, the workers' requests answered for up to `graceMs`,
   * then every stream still open ends with UNAVAILABLE.
   */
  async drain(graceMs: number, now: number): Promise<void> {
    await this.work.drainAll(graceMs, now);
    this.work.abortAll("broker shutting down: reconnect to another broker");
  }
}

/**
 * Ends a response stream once its client is gone (the call's signal
 * aborted: a reset connection, a cancel, a deadline), as connect-node does
 * over HTTP/2 (see the module header): the handler's generator is returned,
 * so its `finally` runs whether it waits for its next message or is parked
 * at a `yield` nobody will pull.
 */
const endStreamsOfGoneClients: Interceptor = (next) => async (req) => {
  const res = await next(req);
  if (!res.stream) return res;
  const iterator = res.message[Symbol.asyncIterator]();
  const end = () => void iterator.return?.().catch(() => {});
  if (req.signal.aborted) end();
  else req.signal.addEventListener("abort", end, { once: true });
  const message = {
    [Symbol.asyncIterator]: () => ({
      next: () => iterator.next(),
      return: async (value?: unknown) => {
        req.signal.removeEventListener("abort", end);
        return (await iterator.return?.(value)) ?? { done: true as const, value: undefined };
      },
    }),
  };
  return { ...res, message } as typeof res;
};
