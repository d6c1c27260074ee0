/**
 * Runs a unary Connect implementation through Connect interceptors for a
 * call served by grpc-js, as connect's own `invokeUnaryImplementation` does
 * (the first interceptor is the outermost; the implementation gets the
 * context, or a copy carrying what an interceptor changed in the request),
 * but without touching the parts of the context nobody uses: connect's
 * copies the context's signal and headers into the request and spreads the
 * context into a new object for the implementation, which makes every lazy
 * part of a {@link GrpcCallContext} on every call.
 */
import { create, isMessage } from "@bufbuild/protobuf";
import type {
  HandlerContext,
  Interceptor,
  MethodImplSpec,
  UnaryRequest,
  UnaryResponse,
} from "@connectrpc/connect";
import type { GrpcCallContext } from "./grpc-js-call-context.ts";

/** A unary method's implementation, as `createServiceImplSpec` returns it. */
export type UnaryImplSpec = Extract<MethodImplSpec, { kind: "unary" }>;

type AnyFn = (req: UnaryRequest) => Promise<UnaryResponse>;

/** Runs `spec` for `message` through `interceptors`; resolves with the response message. */
export async function invokeUnary(
  spec: UnaryImplSpec,
  context: GrpcCallContext,
  message: unknown,
  interceptors: readonly Interceptor[],
): Promise<unknown> {
  const { method } = spec;
  const service = method.parent;
  const request = {
    stream: false,
    message,
    method,
    service,
    requestMethod: context.requestMethod,
    url: context.url,
    contextValues: context.values,
    get signal() {
      return context.signal;
    },
    get header() {
      return context.requestHeader;
    },
  } as UnaryRequest;
  let own: UnaryResponse | undefined;
  const implementation: AnyFn = async (req) => {
    const implContext: HandlerContext =
      req === request
        ? context
        : {
            ...context,
            service: req.service,
            requestHeader: req.header,
            signal: req.signal,
            values: req.contextValues,
          };
    const out = await spec.impl(req.message as never, implContext);
    own = {
      stream: false,
      method,
      service,
      message: isMessage(out, method.output) ? out : create(method.output, out as never),
      get header() {
        return context.responseHeader;
      },
      get trailer() {
        return context.responseTrailer;
      },
    } as UnaryResponse;
    return own;
  };
  let next = implementation;
  for (let i = interceptors.length - 1; i >= 0; i -= 1)
    next = (interceptors[i] as Interceptor)(next as never) as AnyFn;
  const res = await next(request);
  if (res !== own) {
    copyHeaders(res.header, context.responseHeader);
    copyHeaders(res.trailer, context.responseTrailer);
  }
  return res.message;
}

/** Makes `to` hold exactly `from` (what connect does with a response an interceptor replaced). */
function copyHeaders(from: Headers, to: Headers): void {
  if (from === to) return;
  for (const key of [...to.keys()]) to.delete(key);
  from.forEach((value, key) => {
    to.set(key, value);
  });
}
