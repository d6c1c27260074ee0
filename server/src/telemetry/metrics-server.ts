/**
 * The metrics endpoint: a plain HTTP/1.1 server on its own address (not the
 * gRPC port, so it can stay on a private interface and needs neither TLS nor
 * tokens) that answers `GET /metrics` with the Prometheus text format.
 * Every scrape first refreshes the queue-state gauges (bounded in time, see
 * {@link CasqMetrics.scrape}). `GET /` says where the metrics are; anything
 * else is 404.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { formatAddress, parseListenAddress } from "../util/listen-address.ts";
import type { CasqMetrics } from "./metrics.ts";

/** Options of {@link startMetricsServer}. */
export interface MetricsServerOptions {
  /** `HOST:PORT`, `[v6]:PORT` or `:PORT` (all interfaces); port 0 picks a free port. */
  readonly listen: string;
  readonly metrics: CasqMetrics;
  /** Longest wait for the scrape-time refresh (ms). Default 2000. */
  readonly refreshTimeoutMs?: number;
  /** Receives errors of a scrape (rendering failures). */
  readonly onError?: (error: unknown) => void;
}

/** A started metrics endpoint. */
export interface RunningMetricsServer {
  /** The bound address, `HOST:PORT`. */
  readonly address: string;
  /** Stops listening and closes open connections. */
  close(): Promise<void>;
}

/** Starts the metrics endpoint; rejects with the system error when the address cannot be bound. */
export async function startMetricsServer(options: MetricsServerOptions): Promise<RunningMetricsServer> {
  const { host, port } = parseListenAddress(options.listen);
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? "/").split("?")[0];
    if (req.method !== "GET" && req.method !== "HEAD") {
      res.writeHead(405, { allow: "GET, HEAD", "content-type": "text/plain" });
      res.end("method not allowed\n");
      return;
    }
    if (path === "/metrics") {
      options.metrics.scrape(options.refreshTimeoutMs).then(
        (text) => {
          res.writeHead(200, { "content-type": options.metrics.contentType });
          res.end(req.method === "HEAD" ? undefined : text);
        },
        (error: unknown) => {
          options.onError?.(error);
          res.writeHead(500, { "content-type": "text/plain" });
          res.end(`metrics failed: ${error instanceof Error ? error.message : String(error)}\n`);
        },
      );
      return;
    }
    if (path === "/") {
      res.writeHead(200, { "content-type": "text/plain" });
      res.end("casq broker metrics: GET /metrics (Prometheus text format)\n");
      return;
    }
    res.writeHead(404, { "content-type": "text/plain" });
    res.end("not found: metrics are at /metrics\n");
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", (error: NodeJS.ErrnoException) => reject(bindError(options.listen, error)));
    server.listen(port, host, () => {
      server.removeAllListeners("error");
      resolve();
    });
  });
  const bound = server.address() as AddressInfo;
  const address = formatAddress(bound.address, bound.port);
  let closing: Promise<void> | undefined;
  return {
    address,
    close() {
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      return closing;
    },
  };
}

/**
 * The error of a metrics address that cannot be bound. It deliberately
 * carries no system `code` (nor the original as `cause`), so that callers
 * that explain EADDRINUSE of the gRPC port do not blame `--listen`.
 */
export class MetricsListenError extends Error {
  override readonly name = "MetricsListenError";
}

function bindError(listen: string, error: NodeJS.ErrnoException): MetricsListenError {
  const why =
    error.code === "EADDRINUSE"
      ? "the address is in use"
      : error.code === "EACCES"
        ? "permission denied (ports below 1024 need privileges)"
        : error.code === "EADDRNOTAVAIL"
          ? "no such local address"
          : `${error.code ?? "error"}: ${error.message}`;
  return new MetricsListenError(
    `cannot serve metrics on ${listen}: ${why}; choose another address with --metrics-listen`,
  );
}
