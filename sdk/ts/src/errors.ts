/**
 * Typed errors of the casq SDK. Every failure of a call reaches the caller as
 * a {@link CasqError} (or one of its subclasses), converted once from the
 * `ConnectError` of @connectrpc/connect by {@link toCasqError}.
 */
import { anyUnpack } from "@bufbuild/protobuf/wkt";
import {
  type BatchRedirect,
  BatchRedirectSchema,
  type LeaderRedirect,
  LeaderRedirectSchema,
  type RpcStatus,
} from "@casq/api/casq/v1/errors_pb.ts";
import { Code, ConnectError } from "@connectrpc/connect";

export { Code } from "@connectrpc/connect";

/**
 * The trailer (response metadata) in which a broker names the leader's
 * address when it redirects a call (see `proto/casq/v1/errors.proto`). The
 * one spelling of it in TypeScript: the server sends it, the SDK and the CLI read it.
 */
export const LEADER_ADDRESS_TRAILER = "casq-leader-address";

/**
 * The trailer (value `true`) with which a broker says that nothing of a
 * failed call was applied: on a call refused while the broker shuts down,
 * and on an EnqueueStream it ends after answering every request it read (the
 * requests still unanswered never reached it). A client may resend those
 * requests even when they are not safe to repeat.
 */
export const NOT_APPLIED_TRAILER = "casq-not-applied";

/** Any error of a casq call. `code` is the gRPC status code (`Code` from @connectrpc/connect). */
export class CasqError extends Error {
  /** The gRPC status code of the failure. */
  readonly code: Code;

  constructor(code: Code, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "CasqError";
    this.code = code;
  }
}

/**
 * Another broker leads the shard the request needed (`UNAVAILABLE` with a
 * `casq.v1.LeaderRedirect` detail). The SDK follows redirects by itself; you
 * only see this error when the redirect limit was exhausted.
 */
export class RedirectError extends CasqError {
  /** `host:port` of the leading broker. */
  readonly leaderAddress: string;
  /** Id of the leading broker process. */
  readonly leaderId: string;
  /** Leadership epoch; of two redirects for one shard, the higher epoch is newer. */
  readonly epoch: bigint;
  /** Queue of the shard. */
  readonly queue: string;
  /** Shard index. */
  readonly shard: number;

  constructor(message: string, redirect: LeaderRedirect, options?: { cause?: unknown }) {
    super(Code.Unavailable, message, options);
    this.name = "RedirectError";
    this.leaderAddress = redirect.leaderAddress;
    this.leaderId = redirect.leaderId;
    this.epoch = redirect.epoch;
    this.queue = redirect.queue;
    this.shard = redirect.shard;
  }
}

/** The part of a split batch that one broker can store (see {@link BatchRedirectError}). */
export interface BatchRoute {
  /** `host:port` of the broker to send these messages to. */
  readonly leaderAddress: string;
  /** 0-based indexes into the request's messages, ascending. */
  readonly messageIndexes: readonly number[];
}

/**
 * An Enqueue batch spans shards led by more than one broker (`UNAVAILABLE`
 * with a `casq.v1.BatchRedirect` detail): nothing of it was stored, and
 * `routes` says which messages each broker can store. The producer splits
 * such a batch by itself; you only see this error when leadership kept moving
 * until the split depth limit was reached.
 */
export class BatchRedirectError extends CasqError {
  /** Queue of the batch. */
  readonly queue: string;
  /** Where each message of the request goes; every message is in exactly one route. */
  readonly routes: readonly BatchRoute[];

  constructor(
    message: string,
    redirect: { readonly queue: string; readonly routes: readonly BatchRoute[] },
    options?: { cause?: unknown },
  ) {
    super(Code.Unavailable, message, options);
    this.name = "BatchRedirectError";
    this.queue = redirect.queue;
    this.routes = redirect.routes.map((r) => ({
      leaderAddress: r.leaderAddress,
      messageIndexes: [...r.messageIndexes],
    }));
  }
}

/** The broker (or its store) is unreachable or shutting down; retried by the SDK with backoff at other brokers. */
export class UnavailableError extends CasqError {
  constructor(message: string, options?: { cause?: unknown }) {
    super(Code.Unavailable, message, options);
    this.name = "UnavailableError";
  }
}

/**
 * A request was sent on a stream that broke (or ended) before it was
 * answered: the broker may or may not have applied it, as when a unary
 * call's answer is lost. The SDK resends it only when that is safe (its
 * messages carry dedup ids); otherwise the caller gets this error.
 */
export class OutcomeUnknownError extends UnavailableError {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "OutcomeUnknownError";
  }
}

/** The queue or subscription does not exist (`NOT_FOUND`). */
export class NotFoundError extends CasqError {
  constructor(message: string, options?: { cause?: unknown }) {
    super(Code.NotFound, message, options);
    this.name = "NotFoundError";
  }
}

/**
 * The thing to create exists already (`ALREADY_EXISTS`), e.g. `createQueue`
 * of a queue that is there. Pass `ifNotExists: true` to get the existing
 * queue instead.
 */
export class AlreadyExistsError extends CasqError {
  constructor(message: string, options?: { cause?: unknown }) {
    super(Code.AlreadyExists, message, options);
    this.name = "AlreadyExistsError";
  }
}

/** The request was malformed; nothing was applied (`INVALID_ARGUMENT`). */
export class InvalidArgumentError extends CasqError {
  constructor(message: string, options?: { cause?: unknown }) {
    super(Code.InvalidArgument, message, options);
    this.name = "InvalidArgumentError";
  }
}

/** What a worker asked the broker to do with a job. */
export type SettleOperation = "ack" | "nack";

/**
 * A worker's ack or nack of a job changed nothing: the worker no longer held
 * the job's delivery (its lease ran out and the message was delivered again,
 * or it was dead-lettered). Reported to `onError` with the job; the job's
 * result counts only through that later delivery.
 */
export class LeaseLostError extends CasqError {
  /** Id of the message. */
  readonly jobId: string;
  /** Queue of the message. */
  readonly queue: string;
  /** Attempt number of the delivery that was settled too late. */
  readonly attempt: number;
  /** What the worker sent. */
  readonly operation: SettleOperation;

  constructor(
    job: { readonly id: string; readonly queue: string; readonly attempt: number },
    operation: SettleOperation,
  ) {
    super(
      Code.Aborted,
      `casq: ${operation} of job ${job.id} (queue ${job.queue}, attempt ${job.attempt}) changed nothing: ` +
        "its lease was lost (the message was delivered again or dead-lettered meanwhile)",
    );
    this.name = "LeaseLostError";
    this.jobId = job.id;
    this.queue = job.queue;
    this.attempt = job.attempt;
    this.operation = operation;
  }
}

/**
 * Throw this from a worker handler to dead-letter the job at once instead of
 * retrying it (a "poison" message). `message` becomes the dead letter's reason.
 */
export class DeadLetterError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "DeadLetterError";
  }
}

function build(
  code: Code,
  message: string,
  redirect: LeaderRedirect | undefined,
  batch: BatchRedirect | undefined,
  cause: unknown,
): CasqError {
  // Checked first: a batch redirect is about several leaders, so a
  // casq-leader-address trailer next to it must not turn it into a plain redirect.
  if (code === Code.Unavailable && batch) return new BatchRedirectError(message, batch, { cause });
  if (code === Code.Unavailable && redirect && redirect.leaderAddress !== "") {
    return new RedirectError(message, redirect, { cause });
  }
  switch (code) {
    case Code.Unavailable:
      return new UnavailableError(message, { cause });
    case Code.NotFound:
      return new NotFoundError(message, { cause });
    case Code.InvalidArgument:
      return new InvalidArgumentError(message, { cause });
    case Code.AlreadyExists:
      return new AlreadyExistsError(message, { cause });
    default:
      return new CasqError(code, message, { cause });
  }
}

/**
 * Converts anything a call threw into a {@link CasqError}: a `ConnectError`
 * keeps its code (a redirect detail, or the `casq-leader-address` trailer,
 * makes it a {@link RedirectError}; a batch redirect detail a
 * {@link BatchRedirectError}); other errors become `UNKNOWN`, or
 * `CANCELLED` for an abort. A CasqError is returned as it is.
 */
export function toCasqError(error: unknown): CasqError {
  if (error instanceof CasqError) return error;
  const connect = ConnectError.from(error);
  const [detail] = connect.findDetails(LeaderRedirectSchema);
  const trailer = connect.metadata.get(LEADER_ADDRESS_TRAILER);
  const redirect =
    detail ??
    (trailer
      ? ({
          leaderAddress: trailer,
          leaderId: "",
          epoch: 0n,
          queue: "",
          shard: 0,
        } as unknown as LeaderRedirect)
      : undefined);
  const [batch] = connect.findDetails(BatchRedirectSchema);
  return build(connect.code, connect.rawMessage, redirect, batch, error);
}

/** Converts the status of a failed Work stream request (`request_failed`) into a {@link CasqError}. */
export function fromRpcStatus(status: RpcStatus | undefined): CasqError {
  if (!status) return new CasqError(Code.Unknown, "request failed without a status");
  let redirect: LeaderRedirect | undefined;
  let batch: BatchRedirect | undefined;
  for (const any of status.details) {
    redirect ??= anyUnpack(any, LeaderRedirectSchema);
    batch ??= anyUnpack(any, BatchRedirectSchema);
  }
  return build(status.code as Code, status.message, redirect, batch, undefined);
}

/** True for failures worth retrying at another broker: outages and connection errors (not redirects). */
export function isRetryable(error: CasqError): boolean {
  if (error instanceof RedirectError) return false;
  // Resending the whole batch elsewhere cannot help (no broker can store it):
  // the producer splits it instead.
  if (error instanceof BatchRedirectError) return false;
  if (error.code === Code.Unavailable) return true;
  // A stream the broker's side reset with CANCEL (e.g. a broker going away
  // mid-call) is the transport failing; a caller's own abort is told apart by
  // its signal before any retry (see callWithFailover).
  if (error.code === Code.Canceled && /stream closed with error code CANCEL/.test(error.message)) return true;
  // Transport-level failures (refused / reset connections) may surface as UNKNOWN or INTERNAL.
  if (error.code === Code.Unknown || error.code === Code.Internal || error.code === Code.Aborted) {
    return /ECONNREFUSED|ECONNRESET|EPIPE|ETIMEDOUT|EHOSTUNREACH|ENOTFOUND|socket|GOAWAY|stream|closed/i.test(
      `${error.message} ${String((error.cause as Error | undefined)?.message ?? "")}`,
    );
  }
  return false;
}
