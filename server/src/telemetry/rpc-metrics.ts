/**
 * RPC metrics: a Connect interceptor that times every unary casq.v1 call
 * (`casq_rpc_duration_seconds{method}`) and counts it by gRPC status code
 * (`casq_rpc_requests_total{method,code}`).
 *
 * Because the broker answers Enqueue, Ack and Nack only after the CAS write
 * containing them landed, the duration of those methods IS the time from
 * request to durable commit, buffer wait included: the request latency an
 * operator cares about. Streaming calls (Work, EnqueueStream) are not timed:
 * their duration is the life of a connection, not a latency; the requests
 * on an EnqueueStream are, each under `method="EnqueueStream"`
 * ({@link startStreamRequest}). Health and reflection
 * calls are not counted. Labels are the method name and the status code
 * only, both bounded sets.
 */
import {
  Code,
  ConnectError,
  type ContextValues,
  createContextKey,
  type Interceptor,
} from "@connectrpc/connect";
import type { CasqMetrics } from "./metrics.ts";

/** The interceptor that records unary casq.v1 RPCs into `metrics`. */
export function rpcMetricsInterceptor(metrics: CasqMetrics, now: () => number = performanceNow): Interceptor {
  const requests: StreamRequestMetrics = { metrics, now };
  return (next) => async (req) => {
    if (!req.service.typeName.startsWith("casq.v1.")) return next(req);
    if (req.stream) {
      req.contextValues.set(streamRequestMetricsKey, requests);
      return next(req);
    }
    const finish = startCall(requests, req.method.name);
    try {
      const res = await next(req);
      finish(undefined);
      return res;
    } catch (error) {
      finish(ConnectError.from(error).code);
      throw error;
    }
  };
}

/** Where calls are recorded, and the clock they are timed on (left in a streaming call's context values for its requests). */
interface StreamRequestMetrics {
  readonly metrics: CasqMetrics;
  readonly now: () => number;
}

const streamRequestMetricsKey = createContextKey<StreamRequestMetrics | undefined>(undefined, {
  description: "casq RPC metrics of stream requests",
});

const NOT_RECORDED = (): void => {};

/**
 * Starts timing one request of the request stream whose context values are
 * `values`, recorded as a call of `method`; returns the function that
 * records its outcome (the gRPC code it failed with, undefined when it
 * succeeded). Records nothing without metrics.
 */
export function startStreamRequest(
  values: ContextValues,
  method: string,
): (failedWith: Code | undefined) => void {
  const requests = values.get(streamRequestMetricsKey);
  return requests === undefined ? NOT_RECORDED : startCall(requests, method);
}

/** Starts timing one call (or stream request) of `method`; the function returned counts and times it. */
function startCall(
  { metrics, now }: StreamRequestMetrics,
  method: string,
): (failedWith: Code | undefined) => void {
  const started = now();
  return (failedWith) => {
    metrics.rpcRequests.inc({ method, code: failedWith === undefined ? "ok" : codeName(failedWith) });
    metrics.rpcDuration.observe({ method }, Math.max(0, now() - started) / 1000);
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
