/**
 * Options shared by {@link Producer}, {@link Worker} and {@link Admin}: where
 * the brokers are, how to authenticate, and how patiently to retry.
 */
import type { Transport } from "@connectrpc/connect";
import type { RandomSource } from "./backoff.ts";
import { mathRandom } from "./backoff.ts";
import { type SdkClock, systemClock } from "./clock.ts";

/** TLS settings: PEM contents (strings or buffers) of a CA to trust and an optional client certificate (mutual TLS). */
export interface TlsOptions {
  /** CA certificate(s) to trust instead of the system roots. */
  readonly ca?: string | Uint8Array;
  /** Client certificate, for servers that require mutual TLS. */
  readonly cert?: string | Uint8Array;
  /** Private key of the client certificate. */
  readonly key?: string | Uint8Array;
}

/** How to reach casq. Only `brokers` is required. */
export interface ClientOptions {
  /**
   * Broker addresses (`host:port`). Any broker works; the SDK follows
   * redirects to the leader of a shard and fails over to the next address
   * when one is unreachable. Leaders it is redirected to are added to this list.
   */
  readonly brokers: readonly string[];
  /** Bearer token sent as `authorization: Bearer <token>` on every call. */
  readonly token?: string;
  /** `true` for TLS with the system roots, or explicit PEM material. Default: cleartext (h2c). */
  readonly tls?: TlsOptions | boolean;
  /** Deadline of each unary attempt in ms. Default 30 000. */
  readonly timeoutMs?: number;
  /**
   * How long one unary call keeps retrying across brokers and redirects, in
   * ms. Default 30 000: long enough to ride out a killed broker's leader
   * lease (10 s by default). A call's own `timeoutMs` / `signal` may end it sooner.
   */
  readonly retryTimeoutMs?: number;
  /** Also cap the attempts of one call. Default: no cap, only `retryTimeoutMs`. */
  readonly maxAttempts?: number;
  /** First retry delay in ms (doubled per attempt, with equal jitter: each delay is at least half its cap). Default 100. */
  readonly backoffInitialMs?: number;
  /** Largest retry delay in ms. Default 5 000. */
  readonly backoffMaxMs?: number;
  /**
   * Interval of HTTP/2 keepalive PINGs on each broker connection, in ms,
   * counted from the last data received. A PING unanswered within
   * `keepaliveTimeoutMs` closes the connection and fails its calls and
   * streams, so a worker waiting on an idle Work stream to a hung broker
   * (its process frozen: TCP stays up, nothing answers) reconnects
   * elsewhere instead of waiting forever. Idle connections are pinged too.
   * Default 10 000; 0 turns keepalive off.
   */
  readonly keepaliveMs?: number;
  /** How long a keepalive PING may go unanswered before the connection is closed, in ms. Default 10 000. */
  readonly keepaliveTimeoutMs?: number;
  /**
   * Where the client reads the time and waits (backoffs, deadlines, heartbeat
   * and request timers). Default: the system clock.
   *
   * @internal For tests and casq's seeded simulation, which run clients on a
   * fake clock; not part of the supported API.
   */
  readonly clock?: SdkClock;
  /**
   * Where retry jitter comes from. Default: `Math.random()`.
   *
   * @internal For tests and casq's seeded simulation; not part of the supported API.
   */
  readonly random?: RandomSource;
  /**
   * Builds the transport to one broker address instead of gRPC over HTTP/2.
   * The transport is used as is: no token or trace-context interceptors are
   * added, and `tls` and keepalive options do not apply.
   *
   * @internal For tests and casq's seeded simulation, which connect clients
   * to brokers in the same process (connect's in-memory router transport);
   * not part of the supported API.
   */
  readonly transportFactory?: (address: string) => Transport;
}

/** {@link ClientOptions} with defaults applied. */
export interface ResolvedClientOptions {
  readonly brokers: string[];
  readonly token: string | undefined;
  readonly tls: TlsOptions | boolean;
  readonly timeoutMs: number;
  readonly retryTimeoutMs: number;
  readonly maxAttempts: number;
  readonly backoffInitialMs: number;
  readonly backoffMaxMs: number;
  /** 0: no keepalive PINGs. */
  readonly keepaliveMs: number;
  readonly keepaliveTimeoutMs: number;
  /** @internal See {@link ClientOptions.clock}. */
  readonly clock: SdkClock;
  /** @internal See {@link ClientOptions.random}. */
  readonly random: RandomSource;
  /** @internal See {@link ClientOptions.transportFactory}. */
  readonly transportFactory: ((address: string) => Transport) | undefined;
}

function nonNegative(name: string, value: number): number {
  if (!Number.isFinite(value) || value < 0)
    throw new TypeError(`casq: options.${name} must be a finite number of ms, at least 0 (got ${value})`);
  return value;
}

/** Validates options and applies defaults. Throws a TypeError for an empty broker list or a negative keepalive. */
export function resolveClientOptions(options: ClientOptions): ResolvedClientOptions {
  const brokers = options.brokers.map((b) => b.trim()).filter((b) => b !== "");
  if (brokers.length === 0) throw new TypeError("casq: options.brokers needs at least one host:port");
  return {
    brokers: [...new Set(brokers)],
    token: options.token,
    tls: options.tls ?? false,
    timeoutMs: options.timeoutMs ?? 30_000,
    retryTimeoutMs: options.retryTimeoutMs ?? 30_000,
    maxAttempts: Math.max(1, options.maxAttempts ?? Number.POSITIVE_INFINITY),
    backoffInitialMs: options.backoffInitialMs ?? 100,
    backoffMaxMs: options.backoffMaxMs ?? 5_000,
    keepaliveMs: nonNegative("keepaliveMs", options.keepaliveMs ?? 10_000),
    keepaliveTimeoutMs: nonNegative("keepaliveTimeoutMs", options.keepaliveTimeoutMs ?? 10_000),
    clock: options.clock ?? systemClock,
    random: options.random ?? mathRandom,
    transportFactory: options.transportFactory,
  };
}
