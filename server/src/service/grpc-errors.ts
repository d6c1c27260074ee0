/**
 * The one place where engine errors become gRPC statuses.
 *
 * The engine raises {@link CasqError}s with client-actionable codes; every
 * handler passes whatever it caught through {@link toConnectError} (unary and
 * stream errors) or {@link toRpcStatus} (a failed request on an open Work
 * stream). Nothing else in the service chooses a status code.
 *
 * | engine code           | gRPC code            | client should                                         |
 * |-----------------------|----------------------|-------------------------------------------------------|
 * | `invalid_argument`    | INVALID_ARGUMENT     | fix the request (nothing was applied)                 |
 * | `not_found`           | NOT_FOUND            | create the queue / subscription                       |
 * | `already_exists`      | ALREADY_EXISTS       | use the existing one                                  |
 * | `resource_exhausted`  | RESOURCE_EXHAUSTED   | send less, wait for workers, or raise the limit       |
 * | `failed_precondition` | FAILED_PRECONDITION  | change the state first (e.g. purge before delete)     |
 * | `redirect`            | UNAVAILABLE + trailer `casq-leader-address` + `casq.v1.LeaderRedirect` detail | resend to the leader |
 * | `unavailable`         | UNAVAILABLE          | retry with backoff, possibly at another broker        |
 * | `data_loss`           | DATA_LOSS            | an operator must inspect the shard document           |
 * | `cancelled`           | CANCELLED, or DEADLINE_EXCEEDED when the call's deadline passed | outcome unknown: retry idempotently |
 * | `internal`            | INTERNAL             | report a bug                                          |
 * | store `misconfigured` (the cause of any error) | FAILED_PRECONDITION | not retry: an operator fixes the broker's store credentials, bucket or directory |
 *
 * Redirect convention (see `proto/casq/v1/errors.proto`): UNAVAILABLE, the
 * trailer `casq-leader-address: <host:port>`, and a LeaderRedirect in the
 * status details (`grpc-status-details-bin`), so SDKs can tell a redirect from
 * an outage by the detail and generic gRPC clients still retry.
 *
 * Every status message is cut to {@link MAX_STATUS_MESSAGE_BYTES} here, as a
 * last resort: it travels percent-encoded in the `grpc-message` trailer, and
 * a trailer larger than the peer's frame limit turns the answer into a reset
 * stream (INTERNAL at the client) instead of the status meant. Messages that
 * quote client input cut the quote themselves (`quoteValue` in errors.ts).
 */
import { create } from "@bufbuild/protobuf";
import { anyPack } from "@bufbuild/protobuf/wkt";
import {
  BatchRedirectSchema,
  type LeaderRedirect,
  LeaderRedirectSchema,
  type RpcStatus,
  RpcStatusSchema,
} from "@casq/api/casq/v1/errors_pb.ts";
import { LEADER_ADDRESS_TRAILER } from "@casq/sdk/errors.ts";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import type { Logger } from "pino";
import { type CasqErrorCode, type CasqErrorDetails, isCasqError } from "../errors.ts";
import { isStoreError, misconfiguredCause } from "../store/store-errors.ts";

/** gRPC code of every engine code. */
export const GRPC_CODE_OF: Readonly<Record<CasqErrorCode, Code>> = Object.freeze({
  invalid_argument: Code.InvalidArgument,
  not_found: Code.NotFound,
  already_exists: Code.AlreadyExists,
  resource_exhausted: Code.ResourceExhausted,
  failed_precondition: Code.FailedPrecondition,
  redirect: Code.Unavailable,
  batch_redirect: Code.Unavailable,
  unavailable: Code.Unavailable,
  data_loss: Code.DataLoss,
  cancelled: Code.Canceled,
  internal: Code.Internal,
});

/**
 * Longest status message sent (UTF-8 bytes). Percent-encoded, even a message
 * of non-ASCII text stays under 8 KiB of trailer, well inside the 16 KiB
 * HTTP/2 frame every peer accepts.
 */
export const MAX_STATUS_MESSAGE_BYTES = 2048;

/** Cuts a status message to {@link MAX_STATUS_MESSAGE_BYTES}, saying so at the end. */
export function capStatusMessage(message: string): string {
  if (message.length <= MAX_STATUS_MESSAGE_BYTES / 3) return message; // fast path: 3 bytes per UTF-16 unit at most
  const encoded = Buffer.from(message, "utf8");
  if (encoded.length <= MAX_STATUS_MESSAGE_BYTES) return message;
  const suffix = ` ... (message cut, ${encoded.length} bytes)`;
  // Decoding a prefix cut inside a character yields U+FFFD; drop it.
  const head = encoded
    .subarray(0, MAX_STATUS_MESSAGE_BYTES - suffix.length)
    .toString("utf8")
    .replace(/\uFFFD$/, "");
  return head + suffix;
}

/** What an error becomes on the wire, before it is shaped as a ConnectError or an RpcStatus. */
interface MappedError {
  readonly code: Code;
  readonly message: string;
  readonly redirect?: LeaderRedirect;
  /** For a batch spanning several leaders: how to split it. */
  readonly batchRedirect?: ReturnType<typeof batchRedirectOf>;
  /** True for errors that indicate a bug (worth logging at error level). */
  readonly internal: boolean;
}

/**
 * Maps anything a handler caught to a ConnectError. `signal` is the call's
 * signal: a cancellation after the call's deadline passed becomes
 * DEADLINE_EXCEEDED instead of CANCELLED.
 */
export function toConnectError(error: unknown, signal?: AbortSignal): ConnectError {
  if (error instanceof ConnectError) {
    const message = capStatusMessage(error.rawMessage);
    if (message === error.rawMessage) return error;
    const cut = new ConnectError(message, error.code, error.metadata, undefined, error.cause ?? error);
    cut.details = error.details;
    return cut;
  }
  const mapped = mapError(error, signal);
  const message = capStatusMessage(mapped.message);
  if (mapped.batchRedirect !== undefined)
    return new ConnectError(
      message,
      mapped.code,
      undefined,
      [{ desc: BatchRedirectSchema, value: mapped.batchRedirect }],
      error,
    );
  if (mapped.redirect === undefined)
    return new ConnectError(message, mapped.code, undefined, undefined, error);
  return new ConnectError(
    message,
    mapped.code,
    mapped.redirect.leaderAddress ? { [LEADER_ADDRESS_TRAILER]: mapped.redirect.leaderAddress } : undefined,
    [{ desc: LeaderRedirectSchema, value: mapped.redirect }],
    error,
  );
}

/**
 * Maps an error to the RpcStatus of a failed request on a stream (a Work
 * stream's `request_failed`, an EnqueueStream's `error`): the status the
 * unary RPC would have returned, with its LeaderRedirect or BatchRedirect
 * packed as an Any detail.
 */
export function toRpcStatus(error: unknown, signal?: AbortSignal): RpcStatus {
  if (error instanceof ConnectError) {
    const redirect = error.findDetails(LeaderRedirectSchema)[0];
    const batch = error.findDetails(BatchRedirectSchema)[0];
    return create(RpcStatusSchema, {
      code: error.code,
      message: capStatusMessage(error.rawMessage),
      details: [
        ...(redirect ? [anyPack(LeaderRedirectSchema, redirect)] : []),
        ...(batch ? [anyPack(BatchRedirectSchema, batch)] : []),
      ],
    });
  }
  const mapped = mapError(error, signal);
  return create(RpcStatusSchema, {
    code: mapped.code,
    message: capStatusMessage(mapped.message),
    details: [
      ...(mapped.redirect ? [anyPack(LeaderRedirectSchema, mapped.redirect)] : []),
      ...(mapped.batchRedirect ? [anyPack(BatchRedirectSchema, mapped.batchRedirect)] : []),
    ],
  });
}

function mapError(error: unknown, signal: AbortSignal | undefined): MappedError {
  // However the engine wrapped it: a store that refuses this broker's configuration is not an outage.
  const misconfigured = misconfiguredCause(error);
  if (misconfigured !== undefined)
    return {
      code: Code.FailedPrecondition,
      message: `this broker's ${misconfigured.message}; retrying will not help until an operator fixes the broker's store configuration`,
      internal: false,
    };
  if (isCasqError(error)) {
    if (error.code === "redirect") return { ...redirectOf(error.message, error.details), internal: false };
    if (error.code === "batch_redirect")
      return {
        code: Code.Unavailable,
        message: error.message,
        batchRedirect: batchRedirectOf(error.details),
        internal: false,
      };
    if (error.code === "cancelled") return cancellation(error.message, signal);
    return { code: GRPC_CODE_OF[error.code], message: error.message, internal: error.code === "internal" };
  }
  if (isStoreError(error)) {
    if (error.kind === "invalid")
      return {
        code: Code.Internal,
        message: `object store refused a request: ${error.message}`,
        internal: true,
      };
    return { code: Code.Unavailable, message: `object store: ${error.message}; retry`, internal: false };
  }
  if (signal?.aborted || (error instanceof Error && error.name === "AbortError"))
    return cancellation("the call was cancelled", signal);
  const text = error instanceof Error ? error.message : String(error);
  return {
    code: Code.Internal,
    message: `internal error in casq (please report it): ${text}`,
    internal: true,
  };
}

function cancellation(message: string, signal: AbortSignal | undefined): MappedError {
  if (signal && isDeadline(signal))
    return {
      code: Code.DeadlineExceeded,
      message: `the call's deadline passed before it finished; the request may or may not have been applied (${message})`,
      internal: false,
    };
  return { code: Code.Canceled, message, internal: false };
}

function isDeadline(signal: AbortSignal): boolean {
  const reason: unknown = signal.reason;
  return reason instanceof ConnectError && reason.code === Code.DeadlineExceeded;
}

function batchRedirectOf(details: CasqErrorDetails) {
  return create(BatchRedirectSchema, {
    queue: details.queue ?? "",
    routes: (details.batchRoutes ?? []).map((r) => ({
      leaderAddress: r.leaderAddress,
      messageIndexes: [...r.messageIndexes],
    })),
  });
}

function redirectOf(
  message: string,
  details: CasqErrorDetails,
): { code: Code; message: string; redirect: LeaderRedirect } {
  return {
    code: Code.Unavailable,
    message,
    redirect: create(LeaderRedirectSchema, {
      leaderAddress: details.leaderAddress ?? "",
      leaderId: details.leaderId ?? "",
      epoch: BigInt(details.epoch ?? 0),
      queue: details.queue ?? "",
      shard: details.shard ?? 0,
    }),
  };
}

/**
 * `error` mapped by {@link toConnectError}; an error that indicates a bug
 * (INTERNAL, UNKNOWN) is logged with the call it broke (`rpc`).
 */
export function reportedConnectError(
  logger: Logger,
  error: unknown,
  rpc: string,
  signal?: AbortSignal,
): ConnectError {
  const mapped = toConnectError(error, signal);
  if (mapped.code === Code.Internal || mapped.code === Code.Unknown)
    logger.error({ err: error, rpc }, "internal error while serving a call");
  return mapped;
}

/**
 * The interceptor that passes every handler error through
 * {@link toConnectError}, for unary calls and for errors raised while a
 * response stream is produced. Errors that indicate a bug are logged.
 */
export function createErrorInterceptor(logger: Logger): Interceptor {
  const report = (error: unknown, rpc: string, signal: AbortSignal) =>
    reportedConnectError(logger, error, rpc, signal);
  return (next) => async (req) => {
    const rpc = `${req.service.typeName}/${req.method.name}`;
    let res: Awaited<ReturnType<typeof next>>;
    try {
      res = await next(req);
    } catch (error) {
      throw report(error, rpc, req.signal);
    }
    if (!res.stream) return res;
    const source = res.message;
    async function* mapped() {
      try {
        yield* source;
      } catch (error) {
        throw report(error, rpc, req.signal);
      }
    }
    return { ...res, message: mapped() };
  };
}
