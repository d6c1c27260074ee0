/**
 * Typed store errors, classified once at the backend boundary so that every
 * layer above decides by kind, never by parsing backend messages.
 *
 * | kind                  | meaning                                                   | safe to retry?              |
 * |-----------------------|-----------------------------------------------------------|-----------------------------|
 * | `precondition_failed` | lost the CAS race (etag moved / key exists)               | never blindly: re-read      |
 * | `conflict`            | S3 409: a concurrent conditional write was in progress    | after re-read               |
 * | `unavailable`         | 5xx, throttling, network error before the request was sent| yes                         |
 * | `ambiguous`           | the write may have landed and the answer was lost         | only after finding out      |
 * | `invalid`             | bad key, object too large, bad argument                   | no                          |
 * | `misconfigured`       | no or wrong credentials, access denied, missing bucket,   | no: an operator must fix    |
 * |                       | a store directory that cannot be created or written       | the configuration           |
 * | `not_found`           | a key that must exist does not                            | no                          |
 */

/** The classification of a store failure. */
export type StoreErrorKind =
  | "not_found"
  | "precondition_failed"
  | "conflict"
  | "unavailable"
  | "ambiguous"
  | "invalid"
  | "misconfigured";

/** Base class of every error a store raises. */
export class StoreError extends Error {
  /** What happened, in the terms the retry and commit logic decide on. */
  readonly kind: StoreErrorKind;
  /** The key the operation was about, when there was one. */
  readonly key: string | undefined;

  constructor(kind: StoreErrorKind, message: string, options?: { key?: string; cause?: unknown }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.kind = kind;
    this.key = options?.key;
  }
}

/** A key that must exist does not. */
export class NotFoundError extends StoreError {
  constructor(key: string, options?: { cause?: unknown }) {
    super("not_found", `object ${key} does not exist`, { key, ...options });
  }
}

/** The put/delete condition did not hold: someone else wrote first. Re-read; never retry blindly. */
export class PreconditionFailedError extends StoreError {
  constructor(key: string, detail: string, options?: { cause?: unknown }) {
    super("precondition_failed", `conditional write to ${key} lost the race: ${detail}`, { key, ...options });
  }
}

/** A concurrent conditional write was in progress (S3 409 ConditionalRequestConflict). Retry after re-read. */
export class ConflictError extends StoreError {
  constructor(key: string, detail: string, options?: { cause?: unknown }) {
    super("conflict", `conditional write to ${key} conflicted with a concurrent write: ${detail}`, {
      key,
      ...options,
    });
  }
}

/** The store could not be reached or refused for now (5xx, throttling, network). The operation did not happen. */
export class UnavailableError extends StoreError {
  constructor(key: string | undefined, detail: string, options?: { cause?: unknown }) {
    super("unavailable", `object store unavailable${key ? ` for ${key}` : ""}: ${detail}`, {
      ...(key === undefined ? {} : { key }),
      ...options,
    });
  }
}

/** The write may or may not have landed (timeout or lost response after sending). Find out before answering anyone. */
export class AmbiguousWriteError extends StoreError {
  constructor(key: string, detail: string, options?: { cause?: unknown }) {
    super("ambiguous", `write to ${key} may or may not have landed: ${detail}`, { key, ...options });
  }
}

/** The request itself is wrong (bad key, object too large). Retrying will not help. */
export class InvalidRequestError extends StoreError {
  constructor(key: string | undefined, detail: string, options?: { cause?: unknown }) {
    super("invalid", `invalid store request${key ? ` for ${key}` : ""}: ${detail}`, {
      ...(key === undefined ? {} : { key }),
      ...options,
    });
  }
}

/**
 * The store refuses casq for a reason only an operator can fix: no or wrong
 * credentials, access denied, a bucket that does not exist, a store directory
 * that cannot be created or written. Every request fails the same way until
 * the configuration changes, so retrying will not help; the message says
 * what to fix.
 */
export class StoreMisconfiguredError extends StoreError {
  constructor(key: string | undefined, detail: string, options?: { cause?: unknown }) {
    super("misconfigured", `the object store cannot be used as configured: ${detail}`, {
      ...(key === undefined ? {} : { key }),
      ...options,
    });
  }
}

/**
 * The {@link StoreMisconfiguredError} behind `error`, following `cause`
 * links (the broker wraps store errors in engine errors), or undefined.
 */
export function misconfiguredCause(error: unknown): StoreMisconfiguredError | undefined {
  for (let at: unknown = error, depth = 0; at instanceof Error && depth < 8; depth += 1) {
    if (at instanceof StoreMisconfiguredError) return at;
    at = at.cause;
  }
  return undefined;
}

/** True when `error` is a {@link StoreError} of the given kind. */
export function isStoreError(error: unknown, kind?: StoreErrorKind): error is StoreError {
  return error instanceof StoreError && (kind === undefined || error.kind === kind);
}

/** Kinds a retrying wrapper may retry without consulting the caller. */
export function isTransient(error: unknown): boolean {
  return isStoreError(error, "unavailable");
}
