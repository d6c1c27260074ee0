#!/usr/bin/env node
// Launcher of the `casq` command, and the broker process itself: it imports the
// CLI in-process and never spawns a child, so the pid a supervisor started is
// the one that gets SIGTERM and SIGKILL.
//
// - In a checkout (server/src is there) it runs the TypeScript source through
//   tsx's in-process ESM loader: no build step, never a stale build, for
//   `node server/bin/casq.js ...`, `node_modules/.bin/casq ...` and a test file
//   run on its own (`npm test` runs the build it unpacks: CASQ_TEST_BIN).
// - In an installed package (the npm tarball ships dist/ and bin/, no src/) it
//   runs the JavaScript build, dist/cli/main.js, with plain node.
import { existsSync } from "node:fs";

const source = new URL("../src/cli/main.ts", import.meta.url);
if (existsSync(source)) {
  const { register } = await import("tsx/esm/api");
  register();
  await import(source.href);
} else {
  await import("../dist/cli/main.js");
}
