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
 *
 * The context is a class instance, its lazy parts getters of the class: an
 * object literal with getters (`{ get signal() { ... } }`) gets a hidden class
 * of its own every time it is evaluated, and that hidden class, which V8
 * keeps in its old generation until the next full collection, holds the
 * getters and through them the whole call (stream, metadata, buffers). Every
 * call then outlived the young generation: a quarter of a trivial call's CPU
 * went to garbage collection. A spread (`{ ...context }`) sees none of the
 * class's getters and methods; code that copies a context (connect's stream
 * invocation does) gets {@link GrpcJsCallContext.toPlainContext}.
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
  /** This context as a plain object, for code that copies it with a spread. */
  toPlainContext(): HandlerContext;
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
  /** The request metadata (read at most once, when the request headers are first read). */
  readonly metadata: { toHttp2Headers(): Record<string, unknown> };
  once(event: "cancelled", listener: () => void): unknown;
  removeListener(event: "cancelled", listener: () => void): unknown;
}

/** The context of one call (see the module header). */
export class GrpcJsCallContext implements GrpcCallContext {
  readonly protocolName = "grpc";
  readonly requestMethod = "POST";
  private controller: AbortController | undefined;
  private ended: { reason: unknown } | undefined;
  private onCancel: (() => void) | undefined;
  private requestHeaders: Headers | undefined;
  private responseHeaders: Headers | undefined;
  private responseTrailers: Headers | undefined;

  /**
   * @param url the request path, `/package.Service/Method`
   * @param deadline when the call's deadline passes (ms since the epoch), or Infinity
   */
  constructor(
    readonly service: DescService,
    readonly method: DescMethod,
    readonly url: string,
    readonly values: ContextValues,
    private readonly deadline: number,
    private readonly signals: CallSignals,
    private readonly call: CancellableCall,
  ) {}

  timeoutMs(): number | undefined {
    return Number.isFinite(this.deadline) ? this.deadline - Date.now() : undefined;
  }

  get signal(): AbortSignal {
    if (this.controller === undefined) {
      const controller = this.signals.open();
      this.controller = controller;
      if (this.ended) {
        this.signals.close(controller);
        controller.abort(this.ended.reason);
      } else if (this.call.cancelled) {
        this.abort(cancelReason(this.timeoutMs()));
      } else {
        this.onCancel = () => this.abort(cancelReason(this.timeoutMs()));
        this.call.once("cancelled", this.onCancel);
      }
    }
    return this.controller.signal;
  }

  get requestHeader(): Headers {
    this.requestHeaders ??= new Headers(this.call.metadata.toHttp2Headers() as Record<string, string>);
    return this.requestHeaders;
  }

  get responseHeader(): Headers {
    this.responseHeaders ??= new Headers();
    return this.responseHeaders;
  }

  get responseTrailer(): Headers {
    this.responseTrailers ??= new Headers();
    return this.responseTrailers;
  }

  responseHeaderIfAny(): Headers | undefined {
    return this.responseHeaders;
  }

  responseTrailerIfAny(): Headers | undefined {
    return this.responseTrailers;
  }

  abort(reason: unknown): void {
    if (this.ended) return;
    this.ended = { reason };
    const controller = this.controller;
    if (controller === undefined) return;
    if (this.onCancel) this.call.removeListener("cancelled", this.onCancel);
    this.signals.close(controller);
    controller.abort(reason);
  }

  /**
   * The context as a plain object, every part an own property (the signal and
   * the headers made now, the same objects this context hands out), for code
   * that copies contexts with a spread.
   */
  toPlainContext(): HandlerContext {
    return {
      service: this.service,
      method: this.method,
      protocolName: this.protocolName,
      requestMethod: this.requestMethod,
      url: this.url,
      values: this.values,
      timeoutMs: () => this.timeoutMs(),
      signal: this.signal,
      requestHeader: this.requestHeader,
      responseHeader: this.responseHeader,
      responseTrailer: this.responseTrailer,
    };
  }
}

/** Why a call that grpc-js reports cancelled was: its deadline passed (`timeoutMs` <= 0), or the client. */
function cancelReason(timeoutMs: number | undefined): ConnectError {
  return timeoutMs !== undefined && timeoutMs <= 0
    ? new ConnectError("the call's deadline passed", Code.DeadlineExceeded)
    : new ConnectError("the client cancelled the call", Code.Canceled);
}
