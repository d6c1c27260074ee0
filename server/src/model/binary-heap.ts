/**
 * A plain array-backed binary min-heap.
 *
 * The shard model indexes runnable messages, future wake-ups, lease
 * deadlines, dedup expiries and retention drops with heaps and *lazy
 * deletion*: an entry is never removed from the middle of a heap; instead,
 * whoever pops it checks it against the current state and drops it when it
 * is stale. That keeps every operation O(log n) without back-pointers.
 *
 * Every comparator used by the model is a total order on live entries, so
 * the pop order does not depend on insertion history: a state rebuilt from
 * its document behaves exactly like the one it was written from.
 */

/** A binary heap ordered by `before(a, b)` ("a comes out first"). */
export class BinaryHeap<T> {
  readonly #items: T[] = [];
  readonly #before: (a: T, b: T) => boolean;

  /** Creates an empty heap; `before(a, b)` must be a strict weak order. */
  constructor(before: (a: T, b: T) => boolean) {
    this.#before = before;
  }

  /** Number of entries, stale ones included. */
  get size(): number {
    return this.#items.length;
  }

  /** Adds an entry. O(log n). */
  push(item: T): void {
    const items = this.#items;
    items.push(item);
    let i = items.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      const p = items[parent] as T;
      if (!this.#before(item, p)) break;
      items[i] = p;
      i = parent;
    }
    items[i] = item;
  }

  /** The first entry, without removing it. O(1). */
  peek(): T | undefined {
    return this.#items[0];
  }

  /** Removes and returns the first entry. O(log n). */
  pop(): T | undefined {
    const items = this.#items;
    const top = items[0];
    const last = items.pop();
    if (items.length === 0 || last === undefined) return top;
    const n = items.length;
    let i = 0;
    for (;;) {
      const left = 2 * i + 1;
      if (left >= n) break;
      const right = left + 1;
      let child = left;
      if (right < n && this.#before(items[right] as T, items[left] as T)) child = right;
      const c = items[child] as T;
      if (!this.#before(c, last)) break;
      items[i] = c;
      i = child;
    }
    items[i] = last;
    return top;
  }

  /** Removes every entry. */
  clear(): void {
    this.#items.length = 0;
  }

  /**
   * The entries for which `within` holds, in no particular order, where
   * `within` is monotone in the heap's order (it holds for an entry's
   * parent whenever it holds for the entry, e.g. "deadline <= t" in a heap
   * of deadlines): O(k) for k such entries.
   */
  leading(within: (item: T) => boolean): T[] {
    const items = this.#items;
    const out: T[] = [];
    const stack = items.length > 0 ? [0] : [];
    for (let i = stack.pop(); i !== undefined; i = stack.pop()) {
      const item = items[i] as T;
      if (!within(item)) continue;
      out.push(item);
      if (2 * i + 1 < items.length) stack.push(2 * i + 1);
      if (2 * i + 2 < items.length) stack.push(2 * i + 2);
    }
    return out;
  }

  /**
   * Keeps only the entries for which `keep` holds (drops stale ones in bulk).
   * O(n): filters, then restores the heap order bottom-up.
   */
  retain(keep: (item: T) => boolean): void {
    const items = this.#items;
    let n = 0;
    for (const item of items) if (keep(item)) items[n++] = item;
    items.length = n;
    for (let i = (n >> 1) - 1; i >= 0; i--) {
      const item = items[i] as T;
      let at = i;
      for (;;) {
        const left = 2 * at + 1;
        if (left >= n) break;
        const right = left + 1;
        let child = left;
        if (right < n && this.#before(items[right] as T, items[left] as T)) child = right;
        const c = items[child] as T;
        if (!this.#before(c, item)) break;
        items[at] = c;
        at = child;
      }
      items[at] = item;
    }
  }

  /** All entries in no particular order (for tests and diagnostics). */
  toArray(): T[] {
    return [...this.#items];
  }
}
