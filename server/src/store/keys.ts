/**
 * Key validation shared by every backend, so that a key accepted by one store
 * is accepted by all and a key can never escape a file store's directory.
 */
import { InvalidRequestError } from "./store-errors.ts";

/** Longest key we accept, in bytes (S3's limit is 1024). */
export const MAX_KEY_BYTES = 1024;

const SEGMENT = /^[A-Za-z0-9._=-]+$/;

/**
 * Throws {@link InvalidRequestError} unless `key` is a relative `/`-separated
 * path of segments made of `[A-Za-z0-9._=-]`, with no empty, `.` or `..`
 * segment, no leading `/`, no NUL, at most {@link MAX_KEY_BYTES} bytes.
 */
export function validateKey(key: string): void {
  if (typeof key !== "string" || key.length === 0) throw new InvalidRequestError(undefined, "key is empty");
  if (Buffer.byteLength(key) > MAX_KEY_BYTES)
    throw new InvalidRequestError(key.slice(0, 64), `key is longer than ${MAX_KEY_BYTES} bytes`);
  if (key.includes("\0")) throw new InvalidRequestError(undefined, "key contains a NUL byte");
  if (key.startsWith("/")) throw new InvalidRequestError(key, "key must be relative (it starts with /)");
  for (const segment of key.split("/")) {
    if (segment === "" || segment === "." || segment === "..")
      throw new InvalidRequestError(key, `key has an empty, "." or ".." segment`);
    if (!SEGMENT.test(segment))
      throw new InvalidRequestError(key, `key segment "${segment}" may only use A-Z a-z 0-9 . _ = -`);
  }
}

/**
 * Throws unless `prefix` is a valid list prefix: empty, or a key-like string
 * that may end in `/` or in a partial segment.
 */
export function validatePrefix(prefix: string): void {
  if (prefix === "") return;
  const trimmed = prefix.endsWith("/") ? prefix.slice(0, -1) : prefix;
  validateKey(trimmed);
}
