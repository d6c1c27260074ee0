/**
 * `npm run chaos -- --seconds N --seed S [--store file|s3]`: one chaos run
 * (see `run-chaos.ts`), progress on stderr, the JSON summary on stdout; exit
 * status 1 when the checker found violations.
 */
import { parseArgs } from "node:util";
import { S3_TEST_BUCKET, startS3Server } from "../support/s3-server.ts";
import { NEMESIS_KINDS, type NemesisKind } from "./nemesis.ts";
import { runChaos, type StoreKind } from "./run-chaos.ts";

const USAGE = `Usage: npm run chaos -- [--seconds N] [--seed S] [--store file|s3] [--kinds k1,k2] [--keep]

Runs three casq serve processes on one store, a producer and a worker in each
SDK language (TypeScript, Go, Python), and a seeded nemesis that SIGKILLs and
SIGSTOPs leaders and SIGKILLs workers mid-job; then drains the queue and checks
every client's history. Prints one JSON summary on stdout; exits 1 on violations,
3 when the harness itself failed (e.g. a broker that would not start).

  --seconds N     load phase with faults, in seconds (default 300)
  --seed S        seed of the nemesis and the clients' hold times (default: random, printed)
  --store KIND    file (a temporary directory, default) or s3 (the S3 test server
                  started here, or CASQ_TEST_S3_ENDPOINT / CASQ_TEST_S3_BUCKET)
  --kinds LIST    fault kinds, comma-separated (default ${NEMESIS_KINDS.join(",")})
  --keep          keep the run's directory (histories, file store) even when clean
  -h, --help      this text`;

const { values } = parseArgs({
  options: {
    seconds: { type: "string", default: "300" },
    seed: { type: "string" },
    store: { type: "string", default: "file" },
    kinds: { type: "string" },
    keep: { type: "boolean", default: false },
    help: { type: "boolean", short: "h", default: false },
  },
});

if (values.help) {
  console.log(USAGE);
  process.exit(0);
}
const seconds = Number(values.seconds);
const seed = values.seed === undefined ? Math.floor(Math.random() * 2 ** 31) : Number(values.seed);
const store = values.store as StoreKind;
const kinds = values.kinds?.split(",").filter((k) => k !== "") as NemesisKind[] | undefined;
if (
  !Number.isFinite(seconds) ||
  seconds <= 0 ||
  !Number.isInteger(seed) ||
  (store !== "file" && store !== "s3")
) {
  console.error(USAGE);
  process.exit(2);
}
for (const kind of kinds ?? [])
  if (!NEMESIS_KINDS.includes(kind)) {
    console.error(`unknown fault kind ${kind}; known: ${NEMESIS_KINDS.join(", ")}`);
    process.exit(2);
  }

console.error(`[chaos] seed ${seed}`);
let s3: { endpoint: string; bucket: string } | undefined;
let stopS3: (() => Promise<void>) | undefined;
if (store === "s3") {
  const external = process.env.CASQ_TEST_S3_ENDPOINT;
  if (external) s3 = { endpoint: external, bucket: process.env.CASQ_TEST_S3_BUCKET ?? S3_TEST_BUCKET };
  else {
    const server = await startS3Server();
    s3 = { endpoint: server.endpoint, bucket: server.bucket };
    stopS3 = server.stop;
  }
}
try {
  const summary = await runChaos({
    seconds,
    seed,
    store,
    ...(s3 ? { s3 } : {}),
    ...(kinds ? { kinds } : {}),
    keep: values.keep,
    log: (line) => console.error(line),
  });
  console.log(JSON.stringify(summary, null, 2));
  process.exitCode = summary.violations.length > 0 ? 1 : 0;
} catch (error) {
  console.error(`[chaos] the run itself failed (seed ${seed}):`, error);
  process.exitCode = 3;
} finally {
  await stopS3?.();
}
