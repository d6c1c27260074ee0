/**
 * The order vitest starts test files in (vitest.config.ts): the files that
 * take minutes first. A fresh clone, as CI runs, has no record of past
 * durations, so vitest would start the largest files first, and these are
 * not the largest: with two files at a time, one of them started late and
 * ended the run alone.
 */
import { BaseSequencer, type TestSpecification } from "vitest/node";

/** The test files that take minutes on the project machine, longest first (paths from the repository root). */
export const LONG_FILES = [
  "test/sim/simulation.test.ts",
  "test/scenario-interpreter/scenarios.test.ts",
  "test/packaging/npm-packages.test.ts",
  "test/chaos/chaos.test.ts",
  "test/e2e/cli.test.ts",
];

/** Where `moduleId` goes in the order: its place in {@link LONG_FILES}, else after all of them. */
export function longFileRank(moduleId: string): number {
  const at = LONG_FILES.findIndex((file) => moduleId.endsWith(`/${file}`));
  return at < 0 ? LONG_FILES.length : at;
}

/** vitest's own order (failed, then longest, then largest files first), with {@link LONG_FILES} ahead of it. */
export class LongFilesFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    return sorted
      .map((spec, index) => ({ spec, index, rank: longFileRank(spec.moduleId) }))
      .sort((a, b) => a.rank - b.rank || a.index - b.index)
      .map(({ spec }) => spec);
  }
}
