/**
 * Message ids: 26-character, time-ordered, collision-resistant (the ULID
 * layout: 48 bits of milliseconds, 80 random bits, Crockford base32). The
 * clock and randomness are injected so that simulations are reproducible.
 */
import type { Clock } from "../util/clock.ts";
import type { Random } from "../util/random.ts";

const ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
const CODES = Array.from(ALPHABET, (c) => c.charCodeAt(0));

/** Character codes of the id being made (reused: one string per id, not one per character). */
const digits = new Array<number>(26).fill(0);

/** Makes a new id from the current time and 80 random bits. */
export function newMessageId(clock: Clock, random: Random): string {
  let time = Math.max(0, Math.floor(clock.now()));
  for (let i = 9; i >= 0; i--) {
    digits[i] = CODES[time % 32] as number;
    time = Math.floor(time / 32);
  }
  for (let i = 10; i < 26; i++) digits[i] = CODES[Math.floor(random.next() * 32)] as number;
  return String.fromCharCode(...digits);
}
