/**
 * gRPC over HTTP/2 to casq brokers: one transport per broker address, with a
 * bearer-token interceptor and W3C trace context propagation.
 */

import type { DescService } from "@bufbuild/protobuf";
import { type Client, createClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { context, isSpanContextValid, propagation, TraceFlags, trace } from "@opentelemetry/api";
import type { ResolvedClientOptions } from "./client-options.ts";
import { createGrpcTransport } from "./grpc-transport.ts";

/** Adds `authorization: Bearer <token>` to every call. */
export function bearerInterceptor(token: string): Interceptor {
  return (next) => (req) => {
    req.header.set("authorization", `Bearer ${token}`);
    return next(req);
  };
}

/**
 * The W3C trace context of the active OpenTelemetry span, as headers:
 * `traceparent` and (when set) `tracestate`. Uses the registered propagator;
 * without one, formats `traceparent` from the active span itself. Empty when
 * there is no valid active span.
 */
export function activeTraceHeaders(): Record<string, string> {
  const carrier: Record<string, string> = {};
  propagation.inject(context.active(), carrier, {
    set(c, key, value) {
      c[key] = value;
    },
  });
  if (carrier.traceparent === undefined) {
    const span = trace.getActiveSpan()?.spanContext();
    if (span && isSpanContextValid(span)) {
      const sampled = (span.traceFlags & TraceFlags.SAMPLED) === TraceFlags.SAMPLED ? "01" : "00";
      carrier.traceparent = `00-${span.traceId}-${span.spanId}-${sampled}`;
      const state = span.traceState?.serialize();
      if (state) carrier.tracestate = state;
    }
  }
  return carrier;
}

/** Injects `traceparent` / `tracestate` of the active span into every call's headers. */
export const traceContextInterceptor: Interceptor = (next) => (req) => {
  for (const [key, value] of Object.entries(activeTraceHeaders())) {
    if (!req.header.has(key)) req.header.set(key, value);
  }
  return next(req);
};

function pem(value: string | Uint8Array | undefined): string | Buffer | undefined {
  if (value === undefined) return undefined;
  return typeof value === "string" ? value : Buffer.from(value);
}

/**
 * The HTTP/2 keepalive settings of connect-node's session manager for
 * `options`: PINGs every `keepaliveMs` (idle connections too), the connection
 * closed when one is not answered within `keepaliveTimeoutMs`. Empty when
 * `keepaliveMs` is 0 (connect-node then sends no PINGs).
 */
export function keepaliveTransportOptions(
  options: Pick<ResolvedClientOptions, "keepaliveMs" | "keepaliveTimeoutMs">,
): { pingIntervalMs?: number; pingTimeoutMs?: number; pingIdleConnection?: boolean } {
  if (options.keepaliveMs <= 0) return {};
  return {
    pingIntervalMs: options.keepaliveMs,
    pingTimeoutMs: options.keepaliveTimeoutMs,
    pingIdleConnection: true,
  };
}

/** Creates the gRPC transport (HTTP/2) for one broker address. */
export function createBrokerTransport(address: string, options: ResolvedClientOptions): Transport {
  const interceptors: Interceptor[] = [traceContextInterceptor];
  if (options.token !== undefined) interceptors.push(bearerInterceptor(options.token));
  const tls = options.tls;
  const scheme = tls ? "https" : "http";
  const nodeOptions =
    typeof tls === "object"
      ? {
          ...(tls.ca === undefined ? {} : { ca: pem(tls.ca) }),
          ...(tls.cert === undefined ? {} : { cert: pem(tls.cert) }),
          ...(tls.key === undefined ? {} : { key: pem(tls.key) }),
        }
      : undefined;
  return createGrpcTransport({
    baseUrl: `${scheme}://${address}`,
    interceptors,
    session: keepaliveTransportOptions(options),
    ...(nodeOptions ? { nodeOptions } : {}),
  });
}

/**
 * The brokers a client knows, the one it currently prefers, and a cached
 * transport per address. Redirect targets are added; unreachable brokers are
 * rotated away from.
 */
export class BrokerPool {
  /** Known broker addresses, in preference order of discovery. */
  readonly brokers: string[];
  private current = 0;
  private readonly transports = new Map<string, Transport>();
  private readonly clients = new Map<string, Client<DescService>>();

  constructor(readonly options: ResolvedClientOptions) {
    this.brokers = [...options.brokers];
  }

  /** The broker to try first. */
  preferred(): string {
    return this.brokers[this.current % this.brokers.length] as string;
  }

  /** Makes `address` (e.g. a redirect's leader) known and preferred. */
  prefer(address: string): void {
    let index = this.brokers.indexOf(address);
    if (index < 0) {
      this.brokers.push(address);
      index = this.brokers.length - 1;
    }
    this.current = index;
  }

  /** Moves the preference past `address` after it failed; returns the next address to try. */
  rotate(address: string): string {
    const index = this.brokers.indexOf(address);
    this.current = (index < 0 ? this.current : index) + 1;
    this.current %= this.brokers.length;
    return this.preferred();
  }

  /** The transport to `address` (created once). */
  transport(address: string): Transport {
    let t = this.transports.get(address);
    if (!t) {
      t = this.options.transportFactory?.(address) ?? createBrokerTransport(address, this.options);
      this.transports.set(address, t);
    }
    return t;
  }

  /** A typed client of `service` at `address` (created once). */
  client<S extends DescService>(service: S, address: string): Client<S> {
    const key = `${service.typeName}@${address}`;
    let c = this.clients.get(key);
    if (!c) {
      c = createClient(service, this.transport(address)) as unknown as Client<DescService>;
      this.clients.set(key, c);
    }
    return c as unknown as Client<S>;
  }
}
