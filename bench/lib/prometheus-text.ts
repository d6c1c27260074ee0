/**
 * Reading a broker's Prometheus endpoint from the benchmark: fetch the text
 * exposition format, sum the samples of a family that match some labels, and
 * estimate a quantile from a histogram's buckets the way PromQL's
 * `histogram_quantile` does (linear inside the bucket that holds the rank).
 */

/** One sample line: `name{label="value",...} number`. */
export interface Sample {
  readonly name: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
}

const LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

/** Parses the text exposition format (comments and blank lines skipped). */
export function parseSamples(text: string): Sample[] {
  const samples: Sample[] = [];
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const match = LINE.exec(line);
    if (!match) continue;
    const labels: Record<string, string> = {};
    for (const [, key, value] of (match[2] ?? "").matchAll(LABEL))
      labels[key as string] = (value as string).replace(/\\(.)/g, (_, c: string) => (c === "n" ? "\n" : c));
    samples.push({ name: match[1] as string, labels, value: Number(match[3]) });
  }
  return samples;
}

/** Fetches and parses `url` (a `/metrics` endpoint). */
export async function scrape(url: string): Promise<Sample[]> {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return parseSamples(await response.text());
}

/** Sum of the samples named `name` whose labels include every pair of `match`. */
export function sumOf(samples: readonly Sample[], name: string, match: Record<string, string> = {}): number {
  let sum = 0;
  for (const s of samples)
    if (s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v)) sum += s.value;
  return sum;
}

/** Cumulative bucket counts of histogram `name` (summed over series matching `match`), by upper bound. */
export function bucketsOf(
  samples: readonly Sample[],
  name: string,
  match: Record<string, string> = {},
): Map<number, number> {
  const buckets = new Map<number, number>();
  for (const s of samples) {
    if (s.name !== `${name}_bucket` || s.labels.le === undefined) continue;
    if (!Object.entries(match).every(([k, v]) => s.labels[k] === v)) continue;
    const le = s.labels.le === "+Inf" ? Number.POSITIVE_INFINITY : Number(s.labels.le);
    buckets.set(le, (buckets.get(le) ?? 0) + s.value);
  }
  return buckets;
}

/** `after - before`, bucket by bucket (the observations between two scrapes). */
export function bucketDelta(after: Map<number, number>, before: Map<number, number>): Map<number, number> {
  const delta = new Map<number, number>();
  for (const [le, count] of after) delta.set(le, count - (before.get(le) ?? 0));
  return delta;
}

/**
 * The `q` quantile (0..1) of cumulative `buckets`, interpolated linearly
 * inside the bucket holding the rank; the largest finite bound when the rank
 * falls in `+Inf`; 0 without observations.
 */
export function histogramQuantile(q: number, buckets: Map<number, number>): number {
  const bounds = [...buckets.keys()].sort((a, b) => a - b);
  const total = buckets.get(Number.POSITIVE_INFINITY) ?? 0;
  if (total <= 0) return 0;
  const rank = q * total;
  let lower = 0;
  let below = 0;
  for (const upper of bounds) {
    const count = buckets.get(upper) as number;
    if (count >= rank) {
      if (upper === Number.POSITIVE_INFINITY) return lower;
      return count === below ? upper : lower + ((upper - lower) * (rank - below)) / (count - below);
    }
    lower = upper;
    below = count;
  }
  return lower;
}
