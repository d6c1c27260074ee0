/**
 * Output of the CLI: `--json` for scripts, aligned tables and short units for
 * humans.
 *
 * JSON output uses the protobuf JSON mapping of the API messages (the shape
 * grpcurl prints): lowerCamelCase field names, every field present (zero
 * values included), durations as `"1.500s"` and timestamps as RFC 3339
 * strings, with one change: 64-bit integers (counts, offsets, epochs, bytes)
 * are JSON numbers like every other number, not the mapping's strings, so
 * `jq '.totals.ready > 0'` works. JSON numbers are exact up to 2^53 - 1
 * (9007199254740991), which no count or offset of casq comes near.
 */
import { type DescField, type DescMessage, type MessageShape, ScalarType, toJson } from "@bufbuild/protobuf";
import { type Duration, durationMs, type Timestamp, timestampDate } from "@bufbuild/protobuf/wkt";
import { Option } from "commander";

/** The `--json` flag every read command has. */
export function jsonOption(): Option {
  return new Option("--json", "print JSON (protobuf JSON mapping) for scripts instead of text");
}

/** A message in the protobuf JSON mapping, with zero values included and 64-bit integers as numbers. */
export function messageJson<Desc extends DescMessage>(schema: Desc, message: MessageShape<Desc>): unknown {
  return int64sAsNumbers(schema, toJson(schema, message, { alwaysEmitImplicit: true }));
}

const INT64_TYPES = new Set<ScalarType>([
  ScalarType.INT64,
  ScalarType.UINT64,
  ScalarType.SINT64,
  ScalarType.FIXED64,
  ScalarType.SFIXED64,
]);

/** Rewrites the int64 strings of `json` (the JSON mapping of a `schema` message) as numbers. */
function int64sAsNumbers(schema: DescMessage, json: unknown): unknown {
  if (typeof json !== "object" || json === null || Array.isArray(json)) return json;
  // Well-known types (Duration, Timestamp, ...) have their own string forms: kept.
  if (schema.typeName.startsWith("google.protobuf.")) return json;
  const object = json as Record<string, unknown>;
  for (const field of schema.fields) {
    const value = object[field.jsonName];
    if (value !== undefined) object[field.jsonName] = fieldAsNumbers(field, value);
  }
  return object;
}

function fieldAsNumbers(field: DescField, value: unknown): unknown {
  const number = (v: unknown) => (typeof v === "string" && /^-?\d+$/.test(v) ? Number(v) : v);
  switch (field.fieldKind) {
    case "scalar":
      return INT64_TYPES.has(field.scalar) ? number(value) : value;
    case "message":
      return int64sAsNumbers(field.message, value);
    case "list":
      if (!Array.isArray(value)) return value;
      if (field.listKind === "scalar" && INT64_TYPES.has(field.scalar)) return value.map(number);
      if (field.listKind === "message") return value.map((v) => int64sAsNumbers(field.message, v));
      return value;
    case "map": {
      if (typeof value !== "object" || value === null) return value;
      const entries = Object.entries(value as Record<string, unknown>);
      if (field.mapKind === "scalar" && INT64_TYPES.has(field.scalar))
        return Object.fromEntries(entries.map(([k, v]) => [k, number(v)]));
      if (field.mapKind === "message")
        return Object.fromEntries(entries.map(([k, v]) => [k, int64sAsNumbers(field.message, v)]));
      return value;
    }
    default:
      return value;
  }
}

/** Writes one JSON value, pretty-printed, to stdout. */
export function printJson(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
}

/** Writes lines to stdout. */
export function printLines(...lines: string[]): void {
  process.stdout.write(lines.map((line) => `${line}\n`).join(""));
}

/** Writes a note (progress, hints) to stderr, so stdout stays clean for data. */
export function note(line: string): void {
  process.stderr.write(`${line}\n`);
}

/** Formats rows as a left-aligned table (numbers right-aligned) with a header. */
export function table(
  header: readonly string[],
  rows: readonly (readonly (string | number | bigint)[])[],
): string[] {
  const cells = [header.map(String), ...rows.map((row) => row.map(String))];
  const isNumber = (cell: unknown) => typeof cell === "number" || typeof cell === "bigint";
  const numeric = header.map(
    (_, column) =>
      rows.some((row) => isNumber(row[column])) &&
      rows.every((row) => isNumber(row[column]) || row[column] === "-"),
  );
  const widths = header.map((_, column) => Math.max(...cells.map((row) => (row[column] ?? "").length)));
  return cells.map((row) =>
    row
      .map((cell, column) => {
        const width = widths[column] ?? 0;
        return numeric[column] ? cell.padStart(width) : cell.padEnd(width);
      })
      .join("  ")
      .trimEnd(),
  );
}

/** Formats milliseconds as a short duration: `850ms`, `12s`, `3m20s`, `5h2m`, `2d3h`. */
export function formatMs(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)}ms`;
  const s = Math.floor(ms / 1000);
  if (s < 60) return ms % 1000 === 0 || s >= 10 ? `${s}s` : `${(ms / 1000).toFixed(1)}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return s % 60 === 0 ? `${m}m` : `${m}m${s % 60}s`;
  const h = Math.floor(m / 60);
  if (h < 24) return m % 60 === 0 ? `${h}h` : `${h}h${m % 60}m`;
  const d = Math.floor(h / 24);
  return h % 24 === 0 ? `${d}d` : `${d}d${h % 24}h`;
}

/** Formats a protobuf Duration for humans; `-` when unset. */
export function formatDuration(duration: Duration | undefined): string {
  return duration === undefined ? "-" : formatMs(durationMs(duration));
}

/** Formats a protobuf Timestamp as ISO 8601 (UTC); `-` when unset. */
export function formatTimestamp(timestamp: Timestamp | undefined): string {
  return timestamp === undefined ? "-" : timestampDate(timestamp).toISOString();
}

/** Formats a byte count: `512 B`, `1.5 KiB`, `64 MiB`. */
export function formatBytes(bytes: number | bigint): string {
  const n = Number(bytes);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  const text = unit === 0 || value >= 100 || Number.isInteger(value) ? value.toFixed(0) : value.toFixed(1);
  return `${text} ${units[unit]}`;
}

/**
 * A short, printable preview of a payload: UTF-8 text when it decodes
 * cleanly (control characters escaped), otherwise `<N bytes>`.
 */
export function payloadPreview(payload: Uint8Array, max = 60): string {
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(payload);
  } catch {
    return `<${payload.length} bytes>`;
  }
  const escaped = JSON.stringify(text).slice(1, -1);
  return escaped.length > max ? `${escaped.slice(0, max - 1)}…` : escaped;
}
