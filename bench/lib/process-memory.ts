/**
 * Resident memory of another process (a server under test), from
 * `/proc/<pid>/status` (Linux): `VmRSS`, what it holds now, and `VmHWM`, the
 * most it has held since it started.
 */
import { readFileSync } from "node:fs";

/** Resident memory of one process, MiB. */
export interface ProcessMemory {
  /** Resident now (VmRSS). */
  readonly rssMiB: number;
  /** Peak resident since the process started (VmHWM). */
  readonly peakMiB: number;
}

/**
 * The highest peak read so far per process. Linux reports VmHWM as the larger
 * of its recorded peak and the current RSS, and the current RSS comes from
 * per-thread counters synced lazily, so a later read can show a peak a few
 * hundred KiB lower than an earlier one; a peak must never go down.
 */
const peaksSeen = new Map<number, number>();

/** Memory of `pid`; zeros where `/proc` cannot be read (not Linux, process gone). */
export function processMemory(pid: number): ProcessMemory {
  try {
    const status = readFileSync(`/proc/${pid}/status`, "utf8");
    const kib = (field: string) => Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(status)?.[1] ?? 0);
    const peakMiB = Math.max(kib("VmHWM") / 1024, peaksSeen.get(pid) ?? 0);
    peaksSeen.set(pid, peakMiB);
    return { rssMiB: kib("VmRSS") / 1024, peakMiB };
  } catch {
    return { rssMiB: 0, peakMiB: 0 };
  }
}
