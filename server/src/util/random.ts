/**
 * Injectable randomness. Engine code takes a {@link Random} so that tests and
 * the simulation can use a seeded generator and replay a run exactly.
 */

/** A source of uniformly distributed numbers in [0, 1). */
export interface Random {
  next(): number;
}

/** `Math.random()`, for production. */
export const systemRandom: Random = { next: () => Math.random() };

/**
 * A small, fast, seeded PRNG (mulberry32). Deterministic for a given seed;
 * not cryptographic.
 */
export function seededRandom(seed: number): Random {
  let state = seed >>> 0;
  return {
    next() {
      state = (state + 0x6d2b79f5) >>> 0;
      let t = state;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    },
  };
}
