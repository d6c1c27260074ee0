import { availableParallelism } from "node:os";
import { defineConfig } from "vitest/config";
import { LongFilesFirst } from "./test/support/long-files-first.ts";

export default defineConfig({
  test: {
    include: ["server/**/*.test.ts", "sdk/ts/**/*.test.ts", "test/**/*.test.ts"],
    exclude: ["**/node_modules/**"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    globalSetup: ["test/support/global-setup.ts"],
    // Two test files at a time even on two cores (vitest's default there is one): most files
    // spend their time waiting on the processes, sockets and disk writes they drive, so a
    // second runs beside them (vitest 1,270 -> 838 s on the two-core project machine).
    maxWorkers: Math.max(2, availableParallelism() - 1),
    // The files that take minutes start first, so that none of them ends the run alone.
    sequence: { sequencer: LongFilesFirst },
  },
});
