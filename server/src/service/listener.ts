/**
 * The one listening port of a casq server: gRPC clients over HTTP/2, the
 * Connect protocol and gRPC-Web (browsers, curl) over HTTP/1.1.
 *
 * Each connection is handed, whole, to one of two servers by the HTTP
 * version it speaks: HTTP/2 connections to {@link ListenerOptions.http2}
 * (the casq server passes @grpc/grpc-js's connection injector: every HTTP/2
 * call is gRPC), HTTP/1.1 connections to a Node HTTP/1.1 server running
 * {@link ListenerOptions.handler} (connect-node).
 *
 * - **TLS**: the listener terminates TLS itself (with a client CA, client
 *   certificates are required and verified there) and chooses the protocol
 *   by ALPN: a client that offers `http/1.1` gets HTTP/1.1 (browsers and curl
 *   offer both `h2` and `http/1.1`), a client that offers only `h2` (every
 *   gRPC library: grpc-go and grpcurl, grpc-js, grpcio, connect-node's gRPC
 *   transport) gets h2 and its decrypted socket goes to the HTTP/2 side. A
 *   client that offers no ALPN at all speaks HTTP/1.1.
 * - **Cleartext**: gRPC clients speak HTTP/2 with prior knowledge (h2c),
 *   while `curl` and browsers' fetch speak HTTP/1.1. The listener reads the
 *   first bytes of each connection: if they are the HTTP/2 connection preface
 *   (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`) the socket goes to the HTTP/2
 *   side, otherwise to the HTTP/1.1 server. The bytes read are put back
 *   (`unshift`); the HTTP/2 session picks buffered data up when it starts.
 *
 * Timeouts ({@link ConnectionTimeouts}), as a production HTTP server has, so
 * that connections which never get to a request do not pile up:
 * - **headers**: a new connection must finish its first request's headers
 *   (HTTP/1.1), or start its first call (HTTP/2: the HTTP/2 side reports
 *   calls with {@link RunningListener.http2CallStarted}), within `headersMs`;
 *   a connection that sends nothing, only the HTTP/2 preface, or dribbles
 *   its headers is closed. The TLS handshake has the same bound.
 * - **request**: an HTTP/1.1 request must be received whole within `requestMs`.
 * - **idle**: an HTTP/1.1 connection with no request in progress is closed
 *   after `idleMs` (the keep-alive timeout). HTTP/2 connections are the
 *   HTTP/2 side's: the casq server sets grpc-js's `max_connection_idle_ms`
 *   to `idleMs` (GOAWAY when no call was open for that long). A connection
 *   with a call in progress is never cut by a timeout, however quiet: Work
 *   streams and long polls are legitimately silent for a long time.
 *
 * Shutdown is two steps: {@link RunningListener.stopAccepting} closes the
 * port (connections stay up, calls in flight continue), and
 * {@link RunningListener.closeConnections} ends them: gracefully (HTTP/2
 * GOAWAY through the HTTP/2 side's `drain`, idle HTTP/1.1 connections
 * closed) with a deadline after which everything is destroyed, or at once.
 */
import { readFile } from "node:fs/promises";
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import net from "node:net";
import tls from "node:tls";
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

/** A request handler of the HTTP/1.1 server (what connectNodeAdapter returns fits). */
export type Http1Handler = (req: IncomingMessage, res: ServerResponse) => void;

/**
 * Where HTTP/2 connections go: the shape of @grpc/grpc-js's
 * `Server.createConnectionInjector` result, which serves them.
 */
export interface Http2Side {
  /** Takes over one connection (a TCP socket, or a decrypted TLS socket). */
  injectConnection(connection: net.Socket): void;
  /** Sends every session GOAWAY, letting open calls finish; destroys what is left after `graceMs`. */
  drain(graceMs: number): void;
  /** Stops the HTTP/2 server, closing its sessions. */
  destroy(): void;
}

/** Options of {@link startListener}. */
export interface ListenerOptions {
  /** `HOST:PORT`, `[IPv6]:PORT` or `:PORT` (all interfaces); port 0 picks a free port. */
  readonly listen: string;
  readonly tls?: TlsFiles;
  /** Serves HTTP/1.1 requests (Connect protocol, gRPC-Web). */
  readonly handler: Http1Handler;
  /** Serves HTTP/2 connections (gRPC). */
  readonly http2: Http2Side;
  readonly logger: Logger;
  /** Header, request and idle timeouts of connections (see the module header). */
  readonly timeouts?: ConnectionTimeouts;
}

/** Timeouts of the connections of a listener (see the module header). */
export interface ConnectionTimeouts {
  /** First request's headers (HTTP/1.1) or first call (HTTP/2) of a new connection, in ms. Default 30 s. */
  readonly headersMs?: number;
  /** One whole HTTP/1.1 request, in ms; at least `headersMs`. Default 5 min. */
  readonly requestMs?: number;
  /** A connection with no request or call in progress, in ms. Default 5 min. */
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
  /**
   * Tells the listener that a call started on the HTTP/2 connection of
   * `peer` (`address:port` of the client, as grpc-js's `getPeer()` spells
   * it), which ends that connection's headers timeout. Returns the function
   * that ends the connection (see {@link RESET_CALL}).
   */
  http2CallStarted(peer: string): () => void;
  /** Stops accepting new connections (the port is closed; open connections stay up). */
  stopAccepting(): Promise<void>;
  /** Ends every open connection (see the module header). */
  closeConnections(options: { graceful: boolean; timeoutMs: number }): Promise<void>;
}

/**
 * Context value of every call (see {@link callContextValues}): ends the
 * call's transport by closing its connection. For a response stream whose
 * client stopped reading: it cannot end otherwise, since its last messages
 * wait for flow-control credit that never comes. Neither server offers a
 * public way to reset one HTTP/2 stream; this is used only while the server
 * shuts down, when every connection is closed moments later anyway.
 */
export const RESET_CALL = createContextKey<(() => void) | undefined>(undefined, {
  description: "casq: end the call's transport",
});

/** The context values of one call: a fresh set holding its {@link RESET_CALL}, `reset`. */
export function callContextValues(reset: () => void): ContextValues {
  const values = createContextValues();
  values.set(RESET_CALL, reset);
  return values;
}

/** The HTTP/2 connection preface every prior-knowledge h2c client sends first. */
const H2_PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");

/** An HTTP/2 connection handed to the HTTP/2 side. */
interface Http2Connection {
  readonly socket: net.Socket;
  /** True once a call started on it. */
  called: boolean;
  readonly firstCall: NodeJS.Timeout;
  /** Ends the connection. */
  readonly end: () => void;
}

const noop = () => {};

/** The longest delay a Node timer takes (a longer one fires at once). */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * Chooses the protocol of a TLS connection from the client's ALPN offer
 * (see the module header); undefined refuses the handshake.
 */
export function chooseAlpn(offered: readonly string[]): string | undefined {
  if (offered.includes("http/1.1")) return "http/1.1";
  if (offered.includes("h2")) return "h2";
  return undefined;
}

/** Binds the port and starts serving (see the module header). Rejects with the system error (EADDRINUSE, ...). */
export async function startListener(options: ListenerOptions): Promise<RunningListener> {
  const { host, port } = parseListenAddress(options.listen);
  const timeouts = { ...DEFAULT_CONNECTION_TIMEOUTS, ...options.timeouts };
  const h2 = new Map<string, Http2Connection>();
  const toHttp2 = (socket: net.Socket) => {
    const peer = `${socket.remoteAddress}:${socket.remotePort}`;
    const connection: Http2Connection = {
      socket,
      called: false,
      firstCall: setTimeout(() => {
        if (!connection.called) socket.destroy();
      }, timeouts.headersMs),
      end: () => socket.destroy(),
    };
    h2.set(peer, connection);
    socket.once("close", () => {
      clearTimeout(connection.firstCall);
      if (h2.get(peer) === connection) h2.delete(peer);
    });
    options.http2.injectConnection(socket);
  };

  const h1 = http.createServer(http1Timeouts(timeouts), options.handler);
  // This server never listens itself (the listener hands it sockets), but Node only
  // enforces headersTimeout and requestTimeout once "listening" set up its connection checks.
  h1.emit("listening");
  const toHttp1 = (socket: net.Socket) => h1.emit("connection", socket);

  let server: net.Server;
  const undecided = new Set<net.Socket>();

  if (options.tls) {
    const [cert, key, ca] = await Promise.all([
      readFile(options.tls.certFile),
      readFile(options.tls.keyFile),
      options.tls.clientCaFile ? readFile(options.tls.clientCaFile) : Promise.resolve(undefined),
    ]);
    const secure = tls.createServer({
      cert,
      key,
      handshakeTimeout: timeouts.headersMs,
      ALPNCallback: ({ protocols }) => chooseAlpn(protocols),
      ...(ca ? { ca, requestCert: true, rejectUnauthorized: true } : {}),
    });
    secure.on("secureConnection", (socket: tls.TLSSocket) => {
      if (socket.alpnProtocol === "h2") toHttp2(socket);
      else toHttp1(socket);
    });
    secure.on("tlsClientError", (error) => options.logger.debug({ err: error }, "TLS handshake failed"));
    server = secure;
  } else {
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
          toHttp2(socket);
        } else {
          toHttp1(socket);
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
    http2CallStarted(peer) {
      const connection = h2.get(peer);
      if (connection === undefined) return noop;
      if (!connection.called) {
        connection.called = true;
        clearTimeout(connection.firstCall);
      }
      return connection.end;
    },
    async stopAccepting() {
      // The port closes at once; the close callback waits for the connections (see closeConnections).
      if (server.listening) server.close(() => {});
    },
    async closeConnections({ graceful, timeoutMs }) {
      for (const socket of undecided) socket.destroy();
      if (graceful) {
        // HTTP/2: GOAWAY, let open calls finish; HTTP/1.1: close idle keep-alive connections.
        // The HTTP/2 side's own cut (RST with CANCEL, which a client reports as an error even
        // for a call whose status it already has) must not come first: the listener closes
        // what is left at the deadline, as a plain TCP close after the GOAWAY.
        options.http2.drain(MAX_TIMER_MS);
        h1.closeIdleConnections();
        const closing = [...h2.values()].map(
          ({ socket }) =>
            new Promise<void>((resolve) =>
              socket.destroyed ? resolve() : socket.once("close", () => resolve()),
            ),
        );
        let timer: NodeJS.Timeout | undefined;
        const deadline = new Promise<void>((resolve) => {
          timer = setTimeout(resolve, timeoutMs);
        });
        await Promise.race([Promise.all(closing), deadline]);
        clearTimeout(timer);
      }
      for (const { socket } of h2.values()) socket.destroy();
      h1.closeAllConnections();
      for (const socket of sockets) socket.destroy();
      options.http2.destroy();
      h1.close(); // stops its connection checks
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
