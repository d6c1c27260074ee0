/**
 * Pages the bodies of one shard's sealed message segments in and out of the
 * broker's page cache (`segment-body-cache.ts`), for the leader of that shard.
 *
 * The shard state holds a sealed message as meta only; the model asks
 * {@link SegmentPager.lookup} for a body and gets one only when its segment
 * is cached. The leader makes that the common case:
 * - **Read-ahead**: after each commit it pages in, in the background, the
 *   segments at the front of each subscription's claim order
 *   ({@link SegmentPager.readAhead}), so claims find their bodies in memory.
 * - **Before a batch**: nacks and lease expiries that may dead-letter a
 *   sealed message need its body synchronously (a dead letter is a whole
 *   copy): the leader pages those in first ({@link SegmentPager.pageIn}).
 * - **After a claim**: a claimed message whose body was paged out carries
 *   the segment's name (`bodyIn`); the leader fills the body in before the
 *   claim leaves it ({@link SegmentPager.fillClaims}).
 *
 * Every read is checked against the size and SHA-256 in the head's index. A
 * referenced segment that is missing or corrupt is `data_loss`, unless the
 * head moved meanwhile (another broker took over and may have retired it):
 * then it is `unavailable`, and the caller's next commit finds out.
 */
import { CasqError } from "../errors.ts";
import type { ClaimedMessage } from "../model/operations.ts";
import { segmentPrefix } from "../model/segment-codec.ts";
import type { BodyLookup } from "../model/shard-data.ts";
import type { MessageRecord, SegmentState } from "../model/shard-records.ts";
import type { ObjectStore } from "../store/object-store.ts";
import { findRecord, type SegmentBodyCache } from "./segment-body-cache.ts";
import { readMessageSegment } from "./segment-loader.ts";

/** Segments read at once by one pager. */
const READ_PARALLELISM = 4;

/** Read-ahead stops once this many bytes of segments are cached ahead of the claims (or a quarter of the budget). */
const READ_AHEAD_BYTES = 4 * 1024 * 1024;

/**
 * Segments beyond the read-ahead window walked (after every commit) to find
 * whether the newest is within the cache's budget of a claim front: 128 of
 * the usual 256 KiB fill the default budget; a backlog of more, smaller
 * segments is judged deeper than the budget (and what is written behind it
 * is read back when the claims get there, as before).
 */
const MAX_WALK_BEYOND_WINDOW = 128;

/** Everything a {@link SegmentPager} needs. */
export interface SegmentPagerParams {
  readonly store: ObjectStore;
  readonly queue: string;
  readonly shard: number;
  readonly cache: SegmentBodyCache;
  /** True when the shard's head changed in the store since this broker last read or wrote it. */
  readonly headMoved: () => Promise<boolean>;
}

/** One shard's page-in and read-ahead of segment bodies (see module header). */
export class SegmentPager {
  private readonly store: ObjectStore;
  private readonly queue: string;
  private readonly shard: number;
  private readonly cache: SegmentBodyCache;
  private readonly headMoved: () => Promise<boolean>;
  private readonly prefix: string;
  /** Reads in flight by segment name (a second request for one joins the first). */
  private readonly reading = new Map<string, Promise<readonly MessageRecord[]>>();
  private readingAhead = false;
  /**
   * Whether the last read-ahead walked from some subscription's claim front
   * to the newest sealed segment within the cache's budget: the backlog
   * ahead of a segment written now fits in the cache, so its bodies can wait
   * there until the claims reach it, instead of being read back then. False
   * while the backlog ahead of the claims is deeper than the budget: a
   * segment written then would wait behind more than the cache holds, and
   * caching its bodies would only take the room the read-ahead needs (at a
   * 1M backlog, the whole budget).
   */
  private claimsNearNewest = true;
  /** Segments paged in for the batch being applied, kept whatever the cache evicts meanwhile. */
  private readonly pinned = new Map<string, readonly MessageRecord[]>();

  constructor(params: SegmentPagerParams) {
    this.store = params.store;
    this.queue = params.queue;
    this.shard = params.shard;
    this.cache = params.cache;
    this.headMoved = params.headMoved;
    this.prefix = segmentPrefix(params.queue, params.shard);
  }

  /** The model's view of the cache: a sealed message's whole record when its segment is paged in. */
  readonly lookup: BodyLookup = (segment, offset) => {
    const pinned = this.pinned.get(segment);
    return pinned !== undefined ? findRecord(pinned, offset) : this.cache.get(this.prefix + segment, offset);
  };

  /** True when the segment's bodies are in memory. */
  resident(name: string): boolean {
    return this.pinned.has(name) || this.cache.has(this.prefix + name);
  }

  /** Releases the segments pinned by {@link pageIn} (the batch they were for is done). */
  unpin(): void {
    this.pinned.clear();
  }

  /** Offers the records of a segment read at load: cached only if that evicts nothing. */
  offer(name: string, records: readonly MessageRecord[], bytes: number): void {
    this.cache.put(this.prefix + name, records, bytes, true);
  }

  /**
   * Offers the records of a segment just written: cached only when the
   * backlog ahead of it fits in the cache (see {@link claimsNearNewest}) and
   * that evicts nothing. Not cached, it costs one GET (and a parse) when the
   * claims reach it.
   */
  offerWritten(name: string, records: readonly MessageRecord[], bytes: number): void {
    if (this.claimsNearNewest) this.offer(name, records, bytes);
  }

  /** Forgets a segment (retired, or no longer referenced). */
  forget(name: string): void {
    this.cache.delete(this.prefix + name);
  }

  /**
   * Pages in `segments` (those not cached yet) and returns each one's
   * records by name; with `pin`, {@link lookup} finds them until
   * {@link unpin}, whatever the cache evicts. Rejects with `unavailable` when
   * the store fails, with `data_loss` when a segment the current head
   * references is missing or corrupt.
   */
  async pageIn(
    segments: Iterable<SegmentState>,
    options: { pin?: boolean } = {},
  ): Promise<Map<string, readonly MessageRecord[]>> {
    const out = new Map<string, readonly MessageRecord[]>();
    const wanted = [...new Set(segments)];
    for (let i = 0; i < wanted.length; i += READ_PARALLELISM) {
      const chunk = wanted.slice(i, i + READ_PARALLELISM);
      const read = await Promise.all(chunk.map((seg) => this.read(seg)));
      chunk.forEach((seg, j) => {
        const records = read[j] as readonly MessageRecord[];
        out.set(seg.name, records);
        if (options.pin === true) this.pinned.set(seg.name, records);
      });
    }
    return out;
  }

  /**
   * Fills in the bodies of claimed messages that name a segment (`bodyIn`),
   * in place; afterwards none does. Rejects like {@link pageIn}.
   */
  async fillClaims(messages: ClaimedMessage[], segments: ReadonlyMap<string, SegmentState>): Promise<void> {
    const wanted = new Set<SegmentState>();
    for (const c of messages) {
      if (c.bodyIn === undefined) continue;
      const seg = segments.get(c.bodyIn);
      if (seg === undefined) throw this.lostSegment(c.bodyIn, c.offset);
      wanted.add(seg);
    }
    if (wanted.size === 0) return;
    const pages = await this.pageIn(wanted);
    messages.forEach((c, i) => {
      if (c.bodyIn === undefined) return;
      const whole = findRecord(pages.get(c.bodyIn), c.offset);
      if (whole === undefined) throw this.lostSegment(c.bodyIn, c.offset);
      messages[i] = {
        ...c,
        payload: whole.payload,
        headers: whole.headers,
        traceContext: whole.traceContext,
        bodyIn: undefined,
      };
    });
  }

  /**
   * Pages in, in the background, the segments from `front` on (in offset
   * order, as `next` gives them) until {@link READ_AHEAD_BYTES} (or a
   * quarter of the cache) of them are cached. One read-ahead runs at a
   * time; failures are left to the page-in that will need the segment.
   * Also notes, for {@link offerWritten}, whether the claims are near the
   * newest segment: the segments from some front to the newest fit in the
   * cache's budget, or `caughtUp` says some subscription's next claim is not
   * in a sealed segment at all (the head's tail, or nothing runnable); an
   * empty `front` is caught up too.
   */
  readAhead(
    front: readonly SegmentState[],
    next: (seg: SegmentState) => SegmentState | undefined,
    caughtUp = false,
  ): void {
    if (this.readingAhead) return;
    let near = caughtUp || front.length === 0;
    const limit = Math.min(READ_AHEAD_BYTES, this.cache.budgetBytes / 4);
    const plan: SegmentState[] = [];
    const seen = new Set<SegmentState>();
    for (const start of front) {
      let bytes = 0;
      let beyond = 0;
      let seg: SegmentState | undefined = start;
      // The window is read ahead; beyond it the walk only looks for the newest segment, within the budget.
      for (; seg !== undefined && bytes < this.cache.budgetBytes; seg = next(seg)) {
        const inWindow = bytes < limit;
        bytes += seg.bytes;
        if (!inWindow) {
          if (near || ++beyond > MAX_WALK_BEYOND_WINDOW) break;
          continue;
        }
        // Planned by an earlier front: walked on (unless that is known) only to see how far this one reaches.
        if (seen.has(seg)) {
          if (near) break;
          continue;
        }
        seen.add(seg);
        if (!this.resident(seg.name)) plan.push(seg);
      }
      if (seg === undefined) near = true; // walked past the newest segment within the budget
    }
    this.claimsNearNewest = near;
    if (plan.length === 0) return;
    this.readingAhead = true;
    void this.pageIn(plan)
      .catch(() => {})
      .finally(() => {
        this.readingAhead = false;
      });
  }

  private async read(seg: SegmentState): Promise<readonly MessageRecord[]> {
    const cached = this.cache.records(this.prefix + seg.name);
    if (cached !== undefined) return cached;
    let pending = this.reading.get(seg.name);
    if (pending === undefined) {
      pending = this.load(seg).finally(() => this.reading.delete(seg.name));
      this.reading.set(seg.name, pending);
    }
    return pending;
  }

  private async load(seg: SegmentState): Promise<readonly MessageRecord[]> {
    const read = await readMessageSegment(this.store, this.queue, this.shard, seg);
    if ("problem" in read) {
      if (await this.headMoved().catch(() => true))
        throw new CasqError(
          "unavailable",
          `shard ${this.queue}/${this.shard}: segment ${seg.name} ${read.problem} and the shard's head changed meanwhile (another broker took over?); retry`,
          { queue: this.queue, shard: this.shard },
        );
      throw new CasqError(
        "data_loss",
        `segment ${this.prefix}${seg.name}, referenced by the shard's head, ${read.problem}; refusing to load or overwrite the shard — restore the segment from a backup`,
        { queue: this.queue, shard: this.shard },
      );
    }
    this.cache.put(this.prefix + seg.name, read.records, read.bytes);
    return read.records;
  }

  private lostSegment(name: string, offset: number): CasqError {
    return new CasqError(
      "internal",
      `shard ${this.queue}/${this.shard}: message ${offset} was claimed from segment ${name}, which the shard no longer indexes`,
      { queue: this.queue, shard: this.shard },
    );
  }
}
