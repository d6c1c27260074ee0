/**
 * The Connect `HandlerContext` of one gRPC call served through grpc-js
 * (see grpc-js-adapter.ts).
 *
 * Built by hand rather than with connect's `createHandlerContext`, which
 * makes two AbortControllers, a deadline timer, a listener on the server's
 * shutdown signal and three `Headers` for every call: together a fifth of a
 * trivial call's CPU. Here the costly parts are made on first use, and most
 * calls never use them:
 * - **signal**: one AbortController, made when the handler or an
 *   interceptor first reads `signal`. From then on it is aborted when grpc-js
 *   reports the call cancelled (by the client, or at the deadline: grpc-js
 *   runs the deadline timer and answers DEADLINE_EXCEEDED itself; the reason
 *   is then a DEADLINE_EXCEEDED error, as connect's), when the server shuts
 *   down ({@link CallSignals} aborts every live signal with the shutdown
 *   signal's reason), and when the call is over. A signal first read after
 *   any of these is made aborted.
 * - **headers**: the request headers (from the gRPC metadata) and the
 *   response headers and trailers are made when first read.
 */
import type { DescMethod, DescService } from "@bufbuild/protobuf";
import { Code, ConnectError, type ContextValues, type HandlerContext } from "@connectrpc/connect";

/** A HandlerContext the adapter can abort and ask for what the handler set. */
export interface GrpcCallContext extends HandlerContext {
  /** Aborts the call's signal with `reason` (once; later calls do nothing). */
  abort(reason: unknown): void;
  /** The response headers, if anything read them (and so may have set some). */
  responseHeaderIfAny(): Headers | undefined;
  /** The response trailers, if anything read them. */
  responseTrailerIfAny(): Headers | undefined;
}

/** The abort controllers of the calls in flight, aborted together when the server shuts down. */
export class CallSignals {
  private readonly live = new Set<AbortController>();
  private shutdown: { reason: unknown } | undefined;

  constructor(shutdownSignal?: AbortSignal) {
    if (shutdownSignal === undefined) return;
    const onShutdown = () => {
      this.shutdown = { reason: shutdownSignal.reason };
      for (const controller of this.live) controller.abort(shutdownSignal.reason);
      this.live.clear();
    };
    if (shutdownSignal.aborted) onShutdown();
    else shutdownSignal.addEventListener("abort", onShutdown, { once: true });
  }

  /** A controller for a call (already aborted once the server shuts down). */
  open(): AbortController {
    const controller = new AbortController();
    if (this.shutdown) controller.abort(this.shutdown.reason);
    else this.live.add(controller);
    return controller;
  }

  /** Forgets the controller of a call that is over. */
  close(controller: AbortController): void {
    this.live.delete(controller);
  }
}

/** The grpc-js side of a call, as the context needs it. */
export interface CancellableCall {
  readonly cancelled: boolean;
  once(event: "cancelled", listener: () => void): unknown;
  removeListener(event: "cancelled", listener: () => void): unknown;
}

/** What {@link createGrpcCallContext} needs to know of a call. */
export interface GrpcCallInit {
  readonly service: DescService;
  readonly method: DescMethod;
  /** The request path, `/package.Service/Method`. */
  readonly url: string;
  /** The request metadata as HTTP/2 headers (called at most once, on first use). */
  readonly requestHeader: () => Record<string, string | string[]>;
  /** When the call's deadline passes (ms since the epoch), or Infinity. */
  readonly deadline: number;
  readonly values: ContextValues;
  readonly signals: CallSignals;
  readonly call: CancellableCall;
}

/** The context of one call (see the module header). */
export function createGrpcCallContext(init: GrpcCallInit): GrpcCallContext {
  const { deadline, signals, call } = init;
  let controller: AbortController | undefined;
  let ended: { reason: unknown } | undefined;
  let requestHeader: Headers | undefined;
  let responseHeader: Headers | undefined;
  let responseTrailer: Headers | undefined;
  const timeoutMs = Number.isFinite(deadline) ? () => deadline - Date.now() : () => undefined;
  const onCancel = () => context.abort(cancelReason(timeoutMs()));
  const context: GrpcCallContext = {
    service: init.service,
    method: init.method,
    protocolName: "grpc",
    requestMethod: "POST",
    url: init.url,
    values: init.values,
    timeoutMs,
    get signal() {
      if (controller === undefined) {
        controller = signals.open();
        if (ended) {
          signals.close(controller);
          controller.abort(ended.reason);
        } else if (call.cancelled) {
          onCancel();
        } else {
          call.once("cancelled", onCancel);
        }
      }
      return controller.signal;
    },
    get requestHeader() {
      requestHeader ??= new Headers(init.requestHeader() as Record<string, string>);
      return requestHeader;
    },
    get responseHeader() {
      responseHeader ??= new Headers();
      return responseHeader;
    },
    get responseTrailer() {
      responseTrailer ??= new Headers();
      return responseTrailer;
    },
    responseHeaderIfAny: () => responseHeader,
    responseTrailerIfAny: () => responseTrailer,
    abort(reason) {
      if (ended) return;
      ended = { reason };
      if (controller === undefined) return;
      call.removeListener("cancelled", onCancel);
      signals.close(controller);
      controller.abort(reason);
    },
  };
  return context;
}

/** Why a call that grpc-js reports cancelled was: its deadline passed (`timeoutMs` <= 0), or the client. */
function cancelReason(timeoutMs: number | undefined): ConnectError {
  return timeoutMs !== undefined && timeoutMs <= 0
    ? new ConnectError("the call's deadline passed", Code.DeadlineExceeded)
    : new ConnectError("the client cancelled the call", Code.Canceled);
}
