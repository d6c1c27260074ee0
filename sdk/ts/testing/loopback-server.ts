/**
 * A stub broker for the SDK's tests: a request handler (connect's
 * `connectNodeAdapter`, so the SDK talks real gRPC to it) served over h2c on
 * 127.0.0.1 at an ephemeral port. The SDK's transports keep their HTTP/2
 * sessions open, so `close()` destroys them for the server to close;
 * `dropConnections()` breaks them mid-test (a broker that vanished).
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";

/** A running stub server (see the module header). */
export interface LoopbackServer {
  /** `127.0.0.1:PORT`. */
  readonly address: string;
  /** Destroys every open HTTP/2 session (the server keeps listening). */
  dropConnections(): void;
  /** Stops listening and destroys the open sessions. */
  close(): Promise<void>;
}

/** Serves `handler` on 127.0.0.1 (see the module header). */
export async function serveOnLoopback(
  handler: (request: http2.Http2ServerRequest, response: http2.Http2ServerResponse) => void,
): Promise<LoopbackServer> {
  const sessions = new Set<http2.ServerHttp2Session>();
  const server = http2.createServer(handler);
  server.on("session", (session) => {
    sessions.add(session);
    session.on("close", () => sessions.delete(session));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const dropConnections = () => {
    for (const session of sessions) session.destroy();
  };
  return {
    address: `127.0.0.1:${(server.address() as AddressInfo).port}`,
    dropConnections,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        dropConnections();
      }),
  };
}
