/**
 * The command README.md gives for starting a broker starts the broker itself,
 * as the process the user (or a supervisor) started: SIGTERM to that pid stops
 * the broker gracefully, and afterwards nothing listens on its port and no
 * process is left holding its store. (`npx casq serve` fails this: npm exec
 * and `sh -c` sit in between, do not pass SIGTERM on, and leave the broker
 * orphaned and listening.)
 */
import { readdirSync, readFileSync } from "node:fs";
import { connect } from "node:net";
import { join } from "node:path";
import { afterAll, expect, test } from "vitest";
import { outsideDir, ROOT, type StartedBroker, startBroker, within } from "./support.ts";

/** The distinct command prefixes README.md's shell blocks use to run `casq serve` (e.g. `node_modules/.bin/casq`). */
function readmeServeCommands(): string[][] {
  const readme = readFileSync(join(ROOT, "README.md"), "utf8");
  const commands = new Set<string>();
  const codeBlocks = [...readme.matchAll(/^```(?:sh|bash|shell)?\n([\s\S]*?)^```/gm)].map((m) => m[1] ?? "");
  for (const line of codeBlocks.join("\n").split("\n")) {
    const match = /^(?:\$ )?(?:npm ci && )?((?:npx |npm exec |node )?\S*casq\S*) serve\b/.exec(line.trim());
    if (match?.[1] !== undefined) commands.add(match[1]);
  }
  return [...commands].map((c) => c.split(" "));
}

/** Pids whose command line mentions `text`. */
function processesMentioning(text: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readFileSync(`/proc/${entry}/cmdline`, "utf8").includes(text)) pids.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}

function accepts(address: string): Promise<boolean> {
  const [host, port] = [
    address.slice(0, address.lastIndexOf(":")),
    Number(address.slice(address.lastIndexOf(":") + 1)),
  ];
  return new Promise((resolve) => {
    const socket = connect({ host, port });
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

const stores: { remove: () => void }[] = [];
afterAll(() => {
  for (const store of stores) store.remove();
});

/**
 * Starts `command serve` on a fresh store, runs `beforeSignal` (if any), sends
 * SIGTERM and waits for the exit. Without `beforeSignal` the signal goes out in
 * the same turn as the "listening on" line is read.
 */
async function serveUntilSigterm(
  command: string[],
  beforeSignal?: (broker: StartedBroker) => Promise<void>,
): Promise<{ broker: StartedBroker; exit: number | string | null; storePath: string }> {
  const store = outsideDir("signals-store");
  stores.push(store);
  const broker = await startBroker([
    ...command,
    "serve",
    "--store",
    `file:${store.path}`,
    "--listen",
    "127.0.0.1:0",
  ]);
  if (beforeSignal !== undefined) await beforeSignal(broker);
  broker.child.kill("SIGTERM");
  const exit = await within(`${command.join(" ")} to exit on SIGTERM`, broker.exited, 30_000);
  return { broker, exit, storePath: store.path };
}

test("README's casq serve command is the broker: SIGTERM to it stops the broker, nothing is left listening", async () => {
  const commands = readmeServeCommands();
  expect(commands.length).toBeGreaterThan(0);
  for (const command of commands) {
    const { broker, exit, storePath } = await serveUntilSigterm(command, async (started) => {
      expect(await accepts(started.address)).toBe(true);
    });
    const left = processesMentioning(storePath);
    for (const pid of left) process.kill(pid, "SIGKILL"); // no orphan stays behind when this fails
    expect(left, `${command.join(" ")} left processes behind`).toEqual([]);
    expect(exit).toBe(0);
    expect(broker.output()).toContain("casq serve: stopped");
    expect(await accepts(broker.address)).toBe(false);
  }
}, 120_000);

test("SIGTERM the moment casq serve says it is listening (as a supervisor may) still stops it gracefully", async () => {
  // A handler installed only after the line was printed would be too late here.
  const [command] = readmeServeCommands();
  if (command === undefined) throw new Error("README has no casq serve command");
  for (let round = 0; round < 3; round++) {
    const { broker, exit } = await serveUntilSigterm(command);
    expect(exit, broker.output()).toBe(0);
    expect(broker.output()).toContain("casq serve: stopped");
  }
}, 120_000);
