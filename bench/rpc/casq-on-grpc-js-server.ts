/**
 * A measurement of the alternative serving stack, not a server to run:
 * casq's own engine (broker, catalog, memory store) and its own handler
 * implementations (`createHealthService`, `createQueueService`) answering
 * `grpc.health.v1.Health/Check` and `casq.v1.QueueService/Enqueue` through
 * @grpc/grpc-js instead of @connectrpc/connect-node. Each call gets a
 * Connect HandlerContext (`createHandlerContext`, aborted when the call
 * ends), the handler's errors go through casq's `toConnectError` and become
 * a gRPC status; nothing else (no interceptors, no other methods, no
 * gRPC-Web or Connect). `bench/rpc-overhead.ts --servers casq,casq-grpc-js,...`
 * puts it next to `casq serve`: the difference is what serving gRPC clients
 * with @grpc/grpc-js would save per call.
 *
 *   node --import tsx bench/rpc/casq-on-grpc-js-server.ts [HOST:PORT]
 *
 * Prints `listening on HOST:PORT` on stdout once bound; exits on SIGTERM.
 */
import { hostname } from "node:os";
import { create, type DescMessage, type DescMethod, fromBinary, toBinary } from "@bufbuild/protobuf";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import { Health } from "@casq/api/grpc/health/v1/health_pb.ts";
import { createHandlerContext } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { pino } from "pino";
import { Broker } from "../../server/src/broker/broker.ts";
import { QueueCatalog } from "../../server/src/broker/queue-catalog.ts";
import { toConnectError } from "../../server/src/service/grpc-errors.ts";
import { createHealthService, HealthMonitor } from "../../server/src/service/health-service.ts";
import { createQueueService } from "../../server/src/service/queue-service.ts";
import type { ServiceContext } from "../../server/src/service/service-context.ts";
import { ShardDirectory } from "../../server/src/service/shard-directory.ts";
import { WorkRegistry } from "../../server/src/service/work-registry.ts";
import { openStore } from "../../server/src/store/open-store.ts";
import { systemClock } from "../../server/src/util/clock.ts";
import { systemRandom } from "../../server/src/util/random.ts";

const listen = process.argv[2] ?? "127.0.0.1:0";
const logger = pino({ level: "warn" }, pino.destination(2));
const clock = systemClock;
const store = openStore("memory:");
const catalog = new QueueCatalog({ store, clock });
const broker = new Broker({
  store,
  identity: { id: `${hostname()}-${process.pid}-grpc-js`, address: listen },
  clock,
  random: systemRandom,
  shardsFor: (queue) => catalog.shardsFor(queue),
});
const ctx: ServiceContext = {
  broker,
  catalog,
  store,
  clock,
  directory: new ShardDirectory({ broker, store, clock }),
  claimer: broker.claims,
  logger,
  autoCreateQueues: true,
  work: new WorkRegistry(),
};
const health = new HealthMonitor(store, clock, logger);
await health.start();

type UnaryImpl = (req: never, context: ReturnType<typeof createHandlerContext>) => unknown;

/** A grpc-js unary method running a Connect-style implementation. */
function unary(
  method: DescMethod,
  impl: UnaryImpl,
): [grpc.MethodDefinition<unknown, unknown>, grpc.handleUnaryCall<unknown, unknown>] {
  const input = method.input as DescMessage;
  const output = method.output as DescMessage;
  const definition: grpc.MethodDefinition<unknown, unknown> = {
    path: `/${method.parent.typeName}/${method.name}`,
    requestStream: false,
    responseStream: false,
    requestDeserialize: (bytes: Buffer) => fromBinary(input, bytes),
    requestSerialize: () => Buffer.alloc(0),
    responseSerialize: (msg: unknown) => Buffer.from(toBinary(output, create(output, msg as never))),
    responseDeserialize: () => ({}),
  };
  const handler: grpc.handleUnaryCall<unknown, unknown> = (call, callback) => {
    const context = createHandlerContext({
      service: method.parent,
      method,
      protocolName: "grpc",
      requestMethod: "POST",
      url: definition.path,
    });
    call.on("cancelled", () => context.abort());
    Promise.resolve()
      .then(() => impl(call.request as never, context))
      .then(
        (res) => {
          context.abort();
          callback(null, res);
        },
        (error: unknown) => {
          const mapped = toConnectError(error, context.signal);
          context.abort();
          callback({ code: mapped.code as number, details: mapped.rawMessage });
        },
      );
  };
  return [definition, handler];
}

const healthImpl = createHealthService(health, [QueueService.typeName]);
const queueImpl = createQueueService(ctx);
const [checkDef, check] = unary(Health.method.check, healthImpl.check as UnaryImpl);
const [enqueueDef, enqueue] = unary(QueueService.method.enqueue, queueImpl.enqueue as UnaryImpl);
const server = new grpc.Server();
server.addService({ Check: checkDef }, { Check: check });
server.addService({ Enqueue: enqueueDef }, { Enqueue: enqueue });
server.bindAsync(listen, grpc.ServerCredentials.createInsecure(), (error, port) => {
  if (error) {
    console.error(error);
    process.exit(1);
  }
  console.log(`listening on ${listen.replace(/:\d+$/, `:${port}`)}`);
});
process.on("SIGTERM", () => {
  server.tryShutdown(() => process.exit(0));
  setTimeout(() => process.exit(0), 2_000).unref(); // a client that keeps its connection open
});
