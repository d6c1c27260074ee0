/**
 * Who owns the file store's internal files, and whether that owner is still
 * alive. Lock markers, lock staging directories and temp files are named after
 * the process that made them (`<pid>.<start>.<host id>.<nonce>`), so a later
 * process can tell a dead writer's leftovers from a live one's: on this
 * machine by its pid and start time, elsewhere only by age.
 */
import { createHash } from "node:crypto";
import { readFileSync, readlinkSync } from "node:fs";
import { readFile, stat } from "node:fs/promises";
import { hostname } from "node:os";
import { errnoCode } from "./fs-errors.ts";
import { randomHex } from "./random-hex.ts";

const OWNER_RE = /^(\d+)\.(\d+)\.([0-9a-f]{12})\.[0-9a-f]{16}$/;
/** Temp files and staging dirs whose owner cannot be checked are removed after this long. */
export const ORPHAN_MAX_AGE_MS = 60 * 60 * 1000;

interface ProcStat {
  readonly state: string;
  readonly start: string;
}

function parseProcStat(text: string): ProcStat | undefined {
  const close = text.lastIndexOf(")");
  if (close < 0) return undefined;
  const fields = text
    .slice(close + 2)
    .trim()
    .split(/\s+/);
  const state = fields[0];
  const start = fields[19];
  return state !== undefined && start !== undefined && /^\d+$/.test(start) ? { state, start } : undefined;
}

function readQuietly(read: () => string): string {
  try {
    return read();
  } catch {
    return "";
  }
}

const selfStat = parseProcStat(readQuietly(() => readFileSync("/proc/self/stat", "utf8")));
/** True where `/proc/<pid>/stat` tells whether a pid is alive and when it started (Linux). */
const procSupported = selfStat !== undefined;

/**
 * This process, as written into lock markers and temp file names:
 * `<pid>.<start time in clock ticks since boot, or 0>.<host id>`, where the
 * host id hashes hostname, boot id and pid namespace, so that "same host id"
 * means "a pid in the name can be checked from here".
 */
const SELF = (() => {
  const host = createHash("sha256")
    .update(hostname())
    .update("\0")
    .update(readQuietly(() => readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim()))
    .update("\0")
    .update(readQuietly(() => readlinkSync("/proc/self/ns/pid")))
    .digest("hex")
    .slice(0, 12);
  const start = selfStat?.start ?? "0";
  return { pid: process.pid, start, host, token: `${process.pid}.${start}.${host}` };
})();

/**
 * This process's owner token, `<pid>.<start>.<host id>`, as it appears at the
 * start of lock markers (`~casq/locks/<sha256(key)>/<token>.<nonce>`) and
 * temp file names (`<name>~tmp~<token>.<nonce>`). For operator tooling and
 * tests that need to recognise (or fabricate) a given process's leftovers.
 */
export function fileStoreOwnerToken(): string {
  return SELF.token;
}

type Liveness = "alive" | "dead" | "unknown";

async function ownerLiveness(ownerName: string): Promise<Liveness> {
  const match = OWNER_RE.exec(ownerName);
  if (!match) return "unknown";
  const [, pidText = "", start = "", host = ""] = match;
  if (host !== SELF.host) return "unknown";
  const pid = Number(pidText);
  if (pid === SELF.pid) return start === SELF.start ? "alive" : "dead";
  if (procSupported) {
    let text: string;
    try {
      text = await readFile(`/proc/${pid}/stat`, "utf8");
    } catch (error) {
      if (errnoCode(error) === "ENOENT" || errnoCode(error) === "ESRCH") return "dead";
      return "unknown";
    }
    const procStat = parseProcStat(text);
    if (!procStat) return "unknown";
    if (procStat.state === "Z" || procStat.state === "X") return "dead";
    if (start !== "0" && procStat.start !== start) return "dead";
    return "alive";
  }
  try {
    process.kill(pid, 0);
    return "alive";
  } catch (error) {
    return errnoCode(error) === "ESRCH" ? "dead" : "alive";
  }
}

/** True when the owner of an internal file is dead, or unknown and silent for longer than `maxAgeMs`. */
export async function isAbandoned(ownerName: string, filePath: string, maxAgeMs: number): Promise<boolean> {
  const liveness = await ownerLiveness(ownerName);
  if (liveness !== "unknown") return liveness === "dead";
  try {
    const info = await stat(filePath);
    return Date.now() - info.mtimeMs > maxAgeMs;
  } catch {
    return false;
  }
}

/** A fresh owner name for a new internal file: this process's token and 64 random bits. */
export function newOwnerName(): string {
  return `${SELF.token}.${randomHex(8)}`;
}
