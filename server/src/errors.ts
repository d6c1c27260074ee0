/**
 * Engine errors: what went wrong, in terms a client can act on.
 *
 * Every error the engine (document model, broker) raises to a caller is a
 * {@link CasqError} with a {@link CasqErrorCode}. The gRPC service maps these
 * codes to gRPC status codes in exactly one place; nothing else inspects
 * error messages.
 */

/** The kinds of failure a casq client can see. */
export type CasqErrorCode =
  /** The request is malformed (bad queue name, payload too large for the schema, negative count). */
  | "invalid_argument"
  /** The queue, subscription or message does not exist. */
  | "not_found"
  /** The thing to create exists already. */
  | "already_exists"
  /** A limit was hit (document size, batch size, payload size): the request was refused, nothing changed. */
  | "resource_exhausted"
  /** The request is valid but the state does not allow it (e.g. ack of a lease this worker no longer holds). */
  | "failed_precondition"
  /** Another broker leads this shard; `leader` in the details says where to go. */
  | "redirect"
  /** An enqueue batch spans shards led by several brokers; `batchRoutes` in the details splits it. Nothing was stored. */
  | "batch_redirect"
  /** The store could not be reached or the broker is shutting down; retrying later may succeed. */
  | "unavailable"
  /** The stored document cannot be read (corrupt or from a newer casq); an operator must look. */
  | "data_loss"
  /** The caller's deadline passed or it cancelled. */
  | "cancelled"
  /** A bug or an unexpected state. */
  | "internal";

/** Structured details that travel with an error to the client. */
export interface CasqErrorDetails {
  /** For `redirect`: the address of the broker that leads the shard, if known. */
  readonly leaderAddress?: string;
  /** For `redirect`: the leader's broker id. */
  readonly leaderId?: string;
  /** For `redirect`: the epoch the leader holds. */
  readonly epoch?: number;
  /** The queue the request was about. */
  readonly queue?: string;
  /** The shard the request was about. */
  readonly shard?: number;
  /** For `batch_redirect`: which of the batch's messages (0-based indexes) each broker can store. */
  readonly batchRoutes?: readonly BatchRoute[];
}

/** One broker's part of a batch that spans shards led by several brokers. */
export interface BatchRoute {
  /** Advertised address of the broker that can store these messages. */
  readonly leaderAddress: string;
  /** Indexes into the batch, ascending. */
  readonly messageIndexes: readonly number[];
}

/** An error with a client-actionable code. Messages say what to do, not only what failed. */
export class CasqError extends Error {
  readonly code: CasqErrorCode;
  readonly details: CasqErrorDetails;

  constructor(
    code: CasqErrorCode,
    message: string,
    details: CasqErrorDetails = {},
    options?: { cause?: unknown },
  ) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = "CasqError";
    this.code = code;
    this.details = details;
  }
}

/** True when `error` is a {@link CasqError}, optionally of one code. */
export function isCasqError(error: unknown, code?: CasqErrorCode): error is CasqError {
  return error instanceof CasqError && (code === undefined || error.code === code);
}

/** Most characters of a client's value that an error message quotes (see {@link quoteValue}). */
export const MAX_QUOTED_CHARS = 64;

/**
 * Quotes a value a client sent, for an error message: JSON-quoted and cut to
 * `max` characters, with the full length noted when cut. Every message that
 * echoes client input goes through this, so a 70,000-character name yields a
 * short message (a status message travels in an HTTP/2 trailer, which has a
 * size limit).
 */
export function quoteValue(value: unknown, max = MAX_QUOTED_CHARS): string {
  const text = typeof value === "string" ? value : (JSON.stringify(value) ?? String(value));
  if (text.length <= max) return typeof value === "string" ? JSON.stringify(text) : text;
  let cut = text.slice(0, max);
  // Do not split a surrogate pair: a lone half would print as an escape.
  if (/[\uD800-\uDBFF]$/.test(cut)) cut = cut.slice(0, -1);
  const quoted = typeof value === "string" ? JSON.stringify(cut) : cut;
  return `${quoted}... (${text.length} characters)`;
}
