/**
 * The run's trace: one line per event (an acknowledged result, a failure, a
 * nemesis action, a committed version), folded into a SHA-256 hash. Two runs
 * of one seed must produce the same hash — that is the determinism check.
 * The last lines are kept to print with a failure, and `CASQ_SIM_TRACE=1`
 * keeps them all.
 */
import { createHash, type Hash } from "node:crypto";

/** Collects trace lines and their running hash. */
export class Trace {
  private readonly hash: Hash = createHash("sha256");
  private readonly tail: string[] = [];
  private count = 0;

  constructor(
    private readonly now: () => number,
    private readonly keep = 200,
  ) {}

  /** Appends one event (the current virtual time is prefixed). */
  add(line: string): void {
    const entry = `${this.now()} ${line}`;
    this.hash.update(entry);
    this.hash.update("\n");
    this.count += 1;
    this.tail.push(entry);
    if (this.tail.length > this.keep) this.tail.shift();
  }

  /** Number of events so far. */
  get length(): number {
    return this.count;
  }

  /** The last kept lines, oldest first. */
  lastLines(): readonly string[] {
    return this.tail;
  }

  /** The hash of every line so far, hex. Call once, at the end. */
  digest(): string {
    return this.hash.digest("hex");
  }
}
