/**
 * The library floor of `bench/rpc-overhead.ts`: @connectrpc/connect-node's
 * adapter, as casq uses it, on a bare Node HTTP/2 server in its own process,
 * with the same two methods as plain-grpc-js-server.ts (Check answers SERVING;
 * Enqueue decodes the request and answers without queue work) and nothing
 * else: no interceptors, no context values, no shutdown signal. What casq
 * costs beyond this is casq's; what this costs beyond plain @grpc/grpc-js is
 * the protocol library's.
 *
 *   node --import tsx bench/rpc/plain-connect-server.ts [HOST:PORT]
 *
 * Prints `listening on HOST:PORT` on stdout once bound; exits on SIGTERM.
 */
import http2 from "node:http2";
import { QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import {
  Health,
  HealthCheckResponse_ServingStatus as ServingStatus,
} from "@casq/api/grpc/health/v1/health_pb.ts";
import { connectNodeAdapter } from "@connectrpc/connect-node";

const listen = process.argv[2] ?? "127.0.0.1:0";
const [host, port] = [
  listen.slice(0, listen.lastIndexOf(":")),
  Number(listen.slice(listen.lastIndexOf(":") + 1)),
];

let offset = 0n;
const handler = connectNodeAdapter({
  routes: (router) => {
    router.service(Health, { check: () => ({ status: ServingStatus.SERVING }) });
    router.rpc(QueueService.method.enqueue, (req) => ({
      messages: req.messages.map(() => ({ id: "01JBENCHPLAINCONNECT000000", shard: 0, offset: offset++ })),
    }));
  },
});
const server = http2.createServer({}, handler);
server.listen(port, host, () => {
  const bound = server.address();
  console.log(`listening on ${host}:${typeof bound === "object" && bound ? bound.port : port}`);
});
process.on("SIGTERM", () => {
  server.close(() => process.exit(0));
  setTimeout(() => process.exit(0), 2_000).unref(); // a client that keeps its connection open
});
