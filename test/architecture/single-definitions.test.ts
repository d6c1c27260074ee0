/**
 * Behaviours written once per language stay written once. Scans the
 * production sources (tests and generated code excluded) of the server and
 * the three SDKs for second copies of:
 *
 * - the leader-redirect trailer's name: one constant per language;
 * - exponential backoff (a doubling: `2 ** n`, `*= 2`): only the backoff
 *   helper of each language (TypeScript `sdk/ts/src/backoff.ts`, Go
 *   `sdk/go/backoff.go`, Python `casq/_backoff.py`). The model's nack backoff
 *   (`server/src/model/backoff.ts`) is queue semantics with a multiplier and
 *   a hash-derived jitter, a different thing, and is not matched;
 * - a hand-written async queue (`implements AsyncIterable`): only
 *   `sdk/ts/src/async-queue.ts`.
 */
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

function files(dir: string, keep: (path: string) => boolean): string[] {
  return readdirSync(join(ROOT, dir), { withFileTypes: true, recursive: true })
    .filter((entry) => entry.isFile())
    .map((entry) => relative(ROOT, join(entry.parentPath, entry.name)))
    .filter((path) => !/(^|\/)(gen|v1|node_modules|examples)\//.test(path) && keep(path));
}

const SOURCES = {
  typescript: [
    ...files("server/src", (p) => p.endsWith(".ts") && !p.endsWith(".test.ts")),
    ...files("sdk/ts/src", (p) => p.endsWith(".ts") && !p.endsWith(".test.ts")),
  ],
  go: files("sdk/go", (p) => p.endsWith(".go") && !p.endsWith("_test.go")),
  python: files("sdk/python/src", (p) => p.endsWith(".py")),
};

/** Files (and lines) of `sources` whose code, comments left out, matches `pattern`. */
function matches(sources: readonly string[], pattern: RegExp): string[] {
  const found: string[] = [];
  for (const path of sources) {
    readFileSync(join(ROOT, path), "utf8")
      .split("\n")
      .forEach((line, i) => {
        const code = line.replace(/^\s*(\/\/|\*|\/\*|#).*$/, "").replace(/\s(\/\/|#) .*$/, "");
        if (pattern.test(code)) found.push(`${path}:${i + 1}`);
      });
  }
  return found;
}

const inFiles = (found: string[]) => [...new Set(found.map((f) => f.replace(/:\d+$/, "")))];

describe("behaviours written once per language", () => {
  it("scans the production sources of every language", () => {
    for (const sources of Object.values(SOURCES)) expect(sources.length).toBeGreaterThan(5);
  });

  it("the leader-redirect trailer is spelled once per language", () => {
    const trailer = /casq-leader-address/;
    expect(inFiles(matches(SOURCES.typescript, trailer))).toEqual(["sdk/ts/src/errors.ts"]);
    expect(inFiles(matches(SOURCES.go, trailer))).toEqual(["sdk/go/errors.go"]);
    expect(inFiles(matches(SOURCES.python, trailer))).toEqual(["sdk/python/src/casq/errors.py"]);
  });

  it("exponential backoff is computed only by each language's backoff helper", () => {
    expect(inFiles(matches(SOURCES.typescript, /\b2 \*\* [A-Za-z(]|\*= 2\b/))).toEqual([
      "sdk/ts/src/backoff.ts",
    ]);
    expect(inFiles(matches(SOURCES.go, /\*= 2\b|\b2 \*\* |<< [a-z]/))).toEqual(["sdk/go/backoff.go"]);
    expect(inFiles(matches(SOURCES.python, /\b2 \*\* *\(?[A-Za-z(]|\*= 2\b/))).toEqual([
      "sdk/python/src/casq/_backoff.py",
    ]);
  });

  it("there is one hand-written async queue", () => {
    expect(inFiles(matches(SOURCES.typescript, /implements AsyncIterable</))).toEqual([
      "sdk/ts/src/async-queue.ts",
    ]);
  });
});
