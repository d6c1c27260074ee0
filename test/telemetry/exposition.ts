/**
 * A tiny parser of the Prometheus text exposition format (version 0.0.4),
 * strict enough to catch a malformed scrape: every line is blank, a comment,
 * `# HELP name text`, `# TYPE name type`, or `name{label="value",...} value`.
 * Throws on anything else, on a sample of a family without a TYPE line, and on
 * a TYPE line without a HELP line.
 */

/** One sample line. */
export interface Sample {
  readonly name: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
}

/** A parsed scrape. */
export interface Exposition {
  /** Family name -> type (counter, gauge, histogram, summary, untyped). */
  readonly types: ReadonlyMap<string, string>;
  /** Family name -> help text. */
  readonly help: ReadonlyMap<string, string>;
  readonly samples: readonly Sample[];
}

const NAME = "[a-zA-Z_:][a-zA-Z0-9_:]*";
const SAMPLE = new RegExp(`^(${NAME})(?:\\{(.*)\\})? (\\S+)(?: -?\\d+)?$`);
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)/y;
const TYPES = new Set(["counter", "gauge", "histogram", "summary", "untyped"]);

/** Parses exposition text; throws with the offending line on malformed input. */
export function parseExposition(text: string): Exposition {
  const types = new Map<string, string>();
  const help = new Map<string, string>();
  const samples: Sample[] = [];
  for (const [index, line] of text.split("\n").entries()) {
    if (line.trim() === "") continue;
    const fail = (why: string) => new Error(`line ${index + 1}: ${why}: ${line}`);
    if (line.startsWith("#")) {
      const meta = new RegExp(`^# (HELP|TYPE) (${NAME}) (.*)$`).exec(line);
      if (!meta) continue; // a plain comment
      const [, kind, name, rest] = meta as unknown as [string, string, string, string];
      if (kind === "HELP") help.set(name, rest);
      else {
        if (!TYPES.has(rest)) throw fail(`unknown type ${rest}`);
        if (!help.has(name)) throw fail("TYPE without a HELP line before it");
        types.set(name, rest);
      }
      continue;
    }
    const match = SAMPLE.exec(line);
    if (!match) throw fail("not `name{labels} value`");
    const [, name, labelText, valueText] = match as unknown as [string, string, string | undefined, string];
    const labels: Record<string, string> = {};
    if (labelText !== undefined && labelText !== "") {
      LABEL.lastIndex = 0;
      while (LABEL.lastIndex < labelText.length) {
        const l = LABEL.exec(labelText);
        if (!l) throw fail("malformed labels");
        labels[l[1] as string] = (l[2] as string).replace(/\\(.)/g, (_, c: string) => (c === "n" ? "\n" : c));
      }
    }
    // Prometheus parses values with Go's ParseFloat: Inf and NaN in any case (prom-client writes "Nan").
    const special = valueText.toLowerCase();
    const value =
      special === "+inf" || special === "inf"
        ? Number.POSITIVE_INFINITY
        : special === "-inf"
          ? Number.NEGATIVE_INFINITY
          : special === "nan"
            ? Number.NaN
            : Number(valueText);
    if (Number.isNaN(value) && special !== "nan") throw fail("value is not a number");
    const family = familyOf(name, types);
    if (family === undefined) throw fail("sample of a family without a TYPE line");
    samples.push({ name, labels, value });
  }
  return { types, help, samples };
}

/** The family a sample belongs to (`x_bucket` / `x_sum` / `x_count` of histogram `x`). */
function familyOf(name: string, types: ReadonlyMap<string, string>): string | undefined {
  if (types.has(name)) return name;
  for (const suffix of ["_bucket", "_sum", "_count"]) {
    if (name.endsWith(suffix)) {
      const base = name.slice(0, -suffix.length);
      const type = types.get(base);
      if (type === "histogram" || type === "summary") return base;
    }
  }
  return undefined;
}

/** Sum of the samples named `name` whose labels include `labels`; undefined when there is none. */
export function sampleValue(
  exposition: Exposition,
  name: string,
  labels: Readonly<Record<string, string>> = {},
): number | undefined {
  let total: number | undefined;
  for (const s of exposition.samples) {
    if (s.name !== name) continue;
    if (!Object.entries(labels).every(([k, v]) => s.labels[k] === v)) continue;
    total = (total ?? 0) + s.value;
  }
  return total;
}
