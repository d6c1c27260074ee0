/**
 * `casq serve`: runs a casq broker in the foreground: the gRPC API
 * (QueueService, AdminService, health, reflection) on `--listen`, state in
 * the store named by `--store`. Every flag has an environment variable
 * (CASQ_STORE, CASQ_LISTEN, ...), the flag winning.
 *
 * Shutdown: the first SIGTERM or SIGINT stops gracefully (no new calls,
 * in-flight commits finish, Work streams are told to drain and end, shard
 * leases are released so another broker takes over at once) and exits 0; a
 * second signal exits immediately with 128 + the signal number.
 */
import { accessSync, constants } from "node:fs";
import { type Command, InvalidArgumentError, Option } from "commander";
import { DEFAULT_SEGMENT_CACHE_BYTES } from "../../broker/segment-body-cache.ts";
import type { StoreUrl } from "../../store/open-store.ts";
import { CliError, ExitCode, usageError } from "../cli-error.ts";
import { systemErrorCode } from "../client.ts";
import {
  applyHeapGrowth,
  DEFAULT_HEAP_GROWTH_MIN_MIB,
  DEFAULT_HEAP_GROWTH_PERCENT,
  MAX_HEAP_GROWTH_MIN_MIB,
  MAX_HEAP_GROWTH_PERCENT,
} from "../heap-growth.ts";
import { hostPortText, parseDurationMs } from "../parse.ts";

/** The embedded default store (the same as open-store.ts's DEFAULT_STORE_URL, which loads the S3 client). */
const DEFAULT_STORE_URL = "file:./casq-data";

/** The accepted store URL forms, for the help text. */
const STORE_URL_FORMS = "file:PATH, s3://BUCKET/PREFIX or memory:";

/** Default listen address of `casq serve`. */
export const DEFAULT_LISTEN = "127.0.0.1:50051";

const LOG_LEVELS = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;

interface ServeOptions {
  store: string;
  listen: string;
  advertise?: string;
  logLevel: (typeof LOG_LEVELS)[number];
  authTokens?: string;
  tlsCert?: string;
  tlsKey?: string;
  tlsClientCa?: string;
  autoCreateQueues: boolean;
  shutdownTimeout: number;
  leaderLease: number;
  segmentCacheMib: number;
  warmSealedMessages: number;
  heapGrowthPercent: number;
  heapGrowthMinMib: number;
  headerTimeout: number;
  requestTimeout: number;
  idleTimeout: number;
  /** Telemetry: where to serve Prometheus metrics. */
  metricsListen?: string;
}

/** Parses `--leader-lease`: a duration from 1 s (renewals every 500 ms) to 5 min (slow failover). */
function leaderLeaseMs(value: string): number {
  const ms = parseDurationMs(value);
  if (ms < 1000 || ms > 300_000)
    throw new InvalidArgumentError(`--leader-lease must be between 1s and 5m (got ${value}).`);
  return ms;
}

/**
 * A parser for a flag that takes a whole number from `min` to `max`, whose
 * error names the flag (`--segment-cache-mib`, `--warm-sealed-messages`,
 * `--heap-growth-percent`, `--heap-growth-min-mib`).
 */
function wholeNumberOf(flag: string, min: number, max: number): (value: string) => number {
  return (value: string) => {
    const n = Number(value);
    if (!/^[0-9]+$/.test(value) || n < min || n > max)
      throw new InvalidArgumentError(`${flag} must be a whole number from ${min} to ${max} (got ${value}).`);
    return n;
  };
}

/** `--segment-cache-mib`: MiB from 1 to 1,048,576 (1 TiB). */
const segmentCacheMib = wholeNumberOf("--segment-cache-mib", 1, 1_048_576);

/** `--warm-sealed-messages`: from 0 to 100,000,000. */
const warmSealedMessages = wholeNumberOf("--warm-sealed-messages", 0, 100_000_000);

/** `--heap-growth-percent`: from 0 (V8's own) to {@link MAX_HEAP_GROWTH_PERCENT}. */
const heapGrowthPercent = wholeNumberOf("--heap-growth-percent", 0, MAX_HEAP_GROWTH_PERCENT);

/** `--heap-growth-min-mib`: from 0 to {@link MAX_HEAP_GROWTH_MIN_MIB}. */
const heapGrowthMinMib = wholeNumberOf("--heap-growth-min-mib", 0, MAX_HEAP_GROWTH_MIN_MIB);

/** Registers `casq serve`. */
export function registerServe(program: Command): void {
  program
    .command("serve")
    .description("run a casq broker: the gRPC API on --listen, all state in --store")
    .addOption(
      new Option("--store <url>", `where all state lives: ${STORE_URL_FORMS}`)
        .env("CASQ_STORE")
        .default(DEFAULT_STORE_URL),
    )
    .addOption(
      new Option("--listen <host:port>", "address to serve gRPC on (port 0: any free port)")
        .env("CASQ_LISTEN")
        .default(DEFAULT_LISTEN)
        .argParser(hostPortText),
    )
    .addOption(
      new Option(
        "--advertise <host:port>",
        "address other brokers send clients to (default: the bound address)",
      )
        .env("CASQ_ADVERTISE")
        .argParser(hostPortText),
    )
    .addOption(
      new Option("--log-level <level>", "log level (JSON logs on stderr)")
        .env("CASQ_LOG_LEVEL")
        .choices(LOG_LEVELS)
        .default("info"),
    )
    .addOption(
      new Option(
        "--auth-tokens <file>",
        "require bearer tokens: one `TOKEN PERMISSIONS [NAME]` per line (produce, consume, admin)",
      ).env("CASQ_AUTH_TOKENS"),
    )
    .addOption(
      new Option("--tls-cert <file>", "serve TLS with this PEM certificate chain").env("CASQ_TLS_CERT"),
    )
    .addOption(new Option("--tls-key <file>", "PEM private key of --tls-cert").env("CASQ_TLS_KEY"))
    .addOption(
      new Option(
        "--tls-client-ca <file>",
        "require client certificates signed by this PEM CA (mutual TLS)",
      ).env("CASQ_TLS_CLIENT_CA"),
    )
    .addOption(
      new Option(
        "--auto-create-queues <on|off>",
        "on: an enqueue to a missing queue creates it (1 shard); off: NOT_FOUND",
      )
        .env("CASQ_AUTO_CREATE_QUEUES")
        .default(true, "on")
        .argParser(parseSwitch),
    )
    .addOption(
      new Option("--shutdown-timeout <duration>", "longest graceful shutdown before streams are cut")
        .env("CASQ_SHUTDOWN_TIMEOUT")
        .default(30_000, "30s")
        .argParser(parseDurationMs),
    )
    .addOption(
      new Option(
        "--leader-lease <duration>",
        "shard leadership lease: how long a dead broker's shards wait before another broker takes them over; an idle shard is renewed every half lease (1s..5m)",
      )
        .env("CASQ_LEADER_LEASE")
        .default(10_000, "10s")
        .argParser(leaderLeaseMs),
    )
    .addOption(
      new Option(
        "--segment-cache-mib <n>",
        "memory for the bodies of sealed messages (payloads, headers), all shards together; the rest are read from their segments when claimed",
      )
        .env("CASQ_SEGMENT_CACHE_MIB")
        .default(DEFAULT_SEGMENT_CACHE_BYTES / 1024 / 1024)
        .argParser(segmentCacheMib),
    )
    .addOption(
      new Option(
        "--warm-sealed-messages <n>",
        "sealed messages each shard keeps in memory; beyond them, segments nothing has touched yet stay in the store until claims reach them",
      )
        .env("CASQ_WARM_SEALED_MESSAGES")
        .default(20_000, "20000")
        .argParser(warmSealedMessages),
    )
    .addOption(
      new Option(
        "--heap-growth-percent <n>",
        "how far the JS heap may grow past what the last full garbage collection found live before the next, in percent of the live heap (but at least --heap-growth-min-mib); 0: V8's own growth (up to 300%), which holds more garbage; lower keeps a busy broker smaller for more CPU",
      )
        .env("CASQ_HEAP_GROWTH_PERCENT")
        .default(DEFAULT_HEAP_GROWTH_PERCENT, String(DEFAULT_HEAP_GROWTH_PERCENT))
        .argParser(heapGrowthPercent),
    )
    .addOption(
      new Option(
        "--heap-growth-min-mib <n>",
        "the least the JS heap may grow before the next full garbage collection, so a small heap is not collected too often (with --heap-growth-percent above 0)",
      )
        .env("CASQ_HEAP_GROWTH_MIN_MIB")
        .default(DEFAULT_HEAP_GROWTH_MIN_MIB, String(DEFAULT_HEAP_GROWTH_MIN_MIB))
        .argParser(heapGrowthMinMib),
    )
    .addOption(
      new Option(
        "--header-timeout <duration>",
        "a new connection must send its first request's headers (HTTP/1.1) or start its first call (HTTP/2) within this",
      )
        .env("CASQ_HEADER_TIMEOUT")
        .default(30_000, "30s")
        .argParser(parseDurationMs),
    )
    .addOption(
      new Option("--request-timeout <duration>", "an HTTP/1.1 request must be received whole within this")
        .env("CASQ_REQUEST_TIMEOUT")
        .default(300_000, "5m")
        .argParser(parseDurationMs),
    )
    .addOption(
      new Option(
        "--idle-timeout <duration>",
        "close a connection with no call in progress after this (open streams, e.g. Work, are never cut)",
      )
        .env("CASQ_IDLE_TIMEOUT")
        .default(300_000, "5m")
        .argParser(parseDurationMs),
    )
    // Telemetry: Prometheus metrics on their own address (off unless given).
    .addOption(
      new Option(
        "--metrics-listen <host:port>",
        "serve Prometheus metrics at http://HOST:PORT/metrics (plain HTTP; default: off)",
      )
        .env("CASQ_METRICS_LISTEN")
        .argParser(hostPortText),
    )
    .addHelpText(
      "after",
      `
Store URLs:
  file:./casq-data                 a directory on local disk (the default; safe between processes)
  s3://BUCKET/PREFIX?endpoint=http://127.0.0.1:9000&region=us-east-1&path_style=true
                                   S3 or an S3-compatible server; credentials from the AWS chain
  memory:                          in memory, gone when the process exits (tests)

Stopping: SIGTERM or Ctrl-C stops gracefully (in-flight writes finish, workers are told to
drain, shard leases are released so another broker takes over at once) and exits 0; a second
signal exits at once (130 for SIGINT, 143 for SIGTERM).
Exit codes: 0 stopped cleanly, 1 failed (store misconfigured: credentials, bucket, directory;
port in use, ...), 2 bad flag or store URL. A store that does not answer at start (outage)
is not fatal: the broker starts NOT_SERVING and serves once the store answers.

Examples:
  $ casq serve
  $ casq serve --store file:/var/lib/casq --listen 0.0.0.0:50051 --advertise casq-1.internal:50051
  $ CASQ_STORE='s3://my-bucket/casq?region=eu-west-1' casq serve
  $ casq serve --tls-cert server.pem --tls-key server-key.pem --auth-tokens tokens.txt
  $ casq serve --metrics-listen 127.0.0.1:9464    # Prometheus scrapes http://127.0.0.1:9464/metrics`,
    )
    .action(async (options: ServeOptions) => {
      await serve(options);
    });
}

/** Parses on/off (also true/false, yes/no, 1/0). */
function parseSwitch(value: string): boolean {
  const v = value.trim().toLowerCase();
  if (["on", "true", "yes", "1"].includes(v)) return true;
  if (["off", "false", "no", "0"].includes(v)) return false;
  throw new InvalidArgumentError(`"${value}" is not on or off.`);
}

function describeStore(url: string, parsed: StoreUrl): string {
  switch (parsed.kind) {
    case "file":
      return `file:${parsed.root} (a directory on local disk)`;
    case "s3":
      return `s3://${parsed.bucket}/${parsed.prefix}${parsed.endpoint === undefined ? "" : ` at ${parsed.endpoint}`} (region ${parsed.region})`;
    case "memory":
      return "memory: (in this process only; everything is lost when it exits)";
    default:
      return url;
  }
}

async function serve(options: ServeOptions): Promise<void> {
  applyHeapGrowth(options.heapGrowthPercent, options.heapGrowthMinMib); // first: before the broker's heap grows
  // Loaded here, not at the top: the store code pulls in the S3 client and the
  // server stack, which the client commands do not need.
  const { parseStoreUrl, StoreUrlError } = await import("../../store/open-store.ts");
  const { pino } = await import("pino");
  let parsed: StoreUrl;
  try {
    parsed = parseStoreUrl(options.store);
  } catch (error) {
    if (error instanceof StoreUrlError) throw usageError(`--store: ${error.message}`);
    throw error;
  }
  if ((options.tlsCert === undefined) !== (options.tlsKey === undefined)) {
    throw usageError("--tls-cert and --tls-key go together: give both to serve TLS");
  }
  for (const [flag, ms] of [
    ["--header-timeout", options.headerTimeout],
    ["--request-timeout", options.requestTimeout],
    ["--idle-timeout", options.idleTimeout],
  ] as const) {
    // Node timers take at most 2^31-1 ms (~24.8 days).
    if (ms <= 0 || ms > 2_147_483_647) throw usageError(`${flag} must be between 1ms and 24d`);
  }
  if (options.requestTimeout < options.headerTimeout) {
    throw usageError(
      "--request-timeout must be at least --header-timeout (the headers are part of the request)",
    );
  }
  if (options.tlsClientCa !== undefined && options.tlsCert === undefined) {
    throw usageError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)");
  }
  const files: [string, string | undefined][] = [
    ["--auth-tokens", options.authTokens],
    ["--tls-cert", options.tlsCert],
    ["--tls-key", options.tlsKey],
    ["--tls-client-ca", options.tlsClientCa],
  ];
  for (const [flag, path] of files) {
    if (path === undefined) continue;
    try {
      accessSync(path, constants.R_OK);
    } catch (error) {
      throw usageError(
        `${flag} ${path}: cannot read it (${(error as NodeJS.ErrnoException).code ?? "error"})`,
      );
    }
  }

  const logger = pino({ level: options.logLevel, base: { service: "casq" } }, pino.destination(2));
  await checkStoreAtStartup(options.store, logger);
  const { startCasqServer } = await import("../../service/casq-server.ts");
  // Telemetry: tracing from OTEL_TRACES_EXPORTER (default none: the SDK is not even loaded).
  let tracing: import("../../telemetry/trace-setup.ts").EnvTracing | undefined;
  const exporterEnv = (process.env.OTEL_TRACES_EXPORTER ?? "none").trim().toLowerCase();
  if (exporterEnv !== "" && exporterEnv !== "none") {
    const { tracingFromEnv, TraceConfigError } = await import("../../telemetry/trace-setup.ts");
    try {
      tracing = tracingFromEnv(process.env);
    } catch (error) {
      if (error instanceof TraceConfigError) throw usageError(error.message);
      throw error;
    }
  }
  let server: Awaited<ReturnType<typeof startCasqServer>>;
  try {
    server = await startCasqServer({
      store: options.store,
      listen: options.listen,
      logger,
      ...(options.advertise !== undefined && { advertise: options.advertise }),
      ...(options.tlsCert !== undefined &&
        options.tlsKey !== undefined && {
          tls: {
            certFile: options.tlsCert,
            keyFile: options.tlsKey,
            ...(options.tlsClientCa !== undefined && { clientCaFile: options.tlsClientCa }),
          },
        }),
      ...(options.authTokens !== undefined && { authTokensFile: options.authTokens }),
      autoCreateQueues: options.autoCreateQueues,
      commit: { leaseMs: options.leaderLease, warmSealedMessages: options.warmSealedMessages },
      segmentCacheBytes: options.segmentCacheMib * 1024 * 1024,
      connectionTimeouts: {
        headersMs: options.headerTimeout,
        requestMs: options.requestTimeout,
        idleMs: options.idleTimeout,
      },
      ...(options.metricsListen !== undefined && { metricsListen: options.metricsListen }),
      ...(tracing !== undefined && { tracing: { tracerProvider: tracing.tracerProvider } }), // Telemetry: tracing
    });
  } catch (error) {
    await tracing?.shutdown().catch(() => {}); // Telemetry: tracing
    throw startFailure(error, options);
  }

  // Listen for the stop signals before saying "listening on": whoever reads
  // that line may send SIGTERM at once, and the kernel accepts connections
  // before this process runs again, so a handler installed after the line
  // could come too late and leave SIGTERM's default action (death, no cleanup).
  const signalReceived = new Promise<NodeJS.Signals>((resolve) => {
    process.once("SIGINT", () => resolve("SIGINT"));
    process.once("SIGTERM", () => resolve("SIGTERM"));
  });
  const scheme =
    options.tlsCert === undefined ? "plaintext" : options.tlsClientCa === undefined ? "TLS" : "mutual TLS";
  const auth = options.authTokens === undefined ? "" : ", bearer tokens required";
  const out = (line: string) => process.stdout.write(`casq serve: ${line}\n`);
  out(`listening on ${server.address} (gRPC, ${scheme}${auth}; health and reflection on)`);
  out(`state lives in ${describeStore(options.store, parsed)}`);
  if (server.metricsAddress !== undefined)
    out(`metrics on http://${server.metricsAddress}/metrics (Prometheus text format)`);
  if (tracing !== undefined)
    out(
      `traces to ${tracing.exporters.map((e) => (e === "otlp" ? `otlp (${tracing?.protocol} ${tracing?.endpoint})` : e)).join(", ")}`,
    ); // Telemetry: tracing
  if (server.advertisedAddress !== server.address)
    out(`advertised to clients as ${server.advertisedAddress}`);
  out("stop with Ctrl-C or SIGTERM (graceful; a second signal exits at once)");

  const signal = await signalReceived;
  const now = (second: NodeJS.Signals) => {
    process.stderr.write(`casq serve: ${second} again: exiting now without finishing the shutdown\n`);
    process.exit(128 + (second === "SIGINT" ? 2 : 15));
  };
  process.once("SIGINT", () => now("SIGINT"));
  process.once("SIGTERM", () => now("SIGTERM"));
  out(`${signal}: shutting down gracefully (signal again to exit at once)`);
  try {
    await server.close({ graceful: true, timeoutMs: options.shutdownTimeout });
    await tracing?.shutdown().catch(() => {}); // Telemetry: tracing — flush buffered spans
  } catch (error) {
    logger.flush();
    throw new CliError(
      ExitCode.serverError,
      `shutdown failed: ${(error as Error).message ?? String(error)}`,
      {
        cause: error,
      },
    );
  }
  logger.flush();
  out("stopped");
}

/**
 * One probe of the store before anything listens (store-probe.ts). A store
 * that cannot work as configured (no or wrong credentials, access denied, a
 * missing bucket, a directory that cannot be created or written) ends the
 * start with exit 1 and what to fix: restarting cannot help. An outage (no
 * answer, 5xx) is logged and the broker starts NOT_SERVING, serving as soon
 * as the store answers.
 */
async function checkStoreAtStartup(store: string, logger: import("pino").Logger): Promise<void> {
  const { probeStoreUrl } = await import("../../store/store-probe.ts");
  const probe = await probeStoreUrl(store);
  if (probe.ok) return;
  if (probe.permanent) {
    logger.error({ store, cause: probe.reason }, "object store misconfigured: not starting");
    logger.flush();
    throw new CliError(ExitCode.serverError, `--store ${store}: ${probe.reason}`, {
      cause: probe.error,
    });
  }
  logger.warn(
    { store, cause: probe.reason },
    "object store not answering at startup: starting NOT_SERVING until it answers",
  );
}

function startFailure(error: unknown, options: ServeOptions): CliError {
  const message = error instanceof Error ? error.message : String(error);
  const code = systemErrorCode(error);
  if (code === "EADDRINUSE") {
    return new CliError(
      ExitCode.serverError,
      `cannot listen on ${options.listen}: the address is in use (another casq serve?); choose another with --listen`,
      { cause: error },
    );
  }
  if (code === "EACCES") {
    return new CliError(
      ExitCode.serverError,
      `cannot listen on ${options.listen}: permission denied (ports below 1024 need privileges)`,
      { cause: error },
    );
  }
  if (code === "EADDRNOTAVAIL") {
    return new CliError(
      ExitCode.serverError,
      `cannot listen on ${options.listen}: no such local address; use 127.0.0.1, 0.0.0.0 or an address of this host`,
      { cause: error },
    );
  }
  if (error instanceof Error && error.name === "TokenFileError") {
    return new CliError(ExitCode.usage, `--auth-tokens ${options.authTokens}: ${message}`, { cause: error });
  }
  return new CliError(ExitCode.serverError, `cannot start the broker: ${message}`, { cause: error });
}
