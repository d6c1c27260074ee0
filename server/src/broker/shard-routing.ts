/**
 * Which shard a message goes to: `hash(key) % shards` when it has a key (so
 * one key always lands on one shard and per-key order holds), otherwise
 * round-robin. The hash is FNV-1a over the key's UTF-8 bytes: stable across
 * processes, languages and releases — changing it would reorder keys.
 */

/** 32-bit FNV-1a of a string's UTF-8 bytes. */
export function fnv1a(text: string): number {
  let hash = 0x811c9dc5;
  // An ASCII string is its own UTF-8: hash its characters without a copy.
  let ascii = true;
  for (let i = 0; i < text.length && ascii; i++) {
    const c = text.charCodeAt(i);
    if (c >= 0x80) ascii = false;
    else {
      hash ^= c;
      hash = Math.imul(hash, 0x01000193) >>> 0;
    }
  }
  if (ascii) return hash >>> 0;
  hash = 0x811c9dc5;
  for (const byte of Buffer.from(text, "utf8")) {
    hash ^= byte;
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return hash >>> 0;
}

/** The shard for a keyed message. */
export function shardForKey(key: string, shards: number): number {
  return fnv1a(key) % shards;
}
