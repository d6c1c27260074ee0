/**
 * Runs one of `bench/`'s scripts as `npm run bench:*` does (node with tsx),
 * for the tests that check a script still runs end to end.
 */
import { execFile } from "node:child_process";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

/**
 * A runner of `bench/<file>` with arguments (and `env` in place of this
 * process's environment when given): resolves with its output, rejects on a
 * non-zero exit.
 */
export function benchScript(
  file: string,
): (args: string[], env?: NodeJS.ProcessEnv) => Promise<{ stdout: string; stderr: string }> {
  const script = join(ROOT, "bench", file);
  return (args, env) =>
    promisify(execFile)(process.execPath, ["--import", "tsx", script, ...args], {
      cwd: ROOT,
      env,
      timeout: 90_000,
      maxBuffer: 16 * 1024 * 1024,
    });
}
