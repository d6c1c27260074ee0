/**
 * The casq server as users install it, for benchmarks that measure the
 * broker process itself (its memory above all): the JavaScript build, packed
 * into the npm tarballs (`npm run build`, `scripts/pack-npm.mjs`) and
 * installed from them into a temporary directory, run with plain `node` and
 * no TypeScript loader.
 *
 * A checkout's `server/bin/casq.js` runs the TypeScript source through tsx's
 * in-process loader (no build step for tests and development), which costs
 * the process ~45 MiB of resident memory and some CPU that an installed
 * `casq serve` does not have.
 */
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** An installed build of this checkout's server. */
export interface BuiltServer {
  /** The `casq` launcher of the installed package (run it with `node`). */
  readonly bin: string;
  /**
   * `bench/systems/slow-store-server.ts` compiled to JavaScript beside the
   * installation (run it with `node`): the same server code, with the file
   * store behind the fault-injecting wrapper, no TypeScript loader.
   */
  readonly slowStoreServer: string;
  /** Removes the installation. */
  remove(): void;
}

/**
 * Builds this checkout, packs its npm packages and installs them into a
 * fresh temporary directory (~30 s; npm may fetch the server's dependencies
 * from its cache or the registry). `log` gets one line per step.
 */
export function installBuiltServer(log: (line: string) => void): BuiltServer {
  const dir = mkdtempSync(join(tmpdir(), "casq-bench-built-"));
  const run = (command: string, args: string[], cwd: string) =>
    execFileSync(command, args, { cwd, stdio: ["ignore", "ignore", "inherit"] });
  const install = join(dir, "install");
  let slowStoreServer: string;
  try {
    log("built server: npm run build");
    run("npm", ["run", "--silent", "build"], ROOT);
    const tarballs = join(dir, "tarballs");
    mkdirSync(tarballs);
    log("built server: packing the npm packages");
    run(process.execPath, [join(ROOT, "scripts", "pack-npm.mjs"), tarballs], ROOT);
    mkdirSync(install);
    writeFileSync(join(install, "package.json"), '{ "private": true }\n');
    log("built server: npm install of the tarballs");
    run(
      "npm",
      [
        "install",
        "--no-audit",
        "--no-fund",
        "--prefer-offline",
        "--loglevel=error",
        ...readdirSync(tarballs).map((name) => join(tarballs, name)),
      ],
      install,
    );
    log("built server: compiling the slow-store server");
    slowStoreServer = compileSlowStoreServer(install);
  } catch (error) {
    rmSync(dir, { recursive: true, force: true });
    throw error;
  }
  return {
    bin: join(install, "node_modules", "casq", "bin", "casq.js"),
    slowStoreServer,
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}

/**
 * Compiles `bench/systems/slow-store-server.ts` and what it imports of this
 * checkout (the server's source, the fault-injecting store) with tsc, no
 * type check, into `INSTALL/slow/`, so the S3-like profile runs by plain
 * node like the installed build. Package imports (`@casq/api/...`, pino,
 * gRPC) resolve from `INSTALL/node_modules`: the installed packages.
 * Returns the compiled server's path.
 */
export function compileSlowStoreServer(install: string): string {
  const config = join(install, "tsconfig.slow.json");
  writeFileSync(
    config,
    `${JSON.stringify(
      {
        extends: join(ROOT, "tsconfig.json"),
        compilerOptions: {
          noEmit: false,
          noCheck: true,
          rootDir: ROOT,
          outDir: join(install, "slow"),
          rewriteRelativeImportExtensions: true,
        },
        include: [],
        files: [join(ROOT, "bench", "systems", "slow-store-server.ts")],
      },
      null,
      2,
    )}\n`,
  );
  execFileSync(process.execPath, [join(ROOT, "node_modules", "typescript", "bin", "tsc"), "-p", config], {
    cwd: install,
    stdio: ["ignore", "inherit", "inherit"],
  });
  writeFileSync(join(install, "slow", "package.json"), '{ "type": "module" }\n');
  return join(install, "slow", "bench", "systems", "slow-store-server.js");
}

/**
 * The benchmarks' `--server built|source` option in one place: checks its
 * value (a clear message and exit code 2 otherwise) and, for `built` when
 * the run starts casq at all (`needed`), installs the build
 * ({@link installBuiltServer}) and removes it when the process exits.
 * `undefined` means: run the checkout's source launcher.
 */
export function serverFromOption(
  value: string,
  needed: boolean,
  log: (line: string) => void,
): BuiltServer | undefined {
  if (value !== "built" && value !== "source") {
    console.error(`--server takes built or source; got ${value}`);
    process.exit(2);
  }
  if (value === "source" || !needed) return undefined;
  const built = installBuiltServer(log);
  process.once("exit", () => built.remove());
  return built;
}
