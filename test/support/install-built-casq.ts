/**
 * `npx tsx test/support/install-built-casq.ts DIR`: installs the casq server
 * as users install it (this checkout built, packed into its npm tarballs and
 * installed under DIR, an empty directory) and prints the installed `casq`
 * launcher's path; progress goes to stderr.
 *
 * `npm test` (scripts/test-all.sh) runs it once and hands the path to every
 * suite as `CASQ_TEST_BIN`: their brokers and `casq` commands then run the
 * JavaScript build with plain node. Through the checkout's launcher each
 * such process loads the TypeScript source through tsx, which costs it
 * ~0.6-0.8 s more to start (`casq serve` ~2.2 against ~1.4 s here), and the
 * suites start several hundred. Without `CASQ_TEST_BIN` (one test file run
 * by hand) the suites run the checkout's launcher, with no build step.
 */
import { readdirSync } from "node:fs";
import { installBuiltCasq } from "../../bench/lib/built-server.ts";

const dir = process.argv[2];
if (dir === undefined || dir === "--help" || dir === "-h") {
  console.error("usage: npx tsx test/support/install-built-casq.ts DIR   (DIR: an empty directory)");
  process.exit(dir === undefined ? 2 : 0);
}
if (readdirSync(dir).length > 0) {
  console.error(`install-built-casq: ${dir} is not empty`);
  process.exit(2);
}
const bin = installBuiltCasq(dir, (line) => console.error(line));
console.log(bin);
