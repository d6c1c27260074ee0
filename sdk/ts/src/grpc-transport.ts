/**
 * The SDK's gRPC transport: connect-node's HTTP/2 session manager and HTTP
 * client (connections, keepalive PINGs, TLS, aborts and the mapping of
 * HTTP/2 and socket errors to Connect codes, all unchanged), with the gRPC
 * framing of each call done here directly.
 *
 * Why: connect's own gRPC transport runs every call through a pipeline of
 * async iterables (serialize, compress, join on the way out; split,
 * decompress, parse on the way in), compiled to ES2017 generators. On a
 * single-message call that pipeline cost about a third of the client's CPU
 * per call (~290-340 µs against ~200 µs here, docs/benchmarks.md), and on a
 * Work stream it ran for every message. Here a request message becomes one
 * enveloped buffer, and a response's bytes are split into messages in one
 * loop.
 *
 * What a call sees is what connect's transport gives: the same request
 * headers (content type, `te`, `grpc-timeout`, user agent, accepted
 * encodings), the same interceptors around the call, the same errors from the
 * same checks of the response headers and trailers (connect's own
 * `validateResponseWithCompression` and `validateTrailer`) and from the same
 * (de)serialization, gzip or brotli responses decompressed.
 */

import type * as http2 from "node:http2";
import type { DescMessage, DescMethodStreaming, DescMethodUnary, MessageInitShape } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  type ContextValues,
  createContextValues,
  type Interceptor,
  type StreamRequest,
  type StreamResponse,
  type Transport,
  type UnaryRequest,
  type UnaryResponse,
} from "@connectrpc/connect";
import {
  type Compression,
  createMethodSerializationLookup,
  createMethodUrl,
  encodeEnvelope,
  envelopeDecompress,
  runStreamingCall,
  runUnaryCall,
  type Serialization,
} from "@connectrpc/connect/protocol";
import {
  requestHeaderWithCompression,
  validateResponseWithCompression,
  validateTrailer,
} from "@connectrpc/connect/protocol-grpc";
import {
  compressionBrotli,
  compressionGzip,
  createNodeHttpClient,
  Http2SessionManager,
  type Http2SessionOptions,
} from "@connectrpc/connect-node";

/** Options of {@link createGrpcTransport}. */
export interface GrpcTransportOptions {
  /** `http://host:port` or `https://host:port`. */
  readonly baseUrl: string;
  /** Run around every call, outermost first. */
  readonly interceptors?: readonly Interceptor[];
  /** PINGs and idle timeout of the HTTP/2 connection (see connect-node's Http2SessionManager). */
  readonly session?: Http2SessionOptions;
  /** TLS options of the connection (ca, cert, key). */
  readonly nodeOptions?: http2.ClientSessionOptions | http2.SecureClientSessionOptions;
  /** The connection to use instead of one made from `session` and `nodeOptions`; its owner closes it. */
  readonly sessionManager?: Http2SessionManager;
}

/** Encodings a response may use (what connect-node's gRPC transport accepts by default); never changed. */
const ACCEPT_COMPRESSION: Compression[] = [compressionGzip, compressionBrotli];

/** Largest message read or written (connect's default: no practical limit). */
const MAX_MESSAGE_BYTES = 0xffffffff;

/** The envelope flag of a compressed message. */
const FLAG_COMPRESSED = 0b00000001;

type AnyUnary = DescMethodUnary<DescMessage, DescMessage>;
type AnyStreaming = DescMethodStreaming<DescMessage, DescMessage>;

/**
 * A Connect {@link Transport} speaking gRPC over HTTP/2 to one broker (see
 * the module header). Drop-in for connect-node's `createGrpcTransport`.
 */
export function createGrpcTransport(options: GrpcTransportOptions): Transport {
  const sessionManager =
    options.sessionManager ?? new Http2SessionManager(options.baseUrl, options.session, options.nodeOptions);
  const httpClient = createNodeHttpClient({ httpVersion: "2", sessionProvider: () => sessionManager });
  const interceptors = options.interceptors ?? [];
  const serializations = new WeakMap<
    object,
    { input: Serialization<unknown>; output: Serialization<unknown> }
  >();
  const serializationOf = (method: AnyUnary | AnyStreaming) => {
    let s = serializations.get(method);
    if (s === undefined) {
      const lookup = createMethodSerializationLookup(method, undefined, undefined, {
        readMaxBytes: MAX_MESSAGE_BYTES,
        writeMaxBytes: MAX_MESSAGE_BYTES,
      });
      s = {
        input: lookup.getI(true) as Serialization<unknown>,
        output: lookup.getO(true) as Serialization<unknown>,
      };
      serializations.set(method, s);
    }
    return s;
  };

  return {
    async unary<I extends DescMessage, O extends DescMessage>(
      method: DescMethodUnary<I, O>,
      signal: AbortSignal | undefined,
      timeoutMs: number | undefined,
      header: ConstructorParameters<typeof Headers>[0],
      message: MessageInitShape<I>,
      contextValues?: ContextValues,
    ): Promise<UnaryResponse<I, O>> {
      const serialization = serializationOf(method as unknown as AnyUnary);
      const timeout = normalizeTimeout(timeoutMs);
      return await runUnaryCall<I, O>({
        interceptors: interceptors as Interceptor[],
        signal,
        timeoutMs: timeout,
        req: {
          stream: false,
          ...callParts(options.baseUrl, method, timeout, header, contextValues),
          message,
        },
        next: async (req: UnaryRequest<I, O>): Promise<UnaryResponse<I, O>> => {
          const res = await httpClient({
            url: req.url,
            method: "POST",
            header: req.header,
            signal: req.signal,
            body: once(encodeEnvelope(0, serialization.input.serialize(req.message))),
          });
          const { compression, headerError } = validateResponseWithCompression(
            ACCEPT_COMPRESSION,
            res.status,
            res.header,
          );
          let output: unknown;
          let count = 0;
          for await (const data of messagesOf(res.body, compression)) {
            count += 1;
            if (count > 1)
              throw new ConnectError(
                "protocol error: received extra output message for unary method",
                Code.Unimplemented,
              );
            output = serialization.output.parse(data);
          }
          validateTrailer(res.trailer, res.header);
          if (count === 0) {
            // A trailers-only response.
            if (headerError) throw headerError;
            throw new ConnectError(
              "protocol error: missing output message for unary method",
              res.trailer.has("grpc-status") ? Code.Unimplemented : Code.Unknown,
            );
          }
          if (headerError)
            throw new ConnectError(
              "protocol error: received output message for unary method with error status",
              Code.Unknown,
            );
          return {
            stream: false,
            service: method.parent,
            method,
            header: res.header,
            message: output as UnaryResponse<I, O>["message"],
            trailer: res.trailer,
          };
        },
      });
    },

    async stream<I extends DescMessage, O extends DescMessage>(
      method: DescMethodStreaming<I, O>,
      signal: AbortSignal | undefined,
      timeoutMs: number | undefined,
      header: ConstructorParameters<typeof Headers>[0],
      input: AsyncIterable<MessageInitShape<I>>,
      contextValues?: ContextValues,
    ): Promise<StreamResponse<I, O>> {
      const serialization = serializationOf(method as unknown as AnyStreaming);
      const timeout = normalizeTimeout(timeoutMs);
      return await runStreamingCall<I, O>({
        interceptors: interceptors as Interceptor[],
        signal,
        timeoutMs: timeout,
        req: {
          stream: true,
          ...callParts(options.baseUrl, method, timeout, header, contextValues),
          message: input,
        },
        next: async (req: StreamRequest<I, O>): Promise<StreamResponse<I, O>> => {
          const res = await httpClient({
            url: req.url,
            method: "POST",
            header: req.header,
            signal: req.signal,
            body: envelopes(req.message, serialization.input),
          });
          const { compression, foundStatus, headerError } = validateResponseWithCompression(
            ACCEPT_COMPRESSION,
            res.status,
            res.header,
          );
          if (headerError) throw headerError;
          async function* parsed() {
            for await (const data of messagesOf(res.body, compression))
              yield serialization.output.parse(data) as StreamResponse<I, O>["message"] extends AsyncIterable<
                infer M
              >
                ? M
                : never;
            if (!foundStatus) validateTrailer(res.trailer, res.header);
          }
          return { ...req, header: res.header, trailer: res.trailer, message: parsed() };
        },
      });
    },
  };
}

/** What a unary and a streaming call's request have in common, as connect's gRPC transport makes it. */
function callParts<M extends AnyUnary | AnyStreaming>(
  baseUrl: string,
  method: M,
  timeoutMs: number | undefined,
  header: ConstructorParameters<typeof Headers>[0],
  contextValues: ContextValues | undefined,
) {
  return {
    service: method.parent,
    method,
    requestMethod: "POST",
    url: createMethodUrl(baseUrl, method),
    header: requestHeaderWithCompression(true, timeoutMs, header, ACCEPT_COMPRESSION, null),
    contextValues: contextValues ?? createContextValues(),
  };
}

/** connect's rule: no timeout given means none; zero or less means none too. */
function normalizeTimeout(timeoutMs: number | undefined): number | undefined {
  return timeoutMs === undefined || timeoutMs <= 0 ? undefined : timeoutMs;
}

/** An async iterable of one chunk (the HTTP client takes request bodies as async iterables). */
function once(chunk: Uint8Array): AsyncIterable<Uint8Array> {
  return {
    [Symbol.asyncIterator]() {
      let done = false;
      return {
        next: () => {
          if (done) return Promise.resolve({ done: true, value: undefined });
          done = true;
          return Promise.resolve({ done: false, value: chunk });
        },
      };
    },
  };
}

/**
 * Each message of `input`, serialized and enveloped. As connect's request
 * pipe does: a failed write of the request (the HTTP client throws it in)
 * is thrown into `input`, and `input` is told to return once this ends.
 */
function envelopes(
  input: AsyncIterable<unknown>,
  serialization: Serialization<unknown>,
): AsyncIterable<Uint8Array> {
  return {
    [Symbol.asyncIterator]() {
      const source = input[Symbol.asyncIterator]();
      const end = () => {
        source.return?.().catch(() => {});
      };
      return {
        async next(): Promise<IteratorResult<Uint8Array>> {
          let r: IteratorResult<unknown>;
          let bytes: Uint8Array;
          try {
            r = await source.next();
            if (r.done === true) return { done: true, value: undefined };
            bytes = serialization.serialize(r.value);
          } catch (error) {
            end();
            throw error;
          }
          return { done: false, value: encodeEnvelope(0, bytes) };
        },
        async throw(error: unknown): Promise<IteratorResult<Uint8Array>> {
          await source.throw?.(error).catch(() => {});
          end();
          throw error;
        },
        async return(): Promise<IteratorResult<Uint8Array>> {
          end();
          return { done: true, value: undefined };
        },
      };
    },
  };
}

/**
 * The messages (unprefixed, decompressed) in a gRPC response body, in order.
 * The chunks of a message that spans several are joined once, when all of
 * it is in. A body that ends inside a message is a protocol error, as in
 * connect.
 */
async function* messagesOf(
  body: AsyncIterable<Uint8Array>,
  compression: Compression | undefined,
): AsyncGenerator<Uint8Array> {
  let chunks: Uint8Array[] = [];
  let bytes = 0;
  /** Bytes the next message needs (its prefix, then prefix and data). */
  let need = 5;
  for await (const chunk of body) {
    chunks.push(chunk);
    bytes += chunk.byteLength;
    if (bytes < need) continue;
    const buf = chunks.length === 1 ? chunk : Buffer.concat(chunks, bytes);
    chunks = [];
    bytes = 0;
    need = 5;
    let at = 0;
    while (buf.byteLength - at >= 5) {
      const view = new DataView(buf.buffer, buf.byteOffset + at, 5);
      const flags = view.getUint8(0);
      // A 32-bit length cannot pass MAX_MESSAGE_BYTES: no size check (connect's default is the same).
      const length = view.getUint32(1);
      if (buf.byteLength - at - 5 < length) {
        need = 5 + length;
        break;
      }
      const data = buf.subarray(at + 5, at + 5 + length);
      at += 5 + length;
      if ((flags & FLAG_COMPRESSED) === FLAG_COMPRESSED) {
        const plain = await envelopeDecompress({ flags, data }, compression ?? null, MAX_MESSAGE_BYTES);
        yield plain.data;
      } else yield data;
    }
    if (at < buf.byteLength) {
      chunks.push(at === 0 ? buf : buf.subarray(at));
      bytes = buf.byteLength - at;
    }
  }
  if (bytes > 0) throw new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument);
}
