/**
 * The casq server: one broker behind one port that speaks gRPC, gRPC-Web and
 * Connect (`casq serve` wraps {@link startCasqServer}). gRPC clients (HTTP/2)
 * are served by @grpc/grpc-js, Connect and gRPC-Web clients (HTTP/1.1) by
 * @connectrpc/connect-node; both run the same service implementations and
 * interceptors (listener.ts, grpc-js-adapter.ts).
 *
 * Startup, in order: open the store (wrapped to retry transient failures),
 * bind the port (so the advertised address is known before any shard
 * document names this broker), build the broker with the queue catalog as
 * its source of shard counts, probe the store once for health, and start
 * serving QueueService, AdminService, grpc.health.v1.Health and server
 * reflection (v1 and v1alpha).
 *
 * Graceful close, in order:
 * 1. health says NOT_SERVING, the port stops accepting, and new casq.v1 calls
 *    on open connections get UNAVAILABLE "broker shutting down";
 * 2. Work streams are drained: no more jobs, `draining` sent, the worker's
 *    acks/nacks/heartbeats still answered for a grace period, then the stream
 *    ends with UNAVAILABLE "broker shutting down" (a stream whose worker does
 *    not read is reset, and the jobs it holds are released: work-stream.ts);
 *    at the same time EnqueueStreams answer what they hold, refuse new
 *    requests (UNAVAILABLE, not applied) and end with UNAVAILABLE;
 * 3. calls in flight finish (their commits land);
 * 4. the broker stops with `release`: buffered operations are committed and
 *    every shard lease is handed back, so another broker takes over at once;
 * 5. connections are closed and the store is released.
 * Every step is bounded by `timeoutMs` overall; what is left then is cut.
 * A non-graceful close skips straight to cutting connections and stops the
 * broker without releasing leases (other brokers take over after the lease
 * runs out, as after a crash).
 */

import { randomUUID } from "node:crypto";
import { setMaxListeners } from "node:events";
import type net from "node:net";
import { hostname } from "node:os";
import { AdminService, file_casq_v1_admin_service } from "@casq/api/casq/v1/admin_service_pb.ts";
import { file_casq_v1_errors } from "@casq/api/casq/v1/errors_pb.ts";
import { file_casq_v1_queue_service, QueueService } from "@casq/api/casq/v1/queue_service_pb.ts";
import { file_grpc_health_v1_health, Health } from "@casq/api/grpc/health/v1/health_pb.ts";
import {
  file_grpc_reflection_v1_reflection,
  ServerReflection as ServerReflectionV1,
} from "@casq/api/grpc/reflection/v1/reflection_pb.ts";
import {
  file_grpc_reflection_v1alpha_reflection,
  ServerReflection as ServerReflectionV1alpha,
} from "@casq/api/grpc/reflection/v1alpha/reflection_pb.ts";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import { trace as otelTrace, type TracerProvider } from "@opentelemetry/api";
import { type Logger, pino } from "pino";
import { Broker } from "../broker/broker.ts";
import { QueueCatalog } from "../broker/queue-catalog.ts";
import type { CommitOptions, ShardObserverWithTracing } from "../broker/shard-leader.ts";
import type { ShardObserver } from "../broker/shard-observer.ts";
import { combineObservers, InstrumentedStore, type StoreObserver } from "../store/instrumented-store.ts";
import type { ObjectStore } from "../store/object-store.ts";
import { openStore } from "../store/open-store.ts";
import { RetryingStore } from "../store/retrying-store.ts";
import {
  brokerMetricsObserver,
  combineShardObservers,
  createBrokerRefresher,
} from "../telemetry/broker-metrics.ts";
import { CasqMetrics } from "../telemetry/metrics.ts";
import { type RunningMetricsServer, startMetricsServer } from "../telemetry/metrics-server.ts";
import { rpcMetricsInterceptor } from "../telemetry/rpc-metrics.ts";
import { storeMetricsObserver } from "../telemetry/store-metrics.ts";
import { CasqTracing } from "../telemetry/tracing.ts";
import { type Clock, systemClock } from "../util/clock.ts";
import { formatAddress } from "../util/listen-address.ts";
import { type Random, systemRandom } from "../util/random.ts";
import { createAdminService } from "./admin-service.ts";
import { createAuthInterceptor, loadTokenFile } from "./auth.ts";
import { CallTracker } from "./call-tracker.ts";
import { EnqueueStreamRegistry } from "./enqueue-stream-registry.ts";
import { createErrorInterceptor } from "./grpc-errors.ts";
import { registerConnectService } from "./grpc-js-adapter.ts";
import { createHealthService, HealthMonitor } from "./health-service.ts";
import { loggingShardObserver } from "./lifecycle-log.ts";
import {
  type ConnectionTimeouts,
  callContextValues,
  DEFAULT_CONNECTION_TIMEOUTS,
  type Http1Handler,
  type Http2Side,
  type RunningListener,
  startListener,
  type TlsFiles,
} from "./listener.ts";
import {
  MalformedRequestLog,
  malformedRequestInterceptor,
  malformedUnaryRequest,
  withMalformedRequestStatus,
} from "./malformed-requests.ts";
import { createQueueService } from "./queue-service.ts";
import {
  createReflectionServiceV1,
  createReflectionServiceV1alpha,
  DescriptorIndex,
} from "./reflection-service.ts";
import type { ServiceContext } from "./service-context.ts";
import { ShardDirectory } from "./shard-directory.ts";
import { WorkRegistry } from "./work-registry.ts";

/** Options of {@link startCasqServer}. */
export interface CasqServerOptions {
  /**
   * Where the state lives: a store URL (`file:./casq-data`, `memory:`,
   * `s3://bucket/prefix?...`; opened and wrapped to retry transient
   * failures) or a ready {@link ObjectStore} (used as is; the server closes it).
   */
  readonly store: string | ObjectStore;
  /** `HOST:PORT` to listen on (`[v6]:PORT`, `:PORT` for all interfaces); port 0 picks a free port. */
  readonly listen: string;
  /**
   * `HOST:PORT` written into shard documents and redirects, i.e. where other
   * brokers send clients. Default: the bound address (with this machine's
   * host name instead of a wildcard address).
   */
  readonly advertise?: string;
  /** Serve TLS with these files; with `clientCaFile`, require client certificates (mutual TLS). */
  readonly tls?: TlsFiles;
  /** Bearer token file (format in `auth.ts` / docs/protocol.md); unset: no authentication. */
  readonly authTokensFile?: string;
  /** Structured logger. Default: pino at info level on stderr. */
  readonly logger?: Logger;
  /** Enqueue to a missing queue creates it with one shard. Default true. */
  readonly autoCreateQueues?: boolean;
  /** Tuning of every shard's commit loop. */
  readonly commit?: Partial<CommitOptions>;
  /** Memory for sealed messages' bodies, all shards together (default 32 MiB). */
  readonly segmentCacheBytes?: number;
  /** Clock of the engine. Default: the system clock. */
  readonly clock?: Clock;
  /** Randomness of the engine (ids, jitter). Default: Math.random. */
  readonly random?: Random;
  /** Broker id (unique per process start). Default: `<host>-<pid>-<random>`. */
  readonly brokerId?: string;
  /** Re-read a cached queue manifest after this long (ms). Default 5000. */
  readonly catalogRefreshMs?: number;
  /** Probe the store for health this often (ms). Default 5000. */
  readonly healthProbeIntervalMs?: number;
  /** Header, request and idle timeouts of client connections (see listener.ts); defaults as there. */
  readonly connectionTimeouts?: ConnectionTimeouts;
  /** Largest request message accepted (bytes); larger is RESOURCE_EXHAUSTED. Default 64 MiB. */
  readonly maxRequestBytes?: number;
  /** Extra observer of the shard leaders (metrics, traces). */
  readonly observer?: ShardObserver;
  /**
   * Telemetry: `HOST:PORT` to serve Prometheus metrics on (`GET /metrics`,
   * plain HTTP, its own port); port 0 picks a free port. Unset: no metrics
   * are collected at all.
   */
  readonly metricsListen?: string;
  /**
   * Telemetry: tracing. Given, every casq.v1 RPC, group commit, store call and
   * job delivery makes spans with `tracerProvider` (default: the global one).
   * Unset: no tracing code runs at all. The provider's owner flushes it.
   */
  readonly tracing?: { readonly tracerProvider?: TracerProvider };
}

/** Options of {@link RunningCasqServer.close}. */
export interface CloseOptions {
  /** Drain and hand leases back (true, the default), or cut everything now (false). */
  readonly graceful?: boolean;
  /** Bound on the whole graceful shutdown (ms). Default 30000. */
  readonly timeoutMs?: number;
}

/** A started server. */
export interface RunningCasqServer {
  /** The bound address, `HOST:PORT` (the actual port when 0 was asked for). */
  readonly address: string;
  /** The address clients are redirected to (see {@link CasqServerOptions.advertise}). */
  readonly advertisedAddress: string;
  /** The broker serving the shards. */
  readonly broker: Broker;
  /** The queue catalog (manifests). */
  readonly catalog: QueueCatalog;
  /** The object store in use. */
  readonly store: ObjectStore;
  /** Open Work streams and active workers. */
  readonly work: WorkRegistry;
  /** Open EnqueueStreams. */
  readonly enqueueStreams: EnqueueStreamRegistry;
  /** Calls in flight. */
  readonly calls: CallTracker;
  /** Health status of the server. */
  readonly health: HealthMonitor;
  /** Telemetry: where `GET /metrics` is served (`HOST:PORT`), when `metricsListen` was given. */
  readonly metricsAddress: string | undefined;
  /** Telemetry: the metrics registry and families, when `metricsListen` was given. */
  readonly metrics: CasqMetrics | undefined;
  /** Stops the server (see the module header); safe to call more than once. */
  close(options?: CloseOptions): Promise<void>;
}

const SERVED_SERVICES = [
  QueueService.typeName,
  AdminService.typeName,
  Health.typeName,
  ServerReflectionV1.typeName,
  ServerReflectionV1alpha.typeName,
];

/** Starts a casq server (see the module header). Rejects with the system error when the port cannot be bound. */
export async function startCasqServer(options: CasqServerOptions): Promise<RunningCasqServer> {
  const logger = options.logger ?? pino({ level: "info", base: { service: "casq" } }, pino.destination(2));
  const clock = options.clock ?? systemClock;
  const random = options.random ?? systemRandom;
  const tokens =
    options.authTokensFile === undefined ? undefined : await loadTokenFile(options.authTokensFile);
  // Telemetry: with metricsListen, every store call is counted. For a store URL the
  // InstrumentedStore sits inside the RetryingStore, so each attempt (each billed
  // request) counts; a ready ObjectStore is wrapped as a whole.
  const metrics = options.metricsListen === undefined ? undefined : new CasqMetrics();
  // Telemetry: tracing — a span per store attempt, per commit, per RPC, per delivery.
  const tracing =
    options.tracing === undefined
      ? undefined
      : new CasqTracing(options.tracing.tracerProvider ?? otelTrace.getTracerProvider());
  const storeObservers: StoreObserver[] = [];
  if (metrics) storeObservers.push(storeMetricsObserver(metrics));
  if (tracing) storeObservers.push(tracing.storeObserver());
  const instrument = (inner: ObjectStore): ObjectStore =>
    storeObservers.length === 0
      ? inner
      : new InstrumentedStore(inner, {
          observer:
            storeObservers.length === 1
              ? (storeObservers[0] as StoreObserver)
              : combineObservers(...storeObservers),
          clock,
        });
  const store =
    typeof options.store === "string"
      ? new RetryingStore(instrument(openStore(options.store)), {
          clock,
          random,
          onRetry: (e) => logger.debug({ op: e.op, key: e.key, attempt: e.attempt }, "store call retried"),
        })
      : instrument(options.store);

  const calls = new CallTracker();
  const work = new WorkRegistry();
  const enqueueStreams = new EnqueueStreamRegistry();
  const health = new HealthMonitor(store, clock, logger, options.healthProbeIntervalMs);
  const shutdown = new AbortController();
  // Every call's context listens on this signal: many at once is normal, not a leak.
  setMaxListeners(0, shutdown.signal);

  // The port is bound first: the broker's advertised address goes into the shard
  // documents it writes. Until the handlers are ready, HTTP/1.1 requests get 503
  // and HTTP/2 connections wait (grpc-js would answer UNIMPLEMENTED).
  let handler: Http1Handler = (_req, res) => {
    res.writeHead(503, { "content-type": "text/plain" });
    res.end("casq server is starting\n");
  };
  const maxRequestBytes = options.maxRequestBytes ?? 64 * 1024 * 1024;
  const grpcServer = new grpc.Server({
    "grpc.max_receive_message_length": maxRequestBytes,
    "grpc.max_send_message_length": -1,
    // HTTP/2 connections with no call open for idleMs get GOAWAY (see listener.ts).
    "grpc.max_connection_idle_ms": options.connectionTimeouts?.idleMs ?? DEFAULT_CONNECTION_TIMEOUTS.idleMs,
    // Pings find dead peers of quiet connections (a Work stream with nothing to do).
    "grpc.keepalive_time_ms": 60_000,
    "grpc.keepalive_timeout_ms": 20_000,
    // Channelz bookkeeping costs on every call and nothing reads it.
    "grpc.enable_channelz": 0,
  });
  const injector = grpcServer.createConnectionInjector(grpc.ServerCredentials.createInsecure());
  const waiting: net.Socket[] = [];
  let grpcReady = false;
  const http2: Http2Side = {
    injectConnection: (socket) => (grpcReady ? injector.injectConnection(socket) : waiting.push(socket)),
    drain: (graceMs) => injector.drain(graceMs),
    destroy: () => {
      for (const socket of waiting.splice(0)) socket.destroy();
      injector.destroy();
    },
  };
  // Telemetry: the metrics endpoint is bound first, so a bad metrics address fails the start.
  let metricsServer: RunningMetricsServer | undefined;
  let listener: RunningListener;
  try {
    if (metrics && options.metricsListen !== undefined)
      metricsServer = await startMetricsServer({
        listen: options.metricsListen,
        metrics,
        onError: (error) => logger.warn({ err: error }, "metrics scrape failed"),
      });
    listener = await startListener({
      listen: options.listen,
      ...(options.tls ? { tls: options.tls } : {}),
      handler: (req, res) => handler(req, res),
      http2,
      logger,
      ...(options.connectionTimeouts ? { timeouts: options.connectionTimeouts } : {}),
    });
  } catch (error) {
    grpcServer.forceShutdown();
    await metricsServer?.close();
    await store.close().catch(() => {});
    throw error;
  }
  const address = formatAddress(listener.host, listener.port);
  const advertisedAddress =
    options.advertise ?? (isWildcard(listener.host) ? formatAddress(hostname(), listener.port) : address);

  const identity = {
    id: options.brokerId ?? `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`,
    address: advertisedAddress,
  };
  const catalog = new QueueCatalog({
    store,
    clock,
    ...(options.catalogRefreshMs === undefined ? {} : { refreshMs: options.catalogRefreshMs }),
  });
  const broker = new Broker({
    store,
    identity,
    clock,
    random,
    shardsFor: (queue) => catalog.shardsFor(queue),
    // Telemetry: the metrics observer (if any) runs after the caller's observer.
    observer: withCommitTracing(
      loggingShardObserver(
        logger,
        metrics || tracing
          ? combineShardObservers(
              options.observer,
              metrics && brokerMetricsObserver(metrics),
              tracing?.shardObserver(),
            )
          : options.observer,
      ),
      tracing,
    ),
    ...(options.commit ? { commit: options.commit } : {}),
    ...(options.segmentCacheBytes !== undefined && { segmentCacheBytes: options.segmentCacheBytes }),
  });
  // Telemetry: queue state, buffers, leadership and workers are sampled at scrape time.
  metrics?.setRefresher(createBrokerRefresher(metrics, { broker, work, now: () => clock.now() }));
  const ctx: ServiceContext = {
    broker,
    catalog,
    store,
    clock,
    random,
    directory: new ShardDirectory({ broker, store, clock }),
    claimer: broker.claims,
    logger,
    autoCreateQueues: options.autoCreateQueues ?? true,
    work,
    enqueueStreams,
  };
  const index = new DescriptorIndex(
    [
      file_casq_v1_queue_service,
      file_casq_v1_admin_service,
      file_casq_v1_errors,
      file_grpc_health_v1_health,
      file_grpc_reflection_v1_reflection,
      file_grpc_reflection_v1alpha_reflection,
    ],
    SERVED_SERVICES,
  );
  // First: it marks the calls that reached the interceptors, which tells a malformed unary request from a bug.
  const malformed = new MalformedRequestLog(logger, clock);
  const interceptors: Interceptor[] = [malformedRequestInterceptor(malformed), calls.interceptor()];
  if (tracing) interceptors.push(tracing.interceptor()); // Telemetry: tracing, outside the error mapping
  if (metrics) interceptors.push(rpcMetricsInterceptor(metrics)); // telemetry: RPC latency and codes
  if (tokens) interceptors.push(createAuthInterceptor(tokens, logger));
  interceptors.push(createErrorInterceptor(logger));
  const running = listener;
  const grpcOptions = {
    interceptors,
    shutdownSignal: shutdown.signal,
    readMaxBytes: maxRequestBytes,
    // A fresh set per call, with the means to end the call's connection (see listener.ts).
    contextValues: (call: { getPeer(): string }) =>
      callContextValues(running.http2CallStarted(call.getPeer())),
    malformedRequest: (method: Parameters<typeof malformedUnaryRequest>[1], cause: ConnectError) =>
      malformedUnaryRequest(malformed, method, cause),
  };
  registerConnectService(grpcServer, QueueService, createQueueService(ctx), grpcOptions);
  registerConnectService(grpcServer, AdminService, createAdminService(ctx), grpcOptions);
  registerConnectService(
    grpcServer,
    Health,
    createHealthService(health, [QueueService.typeName, AdminService.typeName]),
    grpcOptions,
  );
  registerConnectService(grpcServer, ServerReflectionV1, createReflectionServiceV1(index), grpcOptions);
  registerConnectService(
    grpcServer,
    ServerReflectionV1alpha,
    createReflectionServiceV1alpha(index),
    grpcOptions,
  );
  grpcReady = true;
  for (const socket of waiting.splice(0)) if (!socket.destroyed) injector.injectConnection(socket);
  handler = connectNodeAdapter({
    routes: (router) => {
      router.service(QueueService, createQueueService(ctx));
      router.service(AdminService, createAdminService(ctx));
      router.service(Health, createHealthService(health, [QueueService.typeName, AdminService.typeName]));
      router.service(ServerReflectionV1, createReflectionServiceV1(index));
      router.service(ServerReflectionV1alpha, createReflectionServiceV1alpha(index));
      router.handlers.forEach((h, i) => {
        router.handlers[i] = withMalformedRequestStatus(h, malformed);
      });
    },
    // A fresh set per request, shared by the handler and its wrapper (see malformed-requests.ts),
    // with the means to end the call's connection (see listener.ts).
    contextValues: (req) => callContextValues(() => req.socket.destroy()),
    interceptors,
    shutdownSignal: shutdown.signal,
    readMaxBytes: maxRequestBytes,
    // Compressed requests are accepted, but answers go uncompressed: gzip of
    // every job and answer over 1 KiB (connect's default) was ~6 % of the
    // broker's CPU processing 1 KiB jobs, for bytes that cost nothing on the
    // networks brokers and workers share.
    compressMinBytes: Number.POSITIVE_INFINITY,
  });
  await health.start();

  if (!tokens && !isLoopback(listener.host))
    logger.warn(
      { address },
      "no authentication configured and listening beyond loopback: anyone who can reach this port can use every queue (set an auth token file)",
    );
  logger.info(
    {
      address,
      advertise: advertisedAddress,
      broker: identity.id,
      store: store.description,
      tls: options.tls ? (options.tls.clientCaFile ? "mutual" : "server") : "off",
      auth: tokens ? `${tokens.size} tokens` : "off",
      health: health.status === 1 ? "SERVING" : "NOT_SERVING",
      metrics: metricsServer ? `http://${metricsServer.address}/metrics` : "off",
    },
    "casq server listening",
  );

  let closing: Promise<void> | undefined;
  const close = (closeOptions: CloseOptions = {}): Promise<void> => {
    closing ??= stop(closeOptions);
    return closing;
  };

  const stop = async ({ graceful = true, timeoutMs = 30_000 }: CloseOptions): Promise<void> => {
    const started = clock.now();
    const left = () => Math.max(0, timeoutMs - (clock.now() - started));
    logger.info(
      { graceful, timeoutMs, workStreams: work.openStreams, calls: calls.inFlight },
      "casq server shutting down",
    );
    health.beginShutdown();
    calls.drain();
    const stopAccepting = listener.stopAccepting();
    if (graceful) {
      const graceMs = Math.min(5_000, Math.floor(timeoutMs / 2));
      await withDeadline(
        Promise.all([work.drainAll(graceMs, clock.now()), enqueueStreams.drainAll(graceMs)]),
        left(),
      );
      work.abortAll("broker shutting down: reconnect to another broker");
      enqueueStreams.abortAll("broker shutting down: reconnect to another broker");
      await withDeadline(calls.idle(), left());
    } else {
      work.abortAll("broker shutting down: reconnect to another broker");
      enqueueStreams.abortAll("broker shutting down: reconnect to another broker");
    }
    shutdown.abort(new ConnectError("broker shutting down: retry at another broker", Code.Unavailable));
    await health.stop();
    if (graceful) {
      if (!(await withDeadline(broker.stop({ release: true }), left())))
        logger.warn(
          "shard leases could not all be released in time; other brokers take over when they expire",
        );
    } else {
      broker.stop({ release: false }).catch(() => {});
    }
    // Calls are done by now: give HTTP/2 clients a moment to see GOAWAY, then cut what is left
    // (e.g. streams whose response ended but whose client never closed its side).
    await listener.closeConnections({ graceful, timeoutMs: graceful ? Math.min(500, left()) : 0 });
    grpcServer.forceShutdown();
    await stopAccepting;
    await metricsServer?.close(); // telemetry
    await store.close().catch((error: unknown) => logger.warn({ err: error }, "closing the store failed"));
    logger.info({ durationMs: clock.now() - started }, "casq server stopped");
  };

  return {
    address,
    advertisedAddress,
    broker,
    catalog,
    store,
    work,
    enqueueStreams,
    calls,
    health,
    metricsAddress: metricsServer?.address,
    metrics,
    close,
  };
}

/**
 * Waits for `promise` to settle, at most `ms`. Resolves true when it
 * fulfilled in time, false when it failed or the time ran out (never rejects).
 */
async function withDeadline(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const result = await Promise.race([
    promise.then(
      () => true,
      () => false,
    ),
    new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), ms);
    }),
  ]);
  clearTimeout(timer);
  return result;
}

/** Telemetry: tracing — hands the shard leaders the commit tracing hook (see ShardObserverWithTracing). */
function withCommitTracing(
  observer: ShardObserver,
  tracing: CasqTracing | undefined,
): ShardObserverWithTracing {
  return tracing ? { ...observer, commitTracing: tracing.commitTracing } : observer;
}

function isWildcard(host: string): boolean {
  return host === "0.0.0.0" || host === "::" || host === "";
}

function isLoopback(host: string): boolean {
  return host === "localhost" || host === "::1" || host.startsWith("127.");
}
