#!/usr/bin/env node
/**
 * Packs the npm packages of casq (the generated API `@casq/api`, the SDK
 * `@casq/sdk` and the server `casq`)
 * from their build (`npm run build` first) into tarballs in OUT_DIR:
 *
 *     node scripts/pack-npm.mjs OUT_DIR     # prints one tarball path a line
 *
 * In the repository each package.json points at the TypeScript source
 * (`./src/*.ts`), so that tests, tsx scripts and `casq serve` run the source
 * with no build step. The published manifest is that package.json with every
 * `./src/X.ts` target replaced by the build (`./dist/X.js`, types
 * `./dist/X.d.ts`), without `private`, `scripts` and `devDependencies`. Each
 * package is staged in a temporary directory (manifest, README, dist/, and
 * bin/ for the server) and packed there with `npm pack`, so nothing in the
 * checkout is rewritten, not even for a moment.
 *
 * Every manifest must carry the version in the repository's VERSION file.
 */
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(fileURLToPath(new URL(".", import.meta.url)), "..");
const VERSION = readFileSync(join(ROOT, "VERSION"), "utf8").trim();

/** The packages, in dependency order; `files` are what the tarball holds besides package.json. */
const PACKAGES = [
  { dir: "api/ts", files: ["dist", "README.md"] },
  { dir: "sdk/ts", files: ["dist", "README.md"] },
  { dir: "server", files: ["dist", "bin", "README.md"] },
];

/** `./src/a/b.ts` → `./dist/a/b.js` (or `.d.ts`); `./src/gen/*` → `./dist/gen/*`. */
function toBuild(target, ext) {
  if (!target.startsWith("./src/")) throw new Error(`export target ${target} is not under ./src/`);
  const rest = target.slice("./src/".length);
  return `./dist/${rest.endsWith(".ts") ? rest.slice(0, -".ts".length) + ext : rest}`;
}

/** One export entry for the build: types first, as TypeScript asks. */
function buildEntry(key, target) {
  const source = typeof target === "string" ? target : (target.default ?? target.import);
  // A subpath pattern (`./gen/*` → `./src/gen/*`, `./*` → `./src/*`) is imported with the
  // .ts name (`@casq/sdk/gen/casq/v1/x_pb.ts`, `@casq/api/casq/v1/x_pb.ts`); in the build
  // it must name .js and .d.ts.
  if (key.endsWith("*")) {
    const entry = { types: `${toBuild(source, "")}.d.ts`, default: `${toBuild(source, "")}.js` };
    return [
      [`${key}.ts`, entry],
      [`${key}.js`, entry],
    ];
  }
  return [[key, { types: toBuild(source, ".d.ts"), default: toBuild(source, ".js") }]];
}

/** The package.json a consumer of the tarball gets. */
export function publishManifest(manifest) {
  const { private: _private, scripts: _scripts, devDependencies: _dev, ...published } = manifest;
  if (published.exports !== undefined) {
    published.exports = Object.fromEntries(
      Object.entries(published.exports).flatMap(([key, target]) => buildEntry(key, target)),
    );
  }
  if (typeof published.main === "string") published.main = toBuild(published.main, ".js");
  if (typeof published.types === "string") published.types = toBuild(published.types, ".d.ts");
  published.files = undefined;
  return published;
}

function pack(pkg, outDir) {
  const dir = join(ROOT, pkg.dir);
  const manifest = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
  if (manifest.version !== VERSION) {
    throw new Error(`${pkg.dir}/package.json has version ${manifest.version}, VERSION says ${VERSION}`);
  }
  if (!existsSync(join(dir, "dist"))) throw new Error(`${pkg.dir}/dist is missing: run npm run build first`);
  const stage = mkdtempSync(join(tmpdir(), "casq-pack-"));
  try {
    for (const file of pkg.files) {
      const from = file === "README.md" && !existsSync(join(dir, file)) ? join(ROOT, file) : join(dir, file);
      cpSync(from, join(stage, file), { recursive: true });
    }
    writeFileSync(join(stage, "package.json"), `${JSON.stringify(publishManifest(manifest), null, 2)}\n`);
    const output = execFileSync("npm", ["pack", "--json", "--pack-destination", outDir], {
      cwd: stage,
      encoding: "utf8",
      stdio: ["ignore", "pipe", "inherit"],
    });
    return join(outDir, JSON.parse(output)[0].filename);
  } finally {
    rmSync(stage, { recursive: true, force: true });
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const outDir = resolve(process.argv[2] ?? "dist/artifacts");
  mkdirSync(outDir, { recursive: true });
  for (const pkg of PACKAGES) console.log(pack(pkg, outDir));
}
