/**
 * Seeded randomness for the simulation, with the handful of distributions
 * the actors need. Every decision of a run (what an actor does next, how
 * long it waits, which fault a link injects) is drawn from a `SimRandom`
 * derived from the run's seed, so one seed always replays the same run.
 *
 * Each component gets its own stream ({@link SimRandom.fork}), so adding a
 * draw to one actor does not shift every other actor's decisions.
 */
import { type Random, seededRandom } from "../../server/src/util/random.ts";

/** A seeded {@link Random} with helpers for the distributions the simulation uses. */
export class SimRandom implements Random {
  private readonly source: Random;

  constructor(seed: number) {
    this.source = seededRandom(seed);
  }

  /** Uniform in [0, 1). */
  next(): number {
    return this.source.next();
  }

  /** True with probability `p`. */
  chance(p: number): boolean {
    return p > 0 && this.next() < p;
  }

  /** Uniform integer in [min, max]. */
  int(min: number, max: number): number {
    return min + Math.floor(this.next() * (max - min + 1));
  }

  /** Uniform real in [min, max). */
  uniform(min: number, max: number): number {
    return min + this.next() * (max - min);
  }

  /** An integer number of ms: `min` plus an exponential tail of mean `mean`, capped at `max`. */
  exp(mean: number, min = 0, max = min + 20 * mean): number {
    return Math.round(Math.min(max, min - Math.log(1 - this.next()) * mean));
  }

  /** One element of a non-empty array. */
  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new Error("pick from an empty array");
    return items[Math.floor(this.next() * items.length)] as T;
  }

  /** Picks a key by relative weight. */
  weighted<K extends string>(weights: Readonly<Record<K, number>>): K {
    const entries = Object.entries(weights) as [K, number][];
    const total = entries.reduce((sum, [, w]) => sum + w, 0);
    let x = this.next() * total;
    for (const [key, w] of entries) {
      x -= w;
      if (x < 0) return key;
    }
    return (entries[entries.length - 1] as [K, number])[0];
  }

  /** An independent stream seeded from this one. */
  fork(): SimRandom {
    return new SimRandom(Math.floor(this.next() * 0x1_0000_0000));
  }
}
