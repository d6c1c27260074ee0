/**
 * A temporary directory for one test, removed when the test has finished
 * (vitest's `onTestFinished` runs after the file's `afterEach` hooks, so
 * servers closed there no longer use it).
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { onTestFinished } from "vitest";

/** Makes `<tmpdir>/<prefix>XXXXXX` and removes it with everything in it after the running test. */
export function tempDirForTest(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}
