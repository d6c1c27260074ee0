/**
 * RPC metrics: a Connect interceptor that times every unary casq.v1 call
 * (`casq_rpc_duration_seconds{method}`) and counts it by gRPC status code
 * (`casq_rpc_requests_total{method,code}`).
 *
 * Because the broker answers Enqueue, Ack and Nack only after the CAS write
 * containing them landed, the duration of those methods IS the time from
 * request to durable commit, buffer wait included: the request latency an
 * operator cares about. Streaming calls (Work) are not timed: their duration
 * is the life of a worker connection, not a latency. Health and reflection
 * calls are not counted. Labels are the method name and the status code
 * only, both bounded sets.
 */
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import type { CasqMetrics } from "./metrics.ts";

/** The interceptor that records unary casq.v1 RPCs into `metrics`. */
export function rpcMetricsInterceptor(metrics: CasqMetrics, now: () => number = performanceNow): Interceptor {
  return (next) => async (req) => {
    if (req.stream || !req.service.typeName.startsWith("casq.v1.")) return next(req);
    const method = req.method.name;
    const started = now();
    let code = "ok";
    try {
      return await next(req);
    } catch (error) {
      code = codeName(ConnectError.from(error).code);
      throw error;
    } finally {
      metrics.rpcRequests.inc({ method, code });
      metrics.rpcDuration.observe({ method }, Math.max(0, now() - started) / 1000);
    }
  };
}

/** `Code.DeadlineExceeded` -> `deadline_exceeded` (the gRPC spelling, lower case). */
export function codeName(code: Code): string {
  const name = Code[code] ?? "unknown";
  return name.replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();
}

function performanceNow(): number {
  return performance.now();
}
