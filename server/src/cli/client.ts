/**
 * How CLI commands talk to a casq broker: gRPC over HTTP/2 (the TypeScript
 * SDK's transport, sdk/ts/src/grpc-transport.ts, on a connect-node session
 * the client closes), plaintext or TLS, with an optional bearer token.
 *
 * Redirects and failover: {@link CasqClient.call} runs every request through
 * the SDK's `callWithFailover` (sdk/ts/src/failover.ts), so the CLI follows
 * redirects as the SDKs do. A broker that does not lead the shard a request
 * needs answers UNAVAILABLE with the trailer `casq-leader-address` (and a
 * casq.v1.LeaderRedirect detail); the request goes to that leader. When the
 * leader cannot be reached (killed), the broker that redirected keeps
 * redirecting to it until the leader's lease runs out and then takes the
 * shard over: the request waits there with backoff, at most `--retry-timeout`,
 * saying so on stderr. Unlike the SDKs the CLI knows one broker, so an outage
 * of `--server` itself fails at once.
 *
 * Resending: a redirect (and a refused connection) means the request was not
 * applied (see the redirect convention in proto/casq/v1/errors.proto), so
 * resending it is safe. An attempt at a leader that timed out or lost its
 * connection after sending may have been applied; it is resent only for a
 * request marked idempotent (the default; `casq enqueue` without dedup ids is
 * not: it gives every message a generated dedup id unless `--no-dedup`). A
 * call marked `changesState` that fails after such an attempt throws a
 * {@link MaybeAppliedError} (exit 1), never "connection failed" (exit 4),
 * which promises nothing was applied. A read has nothing to apply: its
 * failure is reported as it is.
 *
 * Errors: {@link describeRpcError} turns a failed call into a {@link CliError}
 * a human understands, with the exit code of its kind (connection failed,
 * not found, usage, server error).
 */
import { readFileSync } from "node:fs";
import type * as http2 from "node:http2";
import { CasqError, LEADER_ADDRESS_TRAILER, type RedirectError, toCasqError } from "@casq/sdk";
import { resolveClientOptions } from "@casq/sdk/client-options.ts";
import { callWithFailover, mayHaveBeenApplied } from "@casq/sdk/failover.ts";
import { createGrpcTransport } from "@casq/sdk/grpc-transport.ts";
import { BrokerPool, bearerInterceptor } from "@casq/sdk/transport.ts";
import { type Client, Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { Http2SessionManager } from "@connectrpc/connect-node";
import { type Command, Option } from "commander";
import { AdminService, LeaderRedirectSchema, QueueService } from "./api.ts";
import { CliError, ExitCode, usageError } from "./cli-error.ts";
import { hostPortText, parseDurationMs } from "./parse.ts";

/** The default broker address of every client command. */
export const DEFAULT_SERVER = "127.0.0.1:50051";

/** How to reach the broker; filled from the connection flags. */
export interface ClientOptions {
  /** `HOST:PORT` of the broker. */
  readonly server: string;
  /** Bearer token sent as `authorization: Bearer TOKEN`. */
  readonly token?: string;
  /** Use TLS (implied by `ca`, `cert` and `key`). */
  readonly tls?: boolean;
  /** PEM file with the CA certificate(s) to trust instead of the system ones. */
  readonly ca?: string;
  /** PEM client certificate for mutual TLS. */
  readonly clientCert?: string;
  /** PEM private key of the client certificate. */
  readonly clientKey?: string;
  /** Deadline of each unary call, in milliseconds. */
  readonly timeout?: number;
  /** How long one request may wait for a dead leader's lease to run out, in milliseconds (default 30 s). */
  readonly retryTimeout?: number;
  /** Where notes such as "waiting for the leader lease…" go (default: stderr). */
  readonly notice?: (line: string) => void;
}

/** The two casq services on one broker. */
export interface CasqClients {
  /** Producer and worker API. */
  readonly queue: Client<typeof QueueService>;
  /** Administration API. */
  readonly admin: Client<typeof AdminService>;
}

/**
 * A failed call of which an attempt may have been applied: it ran into its
 * timeout, or its connection broke after the request was sent. Exit code 1;
 * the message says so.
 */
export class MaybeAppliedError extends CliError {
  constructor(message: string, options?: { cause?: unknown }) {
    super(ExitCode.serverError, message, options);
    this.name = "MaybeAppliedError";
  }
}

/** Options of {@link CasqClient.call}. */
export interface CallOptions {
  /**
   * `false`: the request must not be applied twice (an Enqueue without dedup
   * ids), so it is not resent after an attempt that may have been applied.
   * Default `true`.
   */
  readonly idempotent?: boolean;
  /**
   * `true`: the request changes state, so a failure after an attempt that may
   * have been applied is a {@link MaybeAppliedError}. Default `false` (a read:
   * e.g. a plaintext `casq stats` against a TLS server fails with the
   * connection error and its "pass --tls" hint).
   */
  readonly changesState?: boolean;
}

/** Per-call options the CLI passes to unary calls. */
export interface UnaryCallOptions {
  /** Deadline of the call in milliseconds. */
  readonly timeoutMs: number;
}

/**
 * Adds the connection flags (`--server`, `--token`, `--tls`, `--ca`,
 * `--client-cert`, `--client-key`, `--timeout`) with their environment variables to a command.
 */
export function addConnectionOptions(command: Command): Command {
  return command
    .addOption(
      new Option("--server <host:port>", "address of the casq broker")
        .env("CASQ_SERVER")
        .default(DEFAULT_SERVER)
        .argParser(hostPortText),
    )
    .addOption(
      new Option("--token <token>", "bearer token for a server started with --auth-tokens").env("CASQ_TOKEN"),
    )
    .addOption(new Option("--tls", "connect with TLS (system CAs unless --ca)").env("CASQ_TLS"))
    .addOption(new Option("--ca <file>", "PEM CA certificate(s) to trust; implies --tls").env("CASQ_CA"))
    .addOption(
      new Option("--client-cert <file>", "PEM client certificate for mutual TLS; implies --tls").env(
        "CASQ_CLIENT_CERT",
      ),
    )
    .addOption(new Option("--client-key <file>", "PEM private key of --client-cert").env("CASQ_CLIENT_KEY"))
    .addOption(
      new Option("--timeout <duration>", "deadline of each request, e.g. 10s")
        .default(30_000, "30s")
        .argParser(parseDurationMs),
    )
    .addOption(
      new Option(
        "--retry-timeout <duration>",
        "how long a request waits for a dead leader's lease to run out (0s: not at all)",
      )
        .default(30_000, "30s")
        .argParser(parseDurationMs),
    );
}

/**
 * A connection to a broker (and to the leaders it redirects to): one HTTP/2
 * session per address, closed by {@link CasqClient.close}.
 */
export class CasqClient {
  /** The broker addressed by `--server`. */
  readonly server: string;
  readonly #options: ClientOptions;
  readonly #sessions = new Map<string, Http2SessionManager>();
  readonly #clients = new Map<string, CasqClients>();
  /** Which broker to try (the SDK's preference and retry settings); its own transports are not used. */
  readonly #pool: BrokerPool;
  #nodeOptions: http2.SecureClientSessionOptions | undefined;

  constructor(options: ClientOptions) {
    this.#options = options;
    this.server = options.server;
    if (options.clientKey !== undefined && options.clientCert === undefined) {
      throw usageError("--client-key needs --client-cert (the client certificate it belongs to).");
    }
    if (options.clientCert !== undefined && options.clientKey === undefined) {
      throw usageError("--client-cert needs --client-key (the private key of the client certificate).");
    }
    this.#pool = new BrokerPool(
      resolveClientOptions({
        brokers: [options.server],
        timeoutMs: this.timeoutMs,
        retryTimeoutMs: options.retryTimeout ?? 30_000,
        // A person is waiting: look again at least every second.
        backoffMaxMs: 1_000,
      }),
    );
  }

  /** True when calls use TLS. */
  get tls(): boolean {
    const o = this.#options;
    return Boolean(o.tls || o.ca !== undefined || o.clientCert !== undefined);
  }

  /** Deadline of unary calls, in milliseconds. */
  get timeoutMs(): number {
    return this.#options.timeout ?? 30_000;
  }

  /** The clients for one broker address (default: `--server`). */
  clients(address: string = this.server): CasqClients {
    const cached = this.#clients.get(address);
    if (cached !== undefined) return cached;
    const baseUrl = `${this.tls ? "https" : "http"}://${address}`;
    const session = new Http2SessionManager(baseUrl, { idleConnectionTimeoutMs: 60_000 }, this.#tlsOptions());
    const token = this.#options.token;
    const interceptors: Interceptor[] = token !== undefined && token !== "" ? [bearerInterceptor(token)] : [];
    const transport = createGrpcTransport({ baseUrl, sessionManager: session, interceptors });
    const clients = {
      queue: createClient(QueueService, transport),
      admin: createClient(AdminService, transport),
    };
    this.#sessions.set(address, session);
    this.#clients.set(address, clients);
    return clients;
  }

  /**
   * Runs one request through the SDK's failover: from `--server` (or the
   * leader a previous request was redirected to) it follows redirects, and
   * waits out the lease of a leader that cannot be reached, at most
   * `--retry-timeout`, with a note on stderr. Any failure becomes a
   * {@link CliError}.
   */
  async call<T>(
    request: (clients: CasqClients, options: UnaryCallOptions) => Promise<T>,
    callOptions: CallOptions = {},
  ): Promise<T> {
    const first = this.#pool.preferred();
    let address = first;
    let waitedFor: RedirectError | undefined;
    // An attempt before the last one may have been applied.
    let uncertain = false;
    const announced = new Set<string>();
    try {
      return await callWithFailover(
        this.#pool,
        (attempt) => {
          address = attempt.address;
          uncertain = attempt.uncertain;
          return request(this.clients(attempt.address), { timeoutMs: attempt.timeoutMs });
        },
        {
          retryOutages: false,
          idempotent: callOptions.idempotent ?? true,
          onLeaderWait: (redirect) => {
            waitedFor = redirect;
            const key = `${redirect.queue}/${redirect.shard}/${redirect.leaderAddress}`;
            if (announced.has(key)) return;
            announced.add(key);
            const queue = redirect.queue === "" ? "" : ` of queue ${redirect.queue} shard ${redirect.shard}`;
            this.#notice(
              `waiting for the leader lease${queue} to expire (broker ${redirect.leaderAddress} unreachable)…`,
            );
          },
        },
      );
    } catch (error) {
      const connect = connectErrorOf(error);
      // Every attempt of the CLI runs into its own timeout: no caller deadline.
      const maybeApplied =
        callOptions.changesState === true && (uncertain || mayHaveBeenApplied(toCasqError(error), true));
      if (waitedFor !== undefined && leaderAddressOf(connect) === waitedFor.leaderAddress) {
        const text =
          `${address} still redirects to ${waitedFor.leaderAddress}, which is unreachable; its leader lease ` +
          "did not run out within --retry-timeout. Retry later, or raise --retry-timeout.";
        if (maybeApplied) {
          throw new MaybeAppliedError(`${text} ${MAYBE_APPLIED_NOTE(waitedFor.leaderAddress)}`, {
            cause: error,
          });
        }
        throw new CliError(ExitCode.connectionFailed, text, { cause: error });
      }
      const described = describeRpcError(
        connect,
        address,
        this.tls,
        address === first ? {} : { redirectedFrom: first },
      );
      if (!maybeApplied || described instanceof MaybeAppliedError) throw described;
      const note =
        connect instanceof ConnectError && connect.code === Code.DeadlineExceeded
          ? ""
          : ` ${MAYBE_APPLIED_NOTE(address)}`;
      throw new MaybeAppliedError(`${described.message}${note}`, { cause: error });
    }
  }

  #notice(line: string): void {
    if (this.#options.notice) this.#options.notice(line);
    else process.stderr.write(`casq: ${line}\n`);
  }

  /** Closes every HTTP/2 session. */
  close(): void {
    for (const session of this.#sessions.values()) session.abort();
    this.#sessions.clear();
    this.#clients.clear();
  }

  #tlsOptions(): http2.SecureClientSessionOptions {
    if (this.#nodeOptions !== undefined) return this.#nodeOptions;
    const o = this.#options;
    const options: http2.SecureClientSessionOptions = {};
    if (o.ca !== undefined) options.ca = readPem(o.ca, "--ca");
    if (o.clientCert !== undefined) options.cert = readPem(o.clientCert, "--client-cert");
    if (o.clientKey !== undefined) options.key = readPem(o.clientKey, "--client-key");
    this.#nodeOptions = options;
    return options;
  }
}

/** What a {@link MaybeAppliedError} adds to the message. */
const MAYBE_APPLIED_NOTE = (broker: string) =>
  `An attempt at ${broker} timed out or lost its connection after sending the request, so it may have been applied.`;

function readPem(path: string, flag: string): Buffer {
  try {
    return readFileSync(path);
  } catch (error) {
    throw usageError(`${flag} ${path}: cannot read the file (${(error as Error).message}).`);
  }
}

/**
 * The transport's error behind what the SDK's failover threw (its CasqError
 * keeps the ConnectError as `cause`), so that {@link describeRpcError} sees
 * trailers and system error codes; errors of the failover itself (abort,
 * deadline) become a ConnectError of their code.
 */
function connectErrorOf(error: unknown): unknown {
  if (!(error instanceof CasqError)) return error;
  if (error.cause instanceof ConnectError) return error.cause;
  return new ConnectError(error.message, error.code, undefined, undefined, error.cause);
}

/** Builds a {@link CasqClient} from the parsed connection flags of a command. */
export function clientFromOptions(options: ClientOptions): CasqClient {
  return new CasqClient(options);
}

/**
 * The leader address of a redirect (UNAVAILABLE with the trailer
 * `casq-leader-address` or a casq.v1.LeaderRedirect detail), or undefined when
 * `error` is not a redirect.
 */
export function leaderAddressOf(error: unknown): string | undefined {
  if (!(error instanceof ConnectError) || error.code !== Code.Unavailable) return undefined;
  const trailer = error.metadata.get(LEADER_ADDRESS_TRAILER);
  if (trailer !== null && trailer !== "") return trailer;
  try {
    const detail = error.findDetails(LeaderRedirectSchema)[0];
    if (detail !== undefined && detail.leaderAddress !== "") return detail.leaderAddress;
  } catch {
    // Undecodable details: not a redirect we can follow.
  }
  return undefined;
}

/** gRPC's canonical names of the status codes. */
export const GRPC_CODE_NAMES: Readonly<Record<number, string>> = {
  0: "OK",
  1: "CANCELLED",
  2: "UNKNOWN",
  3: "INVALID_ARGUMENT",
  4: "DEADLINE_EXCEEDED",
  5: "NOT_FOUND",
  6: "ALREADY_EXISTS",
  7: "PERMISSION_DENIED",
  8: "RESOURCE_EXHAUSTED",
  9: "FAILED_PRECONDITION",
  10: "ABORTED",
  11: "OUT_OF_RANGE",
  12: "UNIMPLEMENTED",
  13: "INTERNAL",
  14: "UNAVAILABLE",
  15: "DATA_LOSS",
  16: "UNAUTHENTICATED",
};

const REFUSED = new Set(["ECONNREFUSED"]);
const UNRESOLVED = new Set(["ENOTFOUND", "EAI_AGAIN", "EAI_NONAME"]);
const CUT = new Set([
  "ECONNRESET",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ERR_HTTP2_GOAWAY_SESSION",
]);

/** The Node.js error code (`ECONNREFUSED`, `ERR_TLS_...`) somewhere in an error's cause chain. */
export function systemErrorCode(error: unknown): string | undefined {
  let current: unknown = error;
  for (let depth = 0; depth < 5 && current !== undefined && current !== null; depth++) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string") return code;
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

function isTlsProblem(code: string | undefined, message: string): boolean {
  if (
    code !== undefined &&
    /^(ERR_TLS|ERR_SSL|CERT_|UNABLE_TO|DEPTH_ZERO|SELF_SIGNED|HOSTNAME_MISMATCH)/.test(code)
  ) {
    return true;
  }
  return /certificate|ssl|tls/i.test(message);
}

/**
 * Turns a failed call into a {@link CliError} with a message for humans and
 * the exit code of its kind. A {@link CliError} passes through unchanged.
 */
export function describeRpcError(
  error: unknown,
  address: string,
  tls: boolean,
  context: { redirectedFrom?: string } = {},
): CliError {
  if (error instanceof CliError) return error;
  if (!(error instanceof ConnectError)) {
    const message = error instanceof Error ? error.message : String(error);
    return new CliError(ExitCode.serverError, `request to ${address} failed: ${message}`, { cause: error });
  }
  const via = context.redirectedFrom === undefined ? "" : ` (redirected there by ${context.redirectedFrom})`;
  const sys = systemErrorCode(error.cause);
  const raw = error.rawMessage;
  // connect-node reports a reset connection (ECONNRESET, e.g. a TLS server cutting a plaintext
  // client) as ABORTED: it is a connection failure like the others.
  if (
    error.code === Code.Unavailable ||
    error.code === Code.Unknown ||
    error.code === Code.Internal ||
    error.code === Code.Aborted
  ) {
    if (sys !== undefined && REFUSED.has(sys)) {
      return new CliError(
        ExitCode.connectionFailed,
        `connection refused: is casq serve running at ${address}?${via} (set --server or CASQ_SERVER)`,
        { cause: error },
      );
    }
    if (sys !== undefined && UNRESOLVED.has(sys)) {
      return new CliError(
        ExitCode.connectionFailed,
        `cannot resolve the host of ${address}${via}: check --server / CASQ_SERVER`,
        { cause: error },
      );
    }
    if (isTlsProblem(sys, raw) && tls) {
      return new CliError(
        ExitCode.connectionFailed,
        `TLS handshake with ${address} failed${via}: ${raw} (for a private CA pass --ca FILE)`,
        { cause: error },
      );
    }
    if (sys !== undefined && CUT.has(sys)) {
      const hint = tls ? "" : "; if the server uses TLS, pass --tls (and --ca for a private CA)";
      return new CliError(ExitCode.connectionFailed, `connection to ${address} failed${via}: ${raw}${hint}`, {
        cause: error,
      });
    }
    if (sys?.startsWith("ERR_HTTP2") && !tls) {
      return new CliError(
        ExitCode.connectionFailed,
        `cannot talk gRPC to ${address}${via}: ${raw}. Is it a casq server? If it uses TLS, pass --tls.`,
        { cause: error },
      );
    }
  }
  if (error.code === Code.Canceled && !tls && /http\/2 (stream|session)/i.test(raw)) {
    // A TLS server drops the plaintext HTTP/2 preface: the stream dies with CANCEL.
    return new CliError(
      ExitCode.connectionFailed,
      `${address}${via} closed the connection (${raw}); if the server uses TLS, pass --tls (and --ca for a private CA)`,
      { cause: error },
    );
  }
  const name = GRPC_CODE_NAMES[error.code] ?? `code ${error.code}`;
  const text = raw === "" ? name : raw;
  switch (error.code) {
    case Code.NotFound:
      return new CliError(ExitCode.notFound, `not found: ${text}`, { cause: error });
    case Code.InvalidArgument:
      return new CliError(ExitCode.usage, `invalid request: ${text}`, { cause: error });
    case Code.Unauthenticated:
      return new CliError(
        ExitCode.serverError,
        `${address} refused the call (UNAUTHENTICATED): ${text}. Pass --token or set CASQ_TOKEN.`,
        { cause: error },
      );
    case Code.PermissionDenied:
      return new CliError(
        ExitCode.serverError,
        `${address} refused the call (PERMISSION_DENIED): ${text}. Is the token allowed to do this?`,
        { cause: error },
      );
    case Code.DeadlineExceeded:
      return new CliError(
        ExitCode.serverError,
        `no answer from ${address}${via} in time (DEADLINE_EXCEEDED): ${text}. The request may or may not have been applied; raise --timeout or retry.`,
        { cause: error },
      );
    case Code.Unimplemented:
      return new CliError(
        ExitCode.serverError,
        `${address} does not implement this call (UNIMPLEMENTED): ${text}. Is it a casq broker of the same version?`,
        { cause: error },
      );
    case Code.Unavailable: {
      const leader = leaderAddressOf(error);
      if (leader !== undefined) {
        return new CliError(
          ExitCode.serverError,
          `${address}${via} redirected to ${leader} again (leadership is moving); retry in a moment.`,
          { cause: error },
        );
      }
      return new CliError(
        ExitCode.serverError,
        `${address}${via} is unavailable: ${text}. Retry in a moment.`,
        {
          cause: error,
        },
      );
    }
    default:
      return new CliError(ExitCode.serverError, `${name}: ${text}`, { cause: error });
  }
}
