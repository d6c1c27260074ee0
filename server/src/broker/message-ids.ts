/**
 * Message ids: 26-character, time-ordered, collision-resistant (the ULID
 * layout: 48 bits of milliseconds, 80 random bits, Crockford base32). The
 * clock and randomness are injected so that simulations are reproducible.
 */
import type { Clock } from "../util/clock.ts";
import type { Random } from "../util/random.ts";

const ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/** Makes a new id from the current time and 80 random bits. */
export function newMessageId(clock: Clock, random: Random): string {
  let time = Math.max(0, Math.floor(clock.now()));
  let head = "";
  for (let i = 0; i < 10; i++) {
    head = (ALPHABET[time % 32] as string) + head;
    time = Math.floor(time / 32);
  }
  let tail = "";
  for (let i = 0; i < 16; i++) tail += ALPHABET[Math.floor(random.next() * 32)] as string;
  return head + tail;
}
