import { EventEmitter } from "node:events";
import { Health, HealthCheckResponse_ServingStatus } from "@casq/api/grpc/health/v1/health_pb.ts";
import {
  type ContextValues,
  createContextKey,
  createContextValues,
  createServiceImplSpec,
  type HandlerContext,
  type Interceptor,
  type ServiceImpl,
  type UnaryRequest,
} from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { CallSignals, GrpcJsCallContext } from "./grpc-js-call-context.ts";
import { createUnaryInvoker, type UnaryImplSpec } from "./unary-invocation.ts";

class FakeCall extends EventEmitter {
  cancelled = false;
  readonly metadata = { toHttp2Headers: () => ({ authorization: "Bearer abc" }) };
}

function newContext(): GrpcJsCallContext {
  return new GrpcJsCallContext(
    Health,
    Health.method.check,
    "/grpc.health.v1.Health/Check",
    createContextValues(),
    Number.POSITIVE_INFINITY,
    new CallSignals(),
    new FakeCall(),
  );
}

/** What the Check implementation saw. */
interface Seen {
  service?: string;
  context?: HandlerContext;
  authorization?: string | null;
  aborted?: boolean;
  values?: ContextValues;
}

function checkSpec(seen: Seen): UnaryImplSpec {
  const impl: Partial<ServiceImpl<typeof Health>> = {
    check(req, context) {
      seen.service = req.service;
      seen.context = context;
      seen.authorization = context.requestHeader.get("authorization");
      seen.aborted = context.signal.aborted;
      seen.values = context.values;
      return { status: HealthCheckResponse_ServingStatus.SERVING };
    },
  };
  return createServiceImplSpec(Health, impl).methods.check as UnaryImplSpec;
}

const MARK = createContextKey<string>("", { description: "test mark" });

describe("unary calls through interceptors", () => {
  it("applies the interceptors once per method and hands the implementation the call's own context", async () => {
    let applied = 0;
    const seenReqs: UnaryRequest[] = [];
    const counting: Interceptor = (next) => {
      applied += 1;
      return async (req) => {
        seenReqs.push(req as UnaryRequest);
        return next(req);
      };
    };
    const seen: Seen = {};
    const invoke = createUnaryInvoker(checkSpec(seen), [counting]);
    const first = newContext();
    const answer = await invoke(first, { service: "" });
    expect(answer).toMatchObject({ status: HealthCheckResponse_ServingStatus.SERVING });
    expect(seen.context).toBe(first);
    await invoke(newContext(), { service: "" });
    expect(applied).toBe(1);
    // The request's lazy parts are getters of its class, not of each request (see unary-invocation.ts).
    const req = seenReqs[0] as UnaryRequest;
    expect(Object.getOwnPropertyDescriptor(req, "header")).toBeUndefined();
    expect(Object.getOwnPropertyDescriptor(req, "signal")).toBeUndefined();
    expect(Object.getPrototypeOf(req)).toBe(Object.getPrototypeOf(seenReqs[1]));
    expect(req.header.get("authorization")).toBe("Bearer abc");
    expect(req.contextValues).toBe(first.values);
    expect(req.url).toBe("/grpc.health.v1.Health/Check");
  });

  it("gives interceptors after one that spread the request its header and signal, and the implementation the change", async () => {
    const replacing: Interceptor = (next) => async (req) =>
      next({
        ...(req as UnaryRequest),
        message: { ...(req.message as object), service: "changed" },
      } as never);
    let laterHeader: string | null = null;
    let laterSignal: AbortSignal | undefined;
    const later: Interceptor = (next) => async (req) => {
      laterHeader = req.header.get("authorization");
      laterSignal = req.signal;
      req.contextValues.set(MARK, "set by an interceptor");
      return next(req);
    };
    const seen: Seen = {};
    const invoke = createUnaryInvoker(checkSpec(seen), [replacing, later]);
    const context = newContext();
    await invoke(context, { service: "" });
    expect(laterHeader).toBe("Bearer abc");
    expect(laterSignal).toBe(context.signal);
    expect(seen.service).toBe("changed");
    expect(seen.context).not.toBe(context);
    expect(seen.authorization).toBe("Bearer abc");
    expect(seen.aborted).toBe(false);
    expect(seen.values?.get(MARK)).toBe("set by an interceptor");
    // The copy is a whole context: what the implementation sets in it is what the call answers.
    seen.context?.responseTrailer.set("x-from-copy", "1");
    expect(context.responseTrailerIfAny()?.get("x-from-copy")).toBe("1");
  });

  it("answers with the headers and trailers interceptors set or replaced", async () => {
    const setting: Interceptor = (next) => async (req) => {
      const res = await next(req);
      res.header.set("x-set", "1");
      return res;
    };
    const replacing: Interceptor = (next) => async (req) => {
      const res = await next(req);
      return { ...res, trailer: new Headers({ "x-replaced": "2" }) };
    };
    const invoke = createUnaryInvoker(checkSpec({}), [setting, replacing]);
    const context = newContext();
    context.responseTrailer.set("x-dropped", "3");
    await invoke(context, { service: "" });
    expect(context.responseHeaderIfAny()?.get("x-set")).toBe("1");
    expect([...(context.responseTrailerIfAny()?.entries() ?? [])]).toEqual([["x-replaced", "2"]]);
  });

  it("refuses a request an interceptor made anew without its call", async () => {
    const fresh: Interceptor = (next) => async (req) =>
      next({
        stream: false,
        message: req.message,
        method: req.method,
        service: req.service,
        requestMethod: req.requestMethod,
        url: req.url,
        header: new Headers(),
        signal: new AbortController().signal,
        contextValues: req.contextValues,
      } as never);
    const invoke = createUnaryInvoker(checkSpec({}), [fresh]);
    await expect(invoke(newContext(), { service: "" })).rejects.toThrow(/does not carry its call/);
  });
});
