/**
 * The client processes of a chaos run: producers and workers in TypeScript
 * (`clients/ts-client.ts` under tsx), Go (`go-client`, built once per run
 * into the run's directory) and Python (`clients/python_client.py` in the
 * project's `.venv`). Each is its own process with its own history file.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { join } from "node:path";
import { ROOT, run } from "../e2e/support/processes.ts";

/** A client language. */
export type Lang = "ts" | "go" | "python";

/** The three languages, in the order clients are started. */
export const LANGS: readonly Lang[] = ["ts", "go", "python"];

/** What a client does. */
export type Role = "producer" | "worker";

const CHAOS_DIR = join(ROOT, "test", "chaos");
const PYTHON = join(ROOT, ".venv", "bin", "python");

/** Builds the Go client into `dir` and returns the binary's path. */
export async function buildGoClient(dir: string): Promise<string> {
  const binary = join(dir, "chaos-go-client");
  const built = await run("go", ["build", "-o", binary, "."], {
    cwd: join(CHAOS_DIR, "go-client"),
    timeoutMs: 300_000,
  });
  if (built.code !== 0) throw new Error(`go build of the chaos Go client failed:\n${built.stderr}`);
  return binary;
}

/** Settings every client gets. */
export interface ClientSettings {
  readonly brokers: readonly string[];
  readonly queue: string;
  /** Directory of the history files. */
  readonly dir: string;
  /** The built Go client. */
  readonly goBinary: string;
  /** Producer: messages per second. */
  readonly rate: number;
  /** Worker: handlers at once. */
  readonly concurrency: number;
  /** Worker: lease TTL of its jobs. */
  readonly leaseTtlMs: number;
  /** Worker: longest hold of a job. */
  readonly holdMaxMs: number;
}

/** A running client process. */
export interface ClientProcess {
  /** e.g. `go-worker-2` (also its history's file name and its worker id). */
  readonly name: string;
  readonly lang: Lang;
  readonly role: Role;
  readonly history: string;
  readonly child: ChildProcess;
  /** Resolves with the exit code (null when killed by a signal). */
  readonly exited: Promise<number | null>;
  /** The last few KB it printed. */
  output(): string;
}

/** Starts one client. `seed` seeds its hold times. */
export function startClient(
  settings: ClientSettings,
  lang: Lang,
  role: Role,
  name: string,
  seed: number,
): ClientProcess {
  const history = join(settings.dir, `${name}.jsonl`);
  const args = [
    "--role",
    role,
    "--id",
    name,
    "--brokers",
    settings.brokers.join(","),
    "--queue",
    settings.queue,
    "--history",
    history,
    "--seed",
    String(seed),
    "--rate",
    String(settings.rate),
    "--concurrency",
    String(settings.concurrency),
    "--lease-ttl-ms",
    String(settings.leaseTtlMs),
    "--hold-max-ms",
    String(settings.holdMaxMs),
  ];
  const [program, programArgs] =
    lang === "ts"
      ? [process.execPath, ["--import", "tsx", join(CHAOS_DIR, "clients", "ts-client.ts"), ...args]]
      : lang === "go"
        ? [settings.goBinary, args]
        : [PYTHON, [join(CHAOS_DIR, "clients", "python_client.py"), ...args]];
  const env: NodeJS.ProcessEnv = { ...process.env, PYTHONUNBUFFERED: "1" };
  for (const key of Object.keys(env)) if (key.startsWith("CASQ_") || key.startsWith("OTEL_")) delete env[key];
  const child = spawn(program, programArgs as string[], {
    cwd: ROOT,
    stdio: ["ignore", "pipe", "pipe"],
    env,
  });
  let output = "";
  const keep = (chunk: Buffer) => {
    output = (output + chunk.toString("utf8")).slice(-8000);
  };
  child.stdout?.on("data", keep);
  child.stderr?.on("data", keep);
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  const killOnExit = () => child.kill("SIGKILL");
  process.once("exit", killOnExit);
  void exited.then(() => process.removeListener("exit", killOnExit));
  return { name, lang, role, history, child, exited, output: () => output };
}

/** Sends SIGTERM and waits up to `timeoutMs` for a clean exit, then SIGKILLs. Returns the exit code. */
export async function stopClient(client: ClientProcess, timeoutMs: number): Promise<number | null> {
  if (client.child.exitCode !== null || client.child.signalCode !== null) return client.child.exitCode;
  client.child.kill("SIGTERM");
  const timer = setTimeout(() => client.child.kill("SIGKILL"), timeoutMs);
  const code = await client.exited;
  clearTimeout(timer);
  return code;
}
