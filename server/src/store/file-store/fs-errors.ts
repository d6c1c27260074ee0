/**
 * How the file store's failures become {@link StoreError}s: file-system errors
 * are classified in one place ({@link classify}), an unusable store directory
 * is `misconfigured` ({@link unusableRoot}), an aborted call is `unavailable`.
 */
import {
  InvalidRequestError,
  StoreError,
  StoreMisconfiguredError,
  UnavailableError,
} from "../store-errors.ts";

/** The errno code (`ENOENT`, ...) of a Node file-system error, or `undefined` for any other value. */
export function errnoCode(error: unknown): string | undefined {
  if (typeof error !== "object" || error === null || !("code" in error)) return undefined;
  const code = (error as { code?: unknown }).code;
  return typeof code === "string" ? code : undefined;
}

const PATH_COLLISION_CODES = new Set(["ENOTDIR", "EISDIR", "EEXIST", "ENAMETOOLONG"]);

/**
 * The one place a file-system error becomes a {@link StoreError}. Store errors
 * pass through; errors that are not errno errors are bugs and pass unchanged.
 */
export function classify(error: unknown, key: string | undefined, doing: string): unknown {
  if (error instanceof StoreError) return error;
  const code = errnoCode(error);
  if (code === undefined) return error;
  if (PATH_COLLISION_CODES.has(code))
    return new InvalidRequestError(
      key,
      `${doing} failed (${code}): a file is where a directory must be, or the reverse (in the file store a key cannot be both an object and a prefix of other keys)`,
      { cause: error },
    );
  return new UnavailableError(
    key,
    `${doing} failed (${code}); check the disk and the permissions of the store directory`,
    {
      cause: error,
    },
  );
}

/** Why the store directory cannot be used, as a {@link StoreMisconfiguredError} that says what to fix. */
export function unusableRoot(error: unknown, root: string): unknown {
  if (error instanceof StoreError) return error;
  const code = errnoCode(error);
  if (code === undefined) return error;
  const why =
    code === "EACCES" || code === "EPERM"
      ? "permission denied: give the user running casq write access, or choose another directory"
      : code === "EROFS"
        ? "the file system is read-only: choose a writable directory"
        : code === "ENOTDIR" || code === "EEXIST"
          ? "a file is in the way where a directory must be: choose another path"
          : code === "ENOENT"
            ? "a parent directory does not exist and cannot be created there: choose a directory on a writable file system"
            : "check the disk and the path";
  return new StoreMisconfiguredError(
    undefined,
    `cannot create or write the store directory ${root} (${code}): ${why}`,
    { cause: error },
  );
}

/** Throws `unavailable` ("the call was aborted <when>") if `signal` has aborted. */
export function throwIfAborted(signal: AbortSignal | undefined, key: string, when: string): void {
  if (signal?.aborted) throw new UnavailableError(key, `the call was aborted ${when}`);
}

/** Awaits `action`, treating a missing file (ENOENT) as done. */
export async function ignoreMissing(action: Promise<unknown>): Promise<void> {
  try {
    await action;
  } catch (error) {
    if (errnoCode(error) !== "ENOENT") throw error;
  }
}
