/**
 * Runs a unary Connect implementation through Connect interceptors for a
 * call served by grpc-js, as connect's own `invokeUnaryImplementation` does
 * (the first interceptor is the outermost; the implementation gets the
 * context, or a copy carrying what an interceptor changed in the request),
 * but without touching the parts of the context nobody uses: connect's
 * copies the context's signal and headers into the request and spreads the
 * context into a new object for the implementation, which makes every lazy
 * part of a {@link GrpcCallContext} on every call.
 *
 * What stays the same for every call is made once per method: the chain of
 * interceptors is applied once (an interceptor keeps per-call state inside
 * the function it returns, as all of casq's do), and the request is a class
 * whose `signal` and `header` are getters of the class, read from the call's
 * context on first use (an object literal with getters would get a hidden
 * class of its own per call, which keeps the call alive into V8's old
 * generation: see grpc-js-call-context.ts).
 *
 * A spread of the request (`next({ ...req, message })`) keeps its own
 * properties, among them the call (under a symbol), but not the getters: the
 * next interceptor gets a copy with `header` and `signal` put back (made then,
 * as connect would have), so interceptors can copy requests as they do with
 * connect's. The response is a plain object (its `header` and `trailer` are
 * the context's, made then: two empty Headers cost less than getters would).
 */
import { create, isMessage } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  type ContextValues,
  type HandlerContext,
  type Interceptor,
  type MethodImplSpec,
  type UnaryRequest,
  type UnaryResponse,
} from "@connectrpc/connect";
import type { GrpcCallContext } from "./grpc-js-call-context.ts";

/** A unary method's implementation, as `createServiceImplSpec` returns it. */
export type UnaryImplSpec = Extract<MethodImplSpec, { kind: "unary" }>;

/** Runs one call of a method: resolves with the response message. */
export type UnaryInvoker = (context: GrpcCallContext, message: unknown) => Promise<unknown>;

type AnyFn = (req: UnaryRequest) => Promise<UnaryResponse>;

/** Where a request (and every spread copy of it) carries its call's context. */
const CALL = Symbol("casq: the grpc-js call of this request");

/** A request as interceptors see it, possibly a copy another interceptor made. */
type CarriedRequest = UnaryRequest & { readonly [CALL]?: GrpcCallContext };

/** The request of one call (see the module header). */
class UnaryCallRequest {
  readonly stream = false;
  readonly requestMethod: string;
  readonly url: string;
  readonly contextValues: ContextValues;
  readonly [CALL]: GrpcCallContext;

  constructor(
    readonly message: unknown,
    readonly method: UnaryImplSpec["method"],
    readonly service: UnaryImplSpec["method"]["parent"],
    context: GrpcCallContext,
  ) {
    this.requestMethod = context.requestMethod;
    this.url = context.url;
    this.contextValues = context.values;
    this[CALL] = context;
  }

  get signal(): AbortSignal {
    return this[CALL].signal;
  }

  get header(): Headers {
    return this[CALL].requestHeader;
  }
}

/**
 * The invoker of `spec` through `interceptors` (outermost first), made once
 * per method (see the module header).
 */
export function createUnaryInvoker(spec: UnaryImplSpec, interceptors: readonly Interceptor[]): UnaryInvoker {
  const { method } = spec;
  const service = method.parent;
  const implementation: AnyFn = async (req) => {
    const context = callOf(req);
    const implContext: HandlerContext =
      req instanceof UnaryCallRequest
        ? context
        : {
            ...context.toPlainContext(),
            service: req.service,
            requestHeader: req.header,
            signal: req.signal,
            values: req.contextValues,
          };
    const out = await spec.impl(req.message as never, implContext);
    return {
      stream: false,
      method,
      service,
      message: isMessage(out, method.output) ? out : create(method.output, out as never),
      header: context.responseHeader,
      trailer: context.responseTrailer,
    } as UnaryResponse;
  };
  let next = implementation;
  for (let i = interceptors.length - 1; i >= 0; i -= 1)
    next = (interceptors[i] as Interceptor)(withGetterParts(next) as never) as AnyFn;
  const chain = next;
  return async (context, message) => {
    const res = await chain(new UnaryCallRequest(message, method, service, context) as never);
    copyHeaders(res.header, context.responseHeader);
    copyHeaders(res.trailer, context.responseTrailer);
    return res.message;
  };
}

/** The call a request belongs to. */
function callOf(req: CarriedRequest): GrpcCallContext {
  const context = req[CALL];
  if (context === undefined)
    throw new ConnectError(
      "an interceptor replaced a unary request with one that does not carry its call: copy the request with a spread",
      Code.Internal,
    );
  return context;
}

/** `next`, given requests whose `header` and `signal` a spread copy lost put back. */
function withGetterParts(next: AnyFn): AnyFn {
  return (req) => {
    if (req instanceof UnaryCallRequest || (req.header !== undefined && req.signal !== undefined))
      return next(req);
    const context = callOf(req);
    return next({
      ...req,
      header: req.header ?? context.requestHeader,
      signal: req.signal ?? context.signal,
    });
  };
}

/** Makes `to` hold exactly `from` (what connect does with a response an interceptor replaced). */
function copyHeaders(from: Headers, to: Headers): void {
  if (from === to) return;
  for (const key of [...to.keys()]) to.delete(key);
  from.forEach((value, key) => {
    to.set(key, value);
  });
}
