/**
 * The yardstick of `bench/rpc-overhead.ts`: a plain @grpc/grpc-js server in
 * its own process, answering `grpc.health.v1.Health/Check` (always SERVING)
 * and `casq.v1.QueueService/Enqueue` (the request decoded, one made-up
 * EnqueuedMessage per message, no queue work at all). Messages are encoded
 * with @bufbuild/protobuf, as casq's own stack does, so the difference to
 * `casq serve` is the serving stack, not the codec.
 *
 *   node --import tsx bench/rpc/plain-grpc-js-server.ts [HOST:PORT]
 *
 * Prints `listening on HOST:PORT` on stdout once bound; exits on SIGTERM.
 */
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import {
  type EnqueueRequest,
  EnqueueRequestSchema,
  EnqueueResponseSchema,
} from "@casq/api/casq/v1/queue_service_pb.ts";
import {
  HealthCheckRequestSchema,
  HealthCheckResponseSchema,
  HealthCheckResponse_ServingStatus as ServingStatus,
} from "@casq/api/grpc/health/v1/health_pb.ts";
import * as grpc from "@grpc/grpc-js";

const listen = process.argv[2] ?? "127.0.0.1:0";

const health: grpc.ServiceDefinition = {
  Check: {
    path: "/grpc.health.v1.Health/Check",
    requestStream: false,
    responseStream: false,
    requestDeserialize: (bytes: Buffer) => fromBinary(HealthCheckRequestSchema, bytes),
    requestSerialize: () => Buffer.alloc(0),
    responseSerialize: (msg: Parameters<typeof toBinary<typeof HealthCheckResponseSchema>>[1]) =>
      Buffer.from(toBinary(HealthCheckResponseSchema, msg)),
    responseDeserialize: () => ({}),
  },
};

const queue: grpc.ServiceDefinition = {
  Enqueue: {
    path: "/casq.v1.QueueService/Enqueue",
    requestStream: false,
    responseStream: false,
    requestDeserialize: (bytes: Buffer) => fromBinary(EnqueueRequestSchema, bytes),
    requestSerialize: () => Buffer.alloc(0),
    responseSerialize: (msg: Parameters<typeof toBinary<typeof EnqueueResponseSchema>>[1]) =>
      Buffer.from(toBinary(EnqueueResponseSchema, msg)),
    responseDeserialize: () => ({}),
  },
};

let offset = 0n;
const server = new grpc.Server();
server.addService(health, {
  Check: (_call: grpc.ServerUnaryCall<unknown, unknown>, callback: grpc.sendUnaryData<unknown>) =>
    callback(null, create(HealthCheckResponseSchema, { status: ServingStatus.SERVING })),
});
server.addService(queue, {
  Enqueue: (call: grpc.ServerUnaryCall<EnqueueRequest, unknown>, callback: grpc.sendUnaryData<unknown>) =>
    callback(
      null,
      create(EnqueueResponseSchema, {
        messages: call.request.messages.map(() => ({
          id: "01JBENCHPLAINGRPCJS0000000",
          shard: 0,
          offset: offset++,
        })),
      }),
    ),
});
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
