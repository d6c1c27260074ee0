/**
 * A request body that is not a valid message is the client's fault:
 * INVALID_ARGUMENT, and at most a rate-limited warning in the log.
 *
 * @connectrpc/connect parses request messages itself and reports one that
 * does not parse ("parse binary: illegal tag ...") as INTERNAL. Where it
 * parses decides how casq corrects that:
 *
 * - **Streams** (Work, GetDocument): the handler reads the request messages,
 *   so the failure passes through the interceptors. {@link malformedRequestInterceptor}
 *   wraps the request stream: an INTERNAL error from reading it is the
 *   request's fault and becomes INVALID_ARGUMENT.
 * - **Unary calls**: the message is parsed before any interceptor runs.
 *   The same interceptor marks each call it sees ({@link MALFORMED_SEEN}); a
 *   unary call that ends INTERNAL without the mark failed while the framework
 *   read its request, and {@link withMalformedRequestStatus} rewrites its
 *   status to INVALID_ARGUMENT in the protocol's own form: the gRPC trailer,
 *   the gRPC-Web trailer frame, or the Connect JSON error (HTTP 400).
 *
 * gRPC clients are served by @grpc/grpc-js (grpc-js-adapter.ts), which hands
 * over raw bytes: a unary request that does not parse is answered with
 * {@link malformedUnaryRequest} before any interceptor runs; a request stream
 * fails while the handler reads it, as above.
 *
 * INTERNAL errors of casq's own handlers always carry the mark and are never
 * rewritten: they are bugs, logged at error level by the error interceptor.
 */
import type { DescMethod } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextKey, type Interceptor } from "@connectrpc/connect";
import { createAsyncIterable, encodeEnvelope, type UniversalHandler } from "@connectrpc/connect/protocol";
import { codeToHttpStatus, errorFromJsonBytes, errorToJsonBytes } from "@connectrpc/connect/protocol-connect";
import { findTrailerError, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { trailerFlag, trailerParse, trailerSerialize } from "@connectrpc/connect/protocol-grpc-web";
import type { Logger } from "pino";
import type { Clock } from "../util/clock.ts";
import { capStatusMessage } from "./grpc-errors.ts";

/** Context key set by {@link malformedRequestInterceptor} on every call it sees. */
export const MALFORMED_SEEN = createContextKey(false, { description: "casq: the interceptors ran" });

/** At most one warning about malformed requests this often (ms). */
const WARN_EVERY_MS = 10_000;

/** Logs malformed requests as one warning per {@link WARN_EVERY_MS}, counting the ones in between. */
export class MalformedRequestLog {
  private lastWarnAt = Number.NEGATIVE_INFINITY;
  private suppressed = 0;

  constructor(
    private readonly logger: Logger,
    private readonly clock: Clock,
  ) {}

  /** Records one malformed request to `rpc`. */
  record(rpc: string, message: string): void {
    const now = this.clock.now();
    if (now - this.lastWarnAt < WARN_EVERY_MS) {
      this.suppressed += 1;
      return;
    }
    this.logger.warn(
      { rpc, error: message, alsoSince: this.suppressed },
      "a request body was not a valid message; answered INVALID_ARGUMENT (more such requests are logged at most every 10 s)",
    );
    this.lastWarnAt = now;
    this.suppressed = 0;
  }
}

function invalidBody(rpc: string, cause: ConnectError): ConnectError {
  return new ConnectError(
    capStatusMessage(`the request is not a valid ${rpc} message: ${cause.rawMessage}`),
    Code.InvalidArgument,
    undefined,
    undefined,
    cause,
  );
}

/**
 * The INVALID_ARGUMENT error of a unary call to `method` whose request
 * message did not parse (`cause`: the parse error); records it in `log`.
 */
export function malformedUnaryRequest(
  log: MalformedRequestLog,
  method: DescMethod,
  cause: ConnectError,
): ConnectError {
  log.record(`${method.parent.typeName}/${method.name}`, cause.rawMessage);
  return invalidBody(method.input.typeName, cause);
}

/**
 * The interceptor (put it first) that marks every call it sees and turns an
 * INTERNAL error from reading a request stream into INVALID_ARGUMENT.
 */
export function malformedRequestInterceptor(log: MalformedRequestLog): Interceptor {
  return (next) => async (req) => {
    req.contextValues.set(MALFORMED_SEEN, true);
    if (!req.stream) return next(req);
    const rpc = req.method.input.typeName;
    const source = req.message;
    async function* checked() {
      try {
        yield* source;
      } catch (error) {
        if (error instanceof ConnectError && error.code === Code.Internal) {
          log.record(`${req.service.typeName}/${req.method.name}`, error.rawMessage);
          throw invalidBody(rpc, error);
        }
        throw error;
      }
    }
    return next({ ...req, message: checked() });
  };
}

/**
 * Wraps the router's unary handlers so that a call that ended INTERNAL
 * before the interceptors ran answers INVALID_ARGUMENT instead (see the
 * module header). Streaming handlers are returned unchanged.
 */
export function withMalformedRequestStatus(
  handler: UniversalHandler,
  log: MalformedRequestLog,
): UniversalHandler {
  if (handler.method.methodKind !== "unary") return handler;
  const rpc = `${handler.service.typeName}/${handler.method.name}`;
  const typeName = handler.method.input.typeName;
  const wrapped = async (req: Parameters<UniversalHandler>[0]) => {
    const res = await handler(req);
    if (req.contextValues?.get(MALFORMED_SEEN)) return res;
    const type = res.header?.get("content-type") ?? "";
    const rewrite = (error: ConnectError): ConnectError => {
      log.record(rpc, error.rawMessage);
      return invalidBody(typeName, error);
    };
    if (type.startsWith("application/grpc-web")) {
      const body = await collect(res.body);
      const frames = splitEnvelopes(body);
      const last = frames.at(-1);
      if (last === undefined || (last.flags & trailerFlag) !== trailerFlag)
        return { ...res, body: once(body) };
      const trailer = trailerParse(last.data);
      const error = findTrailerError(trailer);
      if (error?.code !== Code.Internal) return { ...res, body: once(body) };
      const fixed = new Headers();
      setTrailerStatus(fixed, rewrite(error));
      const out = [...frames.slice(0, -1).map((f) => encodeEnvelope(f.flags, f.data))];
      out.push(encodeEnvelope(trailerFlag, trailerSerialize(fixed)));
      return { ...res, body: createAsyncIterable(out) };
    }
    if (type.startsWith("application/grpc")) {
      const error = res.trailer ? findTrailerError(res.trailer) : undefined;
      if (res.trailer && error?.code === Code.Internal) {
        const fixed = new Headers();
        setTrailerStatus(fixed, rewrite(error));
        res.trailer.delete("grpc-status-details-bin");
        for (const [key, value] of fixed) res.trailer.set(key, value);
      }
      return res;
    }
    // The Connect protocol: an error is a JSON body with the HTTP status of its code.
    if (res.status !== codeToHttpStatus(Code.Internal)) return res;
    const body = await collect(res.body);
    const error = errorFromJsonBytes(body, undefined, new ConnectError("", Code.Internal));
    if (error.code !== Code.Internal) return { ...res, body: once(body) };
    const fixedBody = errorToJsonBytes(rewrite(error), {});
    const header = new Headers(res.header);
    header.set("content-length", String(fixedBody.byteLength));
    return { ...res, status: codeToHttpStatus(Code.InvalidArgument), header, body: once(fixedBody) };
  };
  return Object.assign(wrapped, {
    protocolNames: handler.protocolNames,
    allowedMethods: handler.allowedMethods,
    supportedContentType: handler.supportedContentType,
    requestPath: handler.requestPath,
    service: handler.service,
    method: handler.method,
  }) as UniversalHandler;
}

async function collect(body: AsyncIterable<Uint8Array> | undefined): Promise<Uint8Array> {
  if (body === undefined) return new Uint8Array(0);
  const chunks: Uint8Array[] = [];
  for await (const chunk of body) chunks.push(chunk);
  return Buffer.concat(chunks);
}

function once(bytes: Uint8Array): AsyncIterable<Uint8Array> {
  return createAsyncIterable([bytes]);
}

function splitEnvelopes(body: Uint8Array): { flags: number; data: Uint8Array }[] {
  const view = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  const frames: { flags: number; data: Uint8Array }[] = [];
  for (let at = 0; at + 5 <= view.length; ) {
    const length = view.readUInt32BE(at + 1);
    frames.push({ flags: view[at] ?? 0, data: view.subarray(at + 5, at + 5 + length) });
    at += 5 + length;
  }
  return frames;
}
