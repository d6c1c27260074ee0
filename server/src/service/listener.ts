/**
 * The one listening port of a casq server, serving gRPC, gRPC-Web and the
 * Connect protocol over HTTP/2 and HTTP/1.1.
 *
 * - **TLS**: an `http2.createSecureServer` with `allowHTTP1`: ALPN picks h2
 *   or http/1.1 per connection. With a client CA, client certificates are
 *   required and verified.
 * - **Cleartext**: gRPC clients speak HTTP/2 with prior knowledge (h2c),
 *   while `curl` and browsers' fetch speak HTTP/1.1, and Node's cleartext
 *   HTTP/2 server refuses HTTP/1.1. So a plain TCP server reads the first
 *   bytes of each connection: if they are the HTTP/2 connection preface
 *   (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`) the socket goes to an HTTP/2 server,
 *   otherwise to an HTTP/1.1 server. The bytes read are put back
 *   (`unshift`); the HTTP/2 session picks buffered data up when it starts.
 *
 * Timeouts ({@link ConnectionTimeouts}), as a production HTTP server has, so
 * that connections which never get to a request do not pile up:
 * - **headers**: a new connection must finish its first request's headers
 *   (HTTP/1.1), or open its first stream (HTTP/2), within `headersMs`; a
 *   connection that sends nothing, only the HTTP/2 preface, or dribbles its
 *   headers is closed. The TLS handshake has the same bound.
 * - **request**: an HTTP/1.1 request must be received whole within `requestMs`.
 * - **idle**: a connection with no request or stream in progress is closed
 *   after `idleMs` (HTTP/2: GOAWAY; HTTP/1.1: the keep-alive timeout). A
 *   session with an open stream is never cut by a timeout, however quiet:
 *   Work streams and long polls are legitimately silent for a long time.
 *
 * Shutdown is two steps: {@link RunningListener.stopAccepting} closes the
 * port (connections stay up, calls in flight continue), and
 * {@link RunningListener.closeConnections} ends them: gracefully (HTTP/2
 * GOAWAY, idle HTTP/1.1 connections closed) with a deadline after which
 * everything is destroyed, or at once.
 */
import { readFile } from "node:fs/promises";
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import http2, { type Http2ServerRequest, type Http2ServerResponse, type Http2Session } from "node:http2";
import net from "node:net";
import { type ContextValues, createContextKey, createContextValues } from "@connectrpc/connect";
import type { Logger } from "pino";
import { parseListenAddress } from "../util/listen-address.ts";

/** TLS files of a server. */
export interface TlsFiles {
  /** PEM certificate chain of the server. */
  readonly certFile: string;
  /** PEM private key of the server. */
  readonly keyFile: string;
  /** PEM CA bundle; when set, clients must present a certificate it signed (mutual TLS). */
  readonly clientCaFile?: string;
}

/** A request handler for both HTTP versions (what connectNodeAdapter returns). */
export type DualHandler = (
  req: IncomingMessage | Http2ServerRequest,
  res: ServerResponse | Http2ServerResponse,
) => void;

/** Options of {@link startListener}. */
export interface ListenerOptions {
  /** `HOST:PORT`, `[IPv6]:PORT` or `:PORT` (all interfaces); port 0 picks a free port. */
  readonly listen: string;
  readonly tls?: TlsFiles;
  readonly handler: DualHandler;
  readonly logger: Logger;
  /** Header, request and idle timeouts of connections (see the module header). */
  readonly timeouts?: ConnectionTimeouts;
}

/** Timeouts of the connections of a listener (see the module header). */
export interface ConnectionTimeouts {
  /** First request's headers (HTTP/1.1) or first stream (HTTP/2) of a new connection, in ms. Default 30 s. */
  readonly headersMs?: number;
  /** One whole HTTP/1.1 request, in ms; at least `headersMs`. Default 5 min. */
  readonly requestMs?: number;
  /** A connection with no request or stream in progress, in ms. Default 5 min. */
  readonly idleMs?: number;
}

/** The default {@link ConnectionTimeouts}. */
export const DEFAULT_CONNECTION_TIMEOUTS: Required<ConnectionTimeouts> = Object.freeze({
  headersMs: 30_000,
  requestMs: 300_000,
  idleMs: 300_000,
});

/** A bound listener. */
export interface RunningListener {
  /** The bound host (as given, or the wildcard address). */
  readonly host: string;
  /** The bound port. */
  readonly port: number;
  /** True when serving TLS. */
  readonly tls: boolean;
  /** Stops accepting new connections (the port is closed; open connections stay up). */
  stopAccepting(): Promise<void>;
  /** Ends every open connection (see the module header). */
  closeConnections(options: { graceful: boolean; timeoutMs: number }): Promise<void>;
}

/**
 * Context value of every call (see {@link callContextValues}): resets the
 * call's HTTP/2 stream with CANCEL (HTTP/1.1: closes the connection). For a
 * response stream whose client stopped reading: it cannot end otherwise,
 * since its last messages wait for flow-control credit that never comes.
 */
export const RESET_CALL = createContextKey<(() => void) | undefined>(undefined, {
  description: "casq: reset the call's transport stream",
});

/** The context values of one call: a fresh set holding its {@link RESET_CALL}. */
export function callContextValues(req: IncomingMessage | Http2ServerRequest): ContextValues {
  const values = createContextValues();
  values.set(RESET_CALL, () => {
    if (!("stream" in req)) {
      req.socket.destroy();
      return;
    }
    if (req.stream.closed) return;
    req.stream.close(http2.constants.NGHTTP2_CANCEL);
    // A write that waits for flow-control credit gets neither 'drain' nor 'error' when its stream
    // is reset, and @connectrpc/connect-node waits for one of them forever. 'drain' lets it go
    // on: its next write fails, and the call's response stream is ended.
    req.stream.emit("drain");
  });
  return values;
}

/** The HTTP/2 connection preface every prior-knowledge h2c client sends first. */
const H2_PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");

/** Binds the port and starts serving (see the module header). Rejects with the system error (EADDRINUSE, ...). */
export async function startListener(options: ListenerOptions): Promise<RunningListener> {
  const { host, port } = parseListenAddress(options.listen);
  const timeouts = { ...DEFAULT_CONNECTION_TIMEOUTS, ...options.timeouts };
  const sessions = new Set<Http2Session>();
  const trackSession = (session: Http2Session) => {
    sessions.add(session);
    session.on("close", () => sessions.delete(session));
    session.on("error", (error) => options.logger.debug({ err: error }, "HTTP/2 session error"));
    watchSession(session, timeouts);
  };

  let server: net.Server;
  let h1: http.Server | undefined;
  const undecided = new Set<net.Socket>();

  if (options.tls) {
    const [cert, key, ca] = await Promise.all([
      readFile(options.tls.certFile),
      readFile(options.tls.keyFile),
      options.tls.clientCaFile ? readFile(options.tls.clientCaFile) : Promise.resolve(undefined),
    ]);
    const secure = http2.createSecureServer(
      {
        cert,
        key,
        allowHTTP1: true,
        handshakeTimeout: timeouts.headersMs,
        ...(ca ? { ca, requestCert: true, rejectUnauthorized: true } : {}),
      },
      options.handler,
    );
    secure.on("session", trackSession);
    secure.on("tlsClientError", (error) => options.logger.debug({ err: error }, "TLS handshake failed"));
    // HTTP/1.1 over TLS: the same timeouts as the cleartext HTTP/1.1 server (set before listen).
    Object.assign(secure, http1Timeouts(timeouts));
    server = secure;
  } else {
    const h2 = http2.createServer({}, options.handler);
    h2.on("session", trackSession);
    h1 = http.createServer(http1Timeouts(timeouts), options.handler);
    // This server never listens itself (the sniffing server hands it sockets), but Node only
    // enforces headersTimeout and requestTimeout once "listening" set up its connection checks.
    h1.emit("listening");
    const plainH1 = h1;
    const timeoutMs = timeouts.headersMs;
    server = net.createServer((socket) => {
      undecided.add(socket);
      let head: Buffer = Buffer.alloc(0);
      const timer = setTimeout(() => socket.destroy(), timeoutMs);
      const cleanup = () => {
        clearTimeout(timer);
        undecided.delete(socket);
        socket.removeListener("data", onData);
        socket.removeListener("error", onError);
        socket.removeListener("close", cleanup);
      };
      const onError = () => cleanup();
      const onData = (chunk: Buffer) => {
        head = head.length === 0 ? chunk : Buffer.concat([head, chunk]);
        const n = Math.min(head.length, H2_PREFACE.length);
        const isH2 = head.subarray(0, n).equals(H2_PREFACE.subarray(0, n));
        if (isH2 && head.length < H2_PREFACE.length) return; // need more bytes to decide
        cleanup();
        socket.pause();
        socket.unshift(head);
        if (isH2) {
          h2.emit("connection", socket);
        } else {
          plainH1.emit("connection", socket);
          socket.resume();
        }
      };
      socket.on("data", onData);
      socket.on("error", onError);
      socket.on("close", cleanup);
    });
  }

  await new Promise<void>((resolve, reject) => {
    const onError = (error: Error) => reject(error);
    server.once("error", onError);
    server.listen(port, host, () => {
      server.removeListener("error", onError);
      resolve();
    });
  });
  server.on("error", (error) => options.logger.error({ err: error }, "listener error"));
  const sockets = new Set<net.Socket>();
  server.on("connection", (socket: net.Socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
  });
  const bound = server.address();
  const boundPort = typeof bound === "object" && bound !== null ? bound.port : port;

  return {
    host,
    port: boundPort,
    tls: options.tls !== undefined,
    async stopAccepting() {
      // The port closes at once; the close callback waits for the connections (see closeConnections).
      if (server.listening) server.close(() => {});
    },
    async closeConnections({ graceful, timeoutMs }) {
      for (const socket of undecided) socket.destroy();
      if (graceful) {
        // HTTP/2: GOAWAY, let open streams finish; HTTP/1.1: close idle keep-alive connections.
        const closing = [...sessions].map(
          (session) =>
            new Promise<void>((resolve) => (session.closed ? resolve() : session.close(() => resolve()))),
        );
        h1?.closeIdleConnections();
        let timer: NodeJS.Timeout | undefined;
        const deadline = new Promise<void>((resolve) => {
          timer = setTimeout(resolve, timeoutMs);
        });
        await Promise.race([Promise.all(closing), deadline]);
        clearTimeout(timer);
      }
      for (const session of sessions) session.destroy();
      for (const socket of sockets) socket.destroy();
      h1?.close(); // stops its connection checks
    },
  };
}

/** Node's HTTP/1.1 server settings for `timeouts`. */
function http1Timeouts(timeouts: Required<ConnectionTimeouts>) {
  return {
    headersTimeout: timeouts.headersMs,
    requestTimeout: Math.max(timeouts.requestMs, timeouts.headersMs),
    keepAliveTimeout: timeouts.idleMs,
    // Node checks the header and request deadlines this often (default 30 s).
    connectionsCheckingInterval: Math.max(50, Math.min(30_000, Math.floor(timeouts.headersMs / 4))),
  };
}

/**
 * The HTTP/2 timeouts of one session: closed when no stream was opened
 * within `headersMs`, and when no stream is open for `idleMs`. Open streams
 * keep it alive whatever their pace.
 */
function watchSession(session: Http2Session, timeouts: Required<ConnectionTimeouts>): void {
  let open = 0;
  let everOpened = false;
  const end = () => {
    if (session.closed || session.destroyed) return;
    session.close();
    // A peer that does not read cannot stall the close.
    setTimeout(() => session.destroy(), 1_000).unref();
  };
  const firstStream = setTimeout(() => {
    if (!everOpened) end();
  }, timeouts.headersMs);
  firstStream.unref();
  const idle = () => {
    if (open === 0) end();
  };
  // The session timer fires after idleMs without any frame; it is restarted when the last stream closes.
  session.on("timeout", idle);
  session.setTimeout(timeouts.idleMs);
  session.on("stream", (stream) => {
    open += 1;
    everOpened = true;
    clearTimeout(firstStream);
    stream.once("close", () => {
      open -= 1;
      if (open === 0 && !session.closed && !session.destroyed) session.setTimeout(timeouts.idleMs);
    });
  });
  session.once("close", () => clearTimeout(firstStream));
}
