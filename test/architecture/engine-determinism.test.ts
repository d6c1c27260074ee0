/**
 * The determinism rules of biome.json (engine code reads no clock and no
 * randomness of its own) fail on planted violations: biome runs with the
 * repository's config and plugin in a temporary directory laid out like the
 * repository, over files that call what the rules ban. Each banned line must
 * be reported, each allowed line must not, and the same code outside the
 * engine, or in an engine test, is left alone.
 */
import { execFileSync } from "node:child_process";
import { cpSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const BIOME = join(ROOT, "node_modules", ".bin", "biome");

/** The diagnostics the determinism rules produce (other lint rules are not under test here). */
const RULES = new Set(["plugin", "lint/style/noRestrictedGlobals", "lint/style/noRestrictedImports"]);

/** One line per case; `BANNED` marks the lines the rules must report. */
const PLANTED = `import { createHash, randomBytes } from "node:crypto"; // BANNED
import { randomUUID } from "node:crypto"; // BANNED
import { setTimeout as sleep } from "node:timers/promises"; // BANNED

export function planted(): unknown[] {
  return [
    Date.now(), // BANNED
    new Date(), // BANNED
    Date(), // BANNED
    Math.random(), // BANNED
    performance.now(), // BANNED
    process.hrtime.bigint(), // BANNED
    crypto.randomUUID(), // BANNED
    AbortSignal.timeout(5), // BANNED
    setTimeout(() => {}, 1), // BANNED
    setInterval(() => {}, 1), // BANNED
    globalThis.setTimeout, // BANNED
    randomBytes(4), // allowed here: its import is the line reported
    randomUUID(), // allowed here: its import is the line reported
    sleep, // allowed here: its import is the line reported
    new Date(5), // allowed: a given time
    Math.floor(2.5), // allowed
    createHash("sha256"), // allowed: a hash is deterministic
    setImmediate(() => {}), // allowed: orders work, reads no time
  ];
}
`;

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/** Lints `files` (path → text) in a copy of the repository's biome setup; the determinism diagnostics by file and line. */
function lint(files: Record<string, string>): Map<string, Set<number>> {
  const dir = mkdtempSync(join(tmpdir(), "casq-determinism-"));
  dirs.push(dir);
  cpSync(join(ROOT, "biome.json"), join(dir, "biome.json"));
  cpSync(join(ROOT, "scripts", "lint"), join(dir, "scripts", "lint"), { recursive: true });
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, path)), { recursive: true });
    writeFileSync(join(dir, path), text);
  }
  let output: string;
  try {
    output = execFileSync(
      BIOME,
      ["lint", "--vcs-enabled=false", "--reporter=json", "--max-diagnostics=none", "--colors=off", "server"],
      { cwd: dir, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] },
    );
  } catch (error) {
    // biome exits 1 when it reports errors; the report is still on stdout.
    output = String((error as { stdout?: unknown }).stdout ?? "");
  }
  const report = JSON.parse(output) as {
    diagnostics: { category: string; location: { path: string; start: { line: number } } }[];
  };
  const found = new Map<string, Set<number>>();
  for (const d of report.diagnostics) {
    if (!RULES.has(d.category)) continue;
    const lines = found.get(d.location.path) ?? new Set<number>();
    lines.add(d.location.start.line);
    found.set(d.location.path, lines);
  }
  return found;
}

/** 1-based numbers of the lines of `text` marked BANNED. */
function bannedLines(text: string): number[] {
  return text.split("\n").flatMap((line, i) => (line.includes("// BANNED") ? [i + 1] : []));
}

describe("determinism rules of engine code", () => {
  const engineFiles = [
    "server/src/model/planted.ts",
    "server/src/broker/planted.ts",
    "server/src/store/retrying-store.ts",
  ];
  const found = lint({
    ...Object.fromEntries(engineFiles.map((path) => [path, PLANTED])),
    "server/src/service/planted.ts": PLANTED,
    "server/src/store/file-store.ts": PLANTED,
    "server/src/model/planted.test.ts": PLANTED,
  });

  it.each(engineFiles)("report every banned call in %s and nothing else", (path) => {
    expect([...(found.get(path) ?? [])].sort((a, b) => a - b)).toEqual(bannedLines(PLANTED));
  });

  it("leave code outside the engine and the engine's tests alone", () => {
    expect(found.get("server/src/service/planted.ts")).toBeUndefined();
    expect(found.get("server/src/store/file-store.ts")).toBeUndefined();
    expect(found.get("server/src/model/planted.test.ts")).toBeUndefined();
  });
});
