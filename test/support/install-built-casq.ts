/**
 * `npx tsx test/support/install-built-casq.ts DIR`: builds this checkout
 * (`npm run build`), packs its npm packages (scripts/pack-npm.mjs) and
 * unpacks the tarballs into `DIR/node_modules` (DIR: an empty directory
 * under `server/`), then prints the unpacked `casq` launcher's path;
 * progress goes to stderr.
 *
 * `npm test` (scripts/test-all.sh) runs it once and hands the path to every
 * suite as `CASQ_TEST_BIN`: their brokers and `casq` commands then run the
 * JavaScript build, as published, with plain node. Through the checkout's
 * launcher each such process loads the TypeScript source through tsx, which
 * costs it ~0.6-0.8 s more to start (`casq serve` ~2.2 against ~1.4 s here),
 * and the suites start several hundred. Without `CASQ_TEST_BIN` (a test
 * file run on its own) the suites run the checkout's launcher, with no build.
 *
 * Unpacked, not `npm install`ed: the packages' dependencies resolve, as the
 * workspace's own do, from `server/node_modules` and the repository's
 * `node_modules`, the versions package-lock.json pins (no registry, no
 * version that floats). test/packaging/npm-packages.test.ts installs the
 * tarballs as users do.
 */
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const SERVER = join(ROOT, "server");

const arg = process.argv[2];
if (arg === undefined || arg === "--help" || arg === "-h") {
  console.error(
    "usage: npx tsx test/support/install-built-casq.ts DIR   (DIR: an empty directory under server/)",
  );
  process.exit(arg === undefined ? 2 : 0);
}
const dir = resolve(arg);
if (!dir.startsWith(SERVER + sep)) {
  console.error(
    `install-built-casq: ${dir} is not under ${SERVER} (its packages' dependencies resolve from there)`,
  );
  process.exit(2);
}
if (readdirSync(dir).length > 0) {
  console.error(`install-built-casq: ${dir} is not empty`);
  process.exit(2);
}

const run = (command: string, args: string[]) =>
  execFileSync(command, args, { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"] }).toString("utf8");

console.error("built casq: npm run build");
run("npm", ["run", "--silent", "build"]);
const tarballs = mkdtempSync(join(tmpdir(), "casq-test-tarballs-"));
try {
  console.error("built casq: packing the npm packages");
  const packed = run(process.execPath, [join(ROOT, "scripts", "pack-npm.mjs"), tarballs])
    .split("\n")
    .filter((line) => line.endsWith(".tgz"));
  console.error("built casq: unpacking them");
  for (const tarball of packed.map((path) => resolve(ROOT, path))) {
    const listed = execFileSync("tar", ["-xzOf", tarball, "package/package.json"]).toString("utf8");
    const { name } = JSON.parse(listed) as { name: string };
    const target = join(dir, "node_modules", ...name.split("/"));
    mkdirSync(target, { recursive: true });
    execFileSync("tar", ["-xzf", tarball, "-C", target, "--strip-components=1"]);
  }
} finally {
  rmSync(tarballs, { recursive: true, force: true });
}
const bin = join(dir, "node_modules", "casq", "bin", "casq.js");
readFileSync(bin); // fails here, not in the suites, when the server package was not among them
console.log(bin);
