/**
 * A client under test: one process of an SDK's scenario client
 * (test/scenario-interpreter/clients), spoken to over its stdin and stdout,
 * one JSON request and one JSON response a line (protocol in
 * test/scenario-interpreter/README.md).
 */
import type { ChildProcess } from "node:child_process";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { ROOT, run } from "../e2e/support/processes.ts";

/** An SDK language. */
export type Lang = "ts" | "go" | "python";

/** The languages whose SDK the interpreter drives. */
export const LANGS: readonly Lang[] = ["ts", "go", "python"];

const CLIENTS = join(ROOT, "test", "scenario-interpreter", "clients");

/** How to start each language's client; the Go one is built first (see {@link buildClients}). */
let goBinary: string | undefined;

/**
 * Builds what the clients need before they start: the Go client, with the
 * race detector as `go test -race` ran the Go SDK's scenarios before.
 */
export async function buildClients(dir: string): Promise<void> {
  const binary = join(dir, "scenario-go-client");
  const built = await run("go", ["build", "-race", "-o", binary, "."], {
    cwd: join(CLIENTS, "go-client"),
    timeoutMs: 300_000,
  });
  if (built.code !== 0) throw new Error(`go build of the scenario Go client failed:\n${built.stderr}`);
  goBinary = binary;
}

function command(lang: Lang, config: string): [string, string[]] {
  switch (lang) {
    case "ts":
      return [process.execPath, ["--import", "tsx", join(CLIENTS, "ts-client.ts"), config]];
    case "python":
      return [
        join(ROOT, ".venv", "bin", "python"),
        [join(ROOT, "sdk", "python", "tests", "scenario_client.py"), config],
      ];
    case "go":
      if (!goBinary) throw new Error("buildClients first");
      return [goBinary, [config]];
  }
}

/** A running client under test. */
export class ClientUnderTest {
  readonly child: ChildProcess;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  private nextId = 1;
  private stderr = "";
  private exitedWith: string | undefined;
  /** Resolves once the process exited. */
  readonly exited: Promise<void>;

  constructor(
    readonly lang: Lang,
    brokers: readonly string[],
  ) {
    const [program, args] = command(lang, JSON.stringify({ brokers }));
    this.child = spawn(program, args, {
      cwd: ROOT,
      stdio: ["pipe", "pipe", "pipe"],
      env: { ...process.env, PYTHONPATH: join(ROOT, "sdk", "python", "src") },
    });
    this.child.stderr?.on("data", (chunk: Buffer) => {
      this.stderr = (this.stderr + chunk.toString("utf8")).slice(-20_000);
    });
    createInterface({ input: this.child.stdout as NodeJS.ReadableStream }).on("line", (line) => {
      let response: { id: number; result?: unknown; error?: string };
      try {
        response = JSON.parse(line) as typeof response;
      } catch {
        this.stderr += `\n(stdout) ${line}`;
        return;
      }
      const waiter = this.pending.get(response.id);
      if (!waiter) return;
      this.pending.delete(response.id);
      if (response.error !== undefined) waiter.reject(new Error(`${lang} client: ${response.error}`));
      else waiter.resolve(response.result);
    });
    this.exited = new Promise((resolve) => {
      this.child.once("exit", (code, signal) => {
        this.exitedWith = `exited with code ${code}, signal ${signal}`;
        for (const waiter of this.pending.values())
          waiter.reject(new Error(`${lang} client ${this.exitedWith}; stderr:\n${this.stderr}`));
        this.pending.clear();
        resolve();
      });
    });
  }

  /** Sends one request and waits for its answer; rejects with the client's error. */
  call<T = Record<string, unknown>>(op: string, args: Record<string, unknown> = {}): Promise<T> {
    if (this.exitedWith) return Promise.reject(new Error(`${this.lang} client ${this.exitedWith}`));
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.child.stdin?.write(`${JSON.stringify({ id, op, ...args })}\n`);
    });
  }

  /** What the client printed on stderr (the last 20 KB), for failure messages. */
  output(): string {
    return this.stderr;
  }

  /** Ends the client: closes its stdin, then SIGKILLs it if it has not exited in `graceMs`. */
  async close(graceMs = 5_000): Promise<void> {
    if (this.exitedWith) return;
    this.child.stdin?.end();
    const timer = setTimeout(() => this.child.kill("SIGKILL"), graceMs);
    await this.exited;
    clearTimeout(timer);
  }
}
