/**
 * casq's Connect service implementations, served to gRPC clients through
 * @grpc/grpc-js.
 *
 * The services are written once, as Connect `ServiceImpl`s; connect-node
 * serves them to Connect and gRPC-Web clients, and this adapter registers
 * every method of the same implementations on a grpc-js `Server` for gRPC
 * clients (grpc-js costs a fraction of connect-node's CPU per call: see
 * docs/benchmarks.md). Per call it does what connect's own gRPC handler does:
 *
 * - **Messages**: grpc-js hands over raw bytes; they are parsed and
 *   serialized with connect's serialization for the method (@bufbuild/protobuf
 *   binary), so a body that does not parse fails as it does in connect: a
 *   unary request before any interceptor (answered with `malformedRequest`),
 *   a request stream while the handler reads it (an INTERNAL error the
 *   interceptors see).
 * - **Context**: a Connect `HandlerContext` with the request metadata as
 *   headers, the call's deadline, a fresh set of context values, and a signal
 *   aborted when the client cancels, the deadline passes, the server shuts
 *   down, or the call is done (grpc-js-call-context.ts: its costly parts are
 *   made on first use).
 * - **Interceptors**: the server's Connect interceptors run around every
 *   call (unary calls through unary-invocation.ts, streams through connect's
 *   own invocation), so auth, call tracking, metrics, tracing and error
 *   mapping are the same code for both stacks.
 * - **Answers**: response headers and trailers the handler (or an
 *   interceptor) set go out as gRPC metadata; an error becomes the gRPC
 *   status with its metadata (e.g. the leader-redirect trailer) and its
 *   details in `grpc-status-details-bin`, encoded by connect, so clients see
 *   the same bytes from either stack.
 * - **Streams**: response messages are written with back-pressure (the
 *   handler's next message is pulled only once grpc-js took the last one);
 *   a cancelled call stops pulling and ends the handler's stream.
 */
import type { DescMethod, DescService } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  type ContextValues,
  createContextValues,
  createServiceImplSpec,
  type Interceptor,
  type MethodImplSpec,
  type ServiceImpl,
} from "@connectrpc/connect";
import { createMethodSerializationLookup, transformInvokeImplementation } from "@connectrpc/connect/protocol";
import { setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import * as grpc from "@grpc/grpc-js";
import { batchStreamWrites } from "./grpc-js-batched-writes.ts";
import { CallSignals, type CancellableCall, GrpcJsCallContext } from "./grpc-js-call-context.ts";
import { createUnaryInvoker, type UnaryImplSpec, type UnaryInvoker } from "./unary-invocation.ts";

/** Options of {@link registerConnectService}. */
export interface GrpcJsAdapterOptions {
  /**
   * Connect interceptors run around every call, outermost first (as connect-node's `interceptors`).
   * For unary methods each is applied once per method, not per call: per-call state belongs in the
   * function an interceptor returns.
   */
  readonly interceptors: readonly Interceptor[];
  /** Aborts the context of every call when the server shuts down. */
  readonly shutdownSignal?: AbortSignal;
  /** Largest request message parsed (bytes); grpc-js refuses larger ones first when configured alike. */
  readonly readMaxBytes: number;
  /** The context values of one call: a fresh set per call. */
  readonly contextValues?: (call: GrpcJsCall) => ContextValues;
  /**
   * The error a unary call answers when its request message does not parse
   * (`cause` is connect's parse error); default: `cause` itself.
   */
  readonly malformedRequest?: (method: DescMethod, cause: ConnectError) => ConnectError;
}

/** The grpc-js status of a failed call. */
interface GrpcStatus {
  readonly code: number;
  readonly details: string;
  readonly metadata: grpc.Metadata;
}

/** A call of any kind, as grpc-js hands it to a handler. */
export type GrpcJsCall =
  | grpc.ServerUnaryCall<Buffer, unknown>
  | grpc.ServerReadableStream<Buffer, unknown>
  | grpc.ServerWritableStream<Buffer, unknown>
  | grpc.ServerDuplexStream<Buffer, unknown>;

type Serialization = ReturnType<ReturnType<typeof createMethodSerializationLookup>["getI"]>;

/**
 * The reason a call's context is aborted with once the call is over. One
 * object made once: an abort without a reason builds a DOMException with a
 * stack trace for every call (a tenth of connect-node's CPU per call).
 */
const CALL_ENDED = new ConnectError("the call has ended", Code.Canceled);

/** grpc-js passes request bytes through untouched: they are parsed per call (see the module header). */
const passBytes = (bytes: Buffer): Buffer => bytes;

/**
 * Registers every method of `service`, answered by `impl`, on the grpc-js
 * `server` (unary, server-streaming, client-streaming and bidi methods).
 * Methods missing from `impl` answer UNIMPLEMENTED, as in connect.
 */
export function registerConnectService<S extends DescService>(
  server: grpc.Server,
  service: S,
  impl: Partial<ServiceImpl<S>>,
  options: GrpcJsAdapterOptions,
): void {
  const spec = createServiceImplSpec(service, impl);
  // The calls in flight of this service, aborted when the server shuts down.
  const signals = new CallSignals(options.shutdownSignal);
  for (const method of service.methods) {
    const methodSpec = spec.methods[method.localName];
    if (methodSpec === undefined) continue;
    const io = createMethodSerializationLookup(method, undefined, undefined, {
      readMaxBytes: options.readMaxBytes,
      writeMaxBytes: 0xffffffff,
    });
    const call = new MethodCalls(service, method, methodSpec, io.getI(true), io.getO(true), options, signals);
    const serialize = (message: unknown): Buffer => {
      const bytes = call.output.serialize(message as never);
      return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    };
    const path = `/${service.typeName}/${method.name}`;
    const register = (
      handler: grpc.UntypedHandleCall,
      type: "unary" | "clientStream" | "serverStream" | "bidi",
    ) => server.register(path, handler as never, serialize, passBytes, type);
    switch (method.methodKind) {
      case "unary":
        register(
          ((c, callback) => call.unary(c, callback)) as grpc.handleUnaryCall<Buffer, unknown>,
          "unary",
        );
        break;
      case "server_streaming":
        register(
          ((c) => call.serverStreaming(c)) as grpc.handleServerStreamingCall<Buffer, unknown>,
          "serverStream",
        );
        break;
      case "client_streaming":
        register(
          ((c, callback) => call.clientStreaming(c, callback)) as grpc.handleClientStreamingCall<
            Buffer,
            unknown
          >,
          "clientStream",
        );
        break;
      case "bidi_streaming":
        register(((c) => call.bidiStreaming(c)) as grpc.handleBidiStreamingCall<Buffer, unknown>, "bidi");
        break;
    }
  }
}

/** The calls of one method. */
class MethodCalls {
  private readonly interceptors: Interceptor[];
  /** The interceptors applied to the implementation, once for all calls of a unary method. */
  private readonly invokeUnary: UnaryInvoker | undefined;

  constructor(
    private readonly service: DescService,
    private readonly method: DescMethod,
    private readonly spec: MethodImplSpec,
    private readonly input: Serialization,
    readonly output: Serialization,
    private readonly options: GrpcJsAdapterOptions,
    private readonly signals: CallSignals,
  ) {
    this.interceptors = [...options.interceptors];
    this.invokeUnary =
      spec.kind === "unary" ? createUnaryInvoker(spec as UnaryImplSpec, this.interceptors) : undefined;
  }

  unary(call: grpc.ServerUnaryCall<Buffer, unknown>, callback: grpc.sendUnaryData<unknown>): void {
    const context = this.context(call);
    let request: unknown;
    try {
      request = this.input.parse(call.request);
    } catch (error) {
      const cause = ConnectError.from(error);
      const mapped = this.options.malformedRequest?.(this.method, cause) ?? cause;
      context.abort(CALL_ENDED);
      callback(statusOf(mapped, context.responseTrailerIfAny()));
      return;
    }
    (this.invokeUnary as UnaryInvoker)(context, request).then(
      (message) => {
        sendHeader(call, context);
        callback(null, message, metadataOf(context.responseTrailerIfAny()));
        context.abort(CALL_ENDED);
      },
      (error: unknown) => {
        callback(statusOf(error, context.responseTrailerIfAny()));
        context.abort(CALL_ENDED);
      },
    );
  }

  serverStreaming(call: grpc.ServerWritableStream<Buffer, unknown>): void {
    const input = this.input;
    const bytes = call.request;
    async function* single() {
      yield input.parse(bytes);
    }
    const context = this.context(call);
    void this.respond(call, context, single());
  }

  bidiStreaming(call: grpc.ServerDuplexStream<Buffer, unknown>): void {
    const context = this.context(call);
    void this.respond(call, context, readRequests(call, this.input));
  }

  clientStreaming(
    call: grpc.ServerReadableStream<Buffer, unknown>,
    callback: grpc.sendUnaryData<unknown>,
  ): void {
    const context = this.context(call);
    // Connect's invocation copies the context with a spread: it gets a plain one.
    const output = transformInvokeImplementation(
      this.spec as never,
      context.toPlainContext(),
      this.interceptors,
    )(readRequests(call, this.input) as never);
    (async () => {
      let message: unknown;
      for await (const m of output) message = m;
      return message;
    })().then(
      (message) => {
        sendHeader(call, context);
        callback(null, message, metadataOf(context.responseTrailerIfAny()));
        context.abort(CALL_ENDED);
      },
      (error: unknown) => {
        callback(statusOf(error, context.responseTrailerIfAny()));
        context.abort(CALL_ENDED);
      },
    );
  }

  /** Runs a streaming-response handler and writes its messages to `call`, then its status. */
  private async respond(
    call: grpc.ServerWritableStream<Buffer, unknown> | grpc.ServerDuplexStream<Buffer, unknown>,
    context: GrpcJsCallContext,
    requests: AsyncIterable<unknown>,
  ): Promise<void> {
    let wake: (() => void) | undefined;
    let cancelled = false;
    // The handler's stream ends through the context's signal; this loop stops writing.
    const onCancel = () => {
      cancelled = true;
      wake?.();
    };
    const events = call as NodeJS.EventEmitter;
    events.once("cancelled", onCancel);
    const onDrain = () => wake?.();
    call.on("drain", onDrain);
    // Messages written while one is on its way go out together (grpc-js alone sends one per turn).
    batchStreamWrites(call);
    // Connect's invocation copies the context with a spread: it gets a plain one. That reads the
    // signal now, so it is aborted when the call is cancelled.
    const output = transformInvokeImplementation(
      this.spec as never,
      context.toPlainContext(),
      this.interceptors,
    )(requests as never)[Symbol.asyncIterator]();
    let headerSent = false;
    try {
      for (;;) {
        const next = await output.next();
        if (next.done || cancelled) break;
        if (!headerSent) {
          sendHeader(call, context);
          headerSent = true;
        }
        if (!call.write(next.value)) {
          await new Promise<void>((resolve) => {
            wake = resolve;
          });
          wake = undefined;
          if (cancelled) break;
        }
      }
      if (cancelled) {
        await output.return?.();
        return;
      }
      if (!headerSent) sendHeader(call, context);
      call.end(metadataOf(context.responseTrailerIfAny()) ?? new grpc.Metadata());
    } catch (error) {
      if (!cancelled) call.emit("error", statusOf(error, context.responseTrailerIfAny()));
    } finally {
      events.removeListener("cancelled", onCancel);
      call.removeListener("drain", onDrain);
      context.abort(CALL_ENDED);
    }
  }

  private context(call: GrpcJsCall): GrpcJsCallContext {
    const deadline = call.getDeadline();
    return new GrpcJsCallContext(
      this.service,
      this.method,
      call.getPath(),
      this.options.contextValues?.(call) ?? createContextValues(),
      deadline instanceof Date ? deadline.getTime() : deadline,
      this.signals,
      call as CancellableCall,
    );
  }
}

/** Request messages buffered before the call is paused (grpc-js stops reading the HTTP/2 stream). */
const READ_AHEAD = 16;

/**
 * The request messages of a streaming call, parsed as the handler reads
 * them. Read from the call's events rather than its async iterator: that
 * iterator destroys the call when an error is emitted on it, which is how a
 * status is sent (see `respond`), and the status would be lost.
 */
function readRequests(
  call: grpc.ServerReadableStream<Buffer, unknown> | grpc.ServerDuplexStream<Buffer, unknown>,
  input: Serialization,
): AsyncIterable<unknown> {
  return {
    [Symbol.asyncIterator](): AsyncIterator<unknown> {
      const buffered: Buffer[] = [];
      let ended = false;
      let cancelled = false;
      let wake: (() => void) | undefined;
      const events = call as NodeJS.EventEmitter;
      const onData = (bytes: Buffer) => {
        buffered.push(bytes);
        if (buffered.length >= READ_AHEAD) call.pause();
        wake?.();
      };
      const onEnd = () => {
        ended = true;
        wake?.();
      };
      const onClose = () => {
        if (!ended) cancelled = true;
        wake?.();
      };
      const stop = () => {
        events.removeListener("data", onData);
        events.removeListener("end", onEnd);
        events.removeListener("close", onClose);
        events.removeListener("cancelled", onClose);
      };
      events.on("data", onData);
      events.once("end", onEnd);
      events.once("close", onClose);
      events.once("cancelled", onClose);
      return {
        async next(): Promise<IteratorResult<unknown>> {
          for (;;) {
            const bytes = buffered.shift();
            if (bytes !== undefined) {
              if (buffered.length === READ_AHEAD / 2) call.resume();
              return { done: false, value: input.parse(bytes) };
            }
            if (ended) {
              stop();
              return { done: true, value: undefined };
            }
            if (cancelled || call.cancelled) {
              stop();
              throw new ConnectError("the client cancelled the call", Code.Canceled);
            }
            await new Promise<void>((resolve) => {
              wake = resolve;
            });
            wake = undefined;
          }
        },
        async return(): Promise<IteratorResult<unknown>> {
          stop();
          return { done: true, value: undefined };
        },
      };
    },
  };
}

/** Sends the response headers a handler set, if any (grpc-js sends empty ones by itself). */
function sendHeader(call: GrpcJsCall, context: GrpcJsCallContext): void {
  const metadata = metadataOf(context.responseHeaderIfAny());
  if (metadata) call.sendMetadata(metadata);
}

/** Keys grpc-js writes itself, or that are no metadata. */
const RESERVED = new Set(["grpc-status", "grpc-message", "content-type", "te"]);

/** `headers` as gRPC metadata (binary `-bin` values decoded from base64); undefined when empty. */
function metadataOf(headers: Headers | undefined): grpc.Metadata | undefined {
  if (headers === undefined) return undefined;
  let metadata: grpc.Metadata | undefined;
  headers.forEach((value, key) => {
    if (RESERVED.has(key)) return;
    metadata ??= new grpc.Metadata();
    if (key.endsWith("-bin"))
      for (const part of value.split(/,\s*/)) metadata.add(key, Buffer.from(part, "base64"));
    else metadata.add(key, value);
  });
  return metadata;
}

/**
 * The gRPC status of a failed call, as connect's gRPC handler writes it:
 * the error's metadata and the trailers set so far, and its details as a
 * `google.rpc.Status` in `grpc-status-details-bin`.
 */
function statusOf(error: unknown, trailer: Headers | undefined): GrpcStatus {
  const connectError =
    error instanceof ConnectError
      ? error
      : new ConnectError("internal error", Code.Internal, undefined, undefined, error);
  const headers = setTrailerStatus(new Headers(trailer), connectError);
  return {
    code: connectError.code,
    details: connectError.rawMessage,
    metadata: metadataOf(headers) ?? new grpc.Metadata(),
  };
}
