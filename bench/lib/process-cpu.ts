/**
 * CPU time of other processes (the servers under test), read from
 * `/proc/<pid>/stat` (Linux): user + system time of each process, its live
 * descendants (PostgreSQL serves each connection from a child process) and
 * its waited-for children, in seconds.
 */
import { readdirSync, readFileSync } from "node:fs";

/** Clock ticks per second of `/proc/<pid>/stat` times (USER_HZ, 100 on Linux). */
const TICKS_PER_SECOND = 100;

interface ProcStat {
  readonly ppid: number;
  readonly seconds: number;
}

function readStat(pid: number): ProcStat | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // The command name (field 2) is in parentheses and may hold spaces: split after it.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    // After the name: state, ppid, ...; utime, stime, cutime, cstime are fields 11-14.
    const ticks = [11, 12, 13, 14].reduce((sum, i) => sum + Number(fields[i] ?? 0), 0);
    return { ppid: Number(fields[1]), seconds: ticks / TICKS_PER_SECOND };
  } catch {
    return undefined;
  }
}

/** Summed CPU seconds of `pids` and all their live descendants; 0 where nothing can be read (not Linux). */
export function cpuSecondsOf(pids: readonly number[]): number {
  let all: Map<number, ProcStat>;
  try {
    all = new Map();
    for (const name of readdirSync("/proc")) {
      const pid = Number(name);
      if (!Number.isInteger(pid)) continue;
      const stat = readStat(pid);
      if (stat) all.set(pid, stat);
    }
  } catch {
    return 0;
  }
  const roots = new Set(pids);
  const within = (pid: number): boolean => {
    for (let p = pid, hops = 0; p > 1 && hops < 64; hops += 1) {
      if (roots.has(p)) return true;
      p = all.get(p)?.ppid ?? 0;
    }
    return false;
  };
  let seconds = 0;
  for (const [pid, stat] of all) if (within(pid)) seconds += stat.seconds;
  return seconds;
}
