/**
 * Strict readers of untrusted JSON: each checks one value's type (and range)
 * and returns it typed, or throws {@link Corrupt} naming the path of the
 * first problem (`document.subscriptions[0].acked`). An object reader refuses
 * missing and unknown fields alike, so a field this casq does not know is an
 * error, never silently dropped.
 *
 * The parsers catch `Corrupt` around a whole document and turn it into one
 * `CasqError("data_loss")` that says which object is corrupt and where.
 */

const json = JSON.stringify;

/** A JSON value is not what the format says; the message is `<path>: <problem>`. */
export class Corrupt extends Error {}

/** Throws {@link Corrupt} for `problem` at `path`. */
export function fail(path: string, problem: string): never {
  throw new Corrupt(`${path}: ${problem}`);
}

/** A JSON object, its fields not yet checked. */
export type Obj = Record<string, unknown>;

/**
 * Decodes `bytes` as fatal UTF-8 and parses the JSON. Throws the decoder's
 * or `JSON.parse`'s own error: each caller reports it in its own words.
 */
export function decodeJson(bytes: Uint8Array): unknown {
  return JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
}

/** An object with every `required` field, and no field outside `required` and `optional`. */
export function object(
  value: unknown,
  path: string,
  required: readonly string[],
  optional: readonly string[] = [],
): Obj {
  if (typeof value !== "object" || value === null || Array.isArray(value)) fail(path, "expected an object");
  const o = value as Obj;
  for (const key of required) if (!Object.hasOwn(o, key)) fail(path, `missing field "${key}"`);
  for (const key of Object.keys(o)) {
    if (!required.includes(key) && !optional.includes(key)) fail(path, `unknown field "${key}"`);
  }
  return o;
}

/** An array, its elements not yet checked. */
export function array(value: unknown, path: string): unknown[] {
  if (!Array.isArray(value)) fail(path, "expected an array");
  return value;
}

/** A safe integer in `[min, max]` (by default: not negative). */
export function integer(value: unknown, path: string, min = 0, max = Number.MAX_SAFE_INTEGER): number {
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < min || value > max) {
    fail(path, `expected an integer in [${min}, ${max}], got ${json(value)}`);
  }
  return value;
}

/** A finite number. */
export function finite(value: unknown, path: string): number {
  if (typeof value !== "number" || !Number.isFinite(value))
    fail(path, `expected a number, got ${json(value)}`);
  return value;
}

/** A string; with `nonEmpty`, not `""`. */
export function text(value: unknown, path: string, nonEmpty = false): string {
  if (typeof value !== "string") fail(path, `expected a string, got ${json(value)}`);
  if (nonEmpty && value === "") fail(path, "expected a non-empty string");
  return value;
}

/** `o[key]` read by `read` when the field is present, else undefined. */
export function optional<T>(
  o: Obj,
  key: string,
  read: (v: unknown, path: string) => T,
  path: string,
): T | undefined {
  return Object.hasOwn(o, key) ? read(o[key], `${path}.${key}`) : undefined;
}

/** An object whose every value is a string. */
export function stringRecord(value: unknown, path: string): Record<string, string> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) fail(path, "expected an object");
  const map = value as Obj;
  for (const key of Object.keys(map)) text(map[key], `${path}.${key}`);
  return map as Record<string, string>;
}
