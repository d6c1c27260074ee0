/**
 * Parsers for command-line values (durations, counts, addresses), written as
 * commander argument parsers: each throws commander's InvalidArgumentError
 * with a message that shows an accepted form, which the CLI reports as a
 * usage error (exit code 2).
 */
import { InvalidArgumentError } from "commander";

const DURATION = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)$/;
const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/**
 * Parses a duration such as `500ms`, `30s`, `1.5m`, `2h` or `7d` into whole
 * milliseconds. A unit is required: a bare number is ambiguous.
 */
export function parseDurationMs(value: string): number {
  const match = DURATION.exec(value.trim());
  const amount = match?.[1];
  const unit = match?.[2];
  if (amount === undefined || unit === undefined) {
    throw new InvalidArgumentError(
      `"${value}" is not a duration; use a number with a unit: 500ms, 30s, 5m, 2h, 7d.`,
    );
  }
  const ms = Number(amount) * (UNIT_MS[unit] ?? 1);
  if (!Number.isFinite(ms) || ms > Number.MAX_SAFE_INTEGER) {
    throw new InvalidArgumentError(`"${value}" is too long a duration.`);
  }
  return Math.round(ms);
}

/** Returns a parser for an integer in [min, max]. */
export function intIn(min: number, max: number): (value: string) => number {
  return (value: string) => {
    const text = value.trim();
    if (!/^-?\d+$/.test(text)) {
      throw new InvalidArgumentError(`"${value}" is not a whole number (expected ${min}..${max}).`);
    }
    const n = Number(text);
    if (n < min || n > max) {
      throw new InvalidArgumentError(`${n} is out of range (expected ${min}..${max}).`);
    }
    return n;
  };
}

/** Parses a non-negative integer that may exceed 2^53 (a uint64 limit) into a bigint. */
export function parseUint64(value: string): bigint {
  const text = value.trim();
  if (!/^\d+$/.test(text)) {
    throw new InvalidArgumentError(`"${value}" is not a whole number of at least 0.`);
  }
  return BigInt(text);
}

/** Returns a parser for a decimal number in [min, max]. */
export function numberIn(min: number, max: number): (value: string) => number {
  return (value: string) => {
    const n = Number(value.trim());
    if (value.trim() === "" || !Number.isFinite(n)) {
      throw new InvalidArgumentError(`"${value}" is not a number (expected ${min}..${max}).`);
    }
    if (n < min || n > max) {
      throw new InvalidArgumentError(`${n} is out of range (expected ${min}..${max}).`);
    }
    return n;
  };
}

/** A host and a port, as in `127.0.0.1:50051` or `[::1]:50051`. */
export interface HostPort {
  /** Host name or IP address (IPv6 without brackets). */
  readonly host: string;
  /** TCP port, 0..65535. */
  readonly port: number;
}

/** Splits `HOST:PORT` (IPv6 in brackets); throws a message naming the accepted form. */
export function parseHostPort(value: string): HostPort {
  const text = value.trim();
  const match = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]\s/]+)):(\d{1,5})$/.exec(text);
  const host = match?.[1] ?? match?.[2];
  const port = Number(match?.[3]);
  if (host === undefined || !Number.isInteger(port) || port > 65535) {
    throw new InvalidArgumentError(`"${value}" is not HOST:PORT (e.g. 127.0.0.1:50051 or [::1]:50051).`);
  }
  return { host, port };
}

/** Commander parser that validates `HOST:PORT` and keeps the text. */
export function hostPortText(value: string): string {
  parseHostPort(value);
  return value.trim();
}

/** Formats a host and port back to `HOST:PORT`, bracketing IPv6 addresses. */
export function formatHostPort({ host, port }: HostPort): string {
  return host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
}

/** Commander collector for a repeatable option: appends each value. */
export function collect(value: string, previous: string[] | undefined): string[] {
  return [...(previous ?? []), value];
}
