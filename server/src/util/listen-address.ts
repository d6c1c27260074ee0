/**
 * Listen addresses as the command line writes them (`HOST:PORT`, `[v6]:PORT`,
 * `:PORT`), shared by the gRPC port and the metrics endpoint.
 */

/** Splits `HOST:PORT` (also `[v6]:PORT` and `:PORT`). Throws with a clear message. */
export function parseListenAddress(listen: string): { host: string; port: number } {
  const match = /^(?:\[([^\]]+)\]|([^:[\]]*)):(\d{1,5})$/.exec(listen.trim());
  const port = Number(match?.[3]);
  if (!match || !Number.isInteger(port) || port > 65535)
    throw new Error(
      `listen address ${JSON.stringify(listen)} is not HOST:PORT (e.g. 127.0.0.1:50051, [::1]:0, :50051)`,
    );
  const host = match[1] ?? match[2] ?? "";
  return { host: host === "" ? "0.0.0.0" : host, port };
}

/** Formats a host and port as `HOST:PORT` (brackets around IPv6). */
export function formatAddress(host: string, port: number): string {
  return host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
}
