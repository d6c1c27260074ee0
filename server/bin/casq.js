#!/usr/bin/env node
// Launcher of the `casq` command: runs the TypeScript entry point
// (server/src/cli/main.ts) through tsx's ESM loader, so there is no build
// step. Works as `npx casq ...` from the repository root (npm links this file
// into node_modules/.bin) and as `node server/bin/casq.js ...`.
import { register } from "tsx/esm/api";

register();
await import("../src/cli/main.ts");
