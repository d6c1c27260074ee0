/**
 * The credit window of one Work stream: how many jobs the stream may have
 * held by the worker plus granted to the broker and not yet used, and how
 * that number adapts.
 *
 * The broker claims at most the stream's credit per commit, so with a fixed
 * window of `concurrency` a worker whose handlers are fast waits a whole
 * commit (100 ms and more on S3) for every `concurrency` jobs. A window that
 * holds what the handlers drain in one round trip (rate × round trip, the
 * bandwidth-delay product) keeps them busy. Nobody knows that product in
 * advance, so the window measures it, in epochs of one window's worth of
 * arrivals:
 *
 * - **grow** (doubles, up to `max`) when, within the epoch, the handlers sat
 *   idle with nothing buffered (starved) while the broker had used most of
 *   the credit (the lowest outstanding credit seen at an arrival was at most
 *   half the window): the credit, not the queue, was what they waited for.
 *   Up to `growFreelyTo` that is all, and it quadruples when the broker used
 *   every credit it had (an epoch takes a commit or two, 100 ms each on a
 *   slow store: the window gets there in half the epochs); past it the
 *   window also must hold fewer jobs than arrive in {@link ROUND_TRIPS_HELD}
 *   commit intervals at the epoch's rate. Jobs come in one burst per commit, so the longest
 *   pause between two arrivals in an epoch is about one commit interval (the
 *   shortest of the last {@link GAP_EPOCHS} epochs' is taken, so one GC
 *   pause does not count). A broker that is busy, not far away, sends no
 *   more jobs for more credit, while every job it has claimed and not seen
 *   settled is a lease its head carries in every write: on a local disk
 *   (commits every few ms) 20 × the handlers keep them busy, at 100 ms a
 *   write it takes thousands;
 * - **shrink** by half the smallest buffer seen when the buffer never emptied
 *   within the epoch (a standing queue: the extra jobs only wait, holding
 *   leases other workers could use);
 * - **decay** a quarter of the way back to `min` when the handlers were starved
 *   but the broker sat on more than three quarters of the credit all epoch
 *   (nothing runnable: a big window would only let this worker grab the next
 *   burst from the others).
 *
 * On a queue that trickles (jobs come one by one, handlers mostly idle) the
 * broker's credit swings between half the window and all of it (see the
 * grants below), so the window may creep up towards `max`: that credit is a
 * standing claim at the broker, and `max` bounds what one worker can grab
 * of a sudden burst.
 *
 * Grants are held back while they would be smaller than the credit the
 * broker still has (it can send that many jobs meanwhile). The broker claims
 * with the credit it has when its previous claim lands, and credit arriving
 * during a commit waits for the next one; credit given back in small pieces
 * as handlers finish would split the window into groups that take turns,
 * each commit carrying a part (TCP's silly window syndrome). A grant at
 * least as large as the broker's remaining credit merges them again.
 *
 * `min === max` is a fixed window (the `prefetch` option). The broker never
 * lets outstanding credit pass `maxOutstanding` (`Opened.max_credits`), so a
 * window above that is granted as jobs arrive.
 */

/** Bounds of a {@link CreditWindow}. */
export interface CreditWindowOptions {
  /** Size at open, within [min, max]. */
  readonly initial: number;
  /** Smallest size (at least 1). */
  readonly min: number;
  /** Largest size. */
  readonly max: number;
  /** Most credit the broker lets a stream have outstanding. */
  readonly maxOutstanding: number;
  /** Growth up to this size needs no timing (default `max`); past it, see {@link ROUND_TRIPS_HELD}. */
  readonly growFreelyTo?: number;
  /** The clock (ms) that times arrivals; without one the window never grows past `growFreelyTo`. */
  readonly now?: () => number;
}

/** Past `growFreelyTo`, the window grows only while it holds fewer jobs than arrive in this many settle round trips. */
export const ROUND_TRIPS_HELD = 4;
/** Epochs whose longest pause between arrivals (about a commit interval) are remembered. */
export const GAP_EPOCHS = 3;

/** The adaptive credit window of one stream (see the module header). */
export class CreditWindow {
  /** Jobs this stream may have held plus outstanding now. */
  size: number;
  /** Held jobs whose credit goes back to this stream (not back yet). */
  held = 0;
  /** Credit granted (or about to be) and not yet used by a job. */
  outstanding = 0;
  readonly min: number;
  readonly max: number;
  /** Most credit the broker lets this stream have outstanding (`Opened.max_credits` once open). */
  maxOutstanding: number;
  private readonly now: (() => number) | undefined;
  private readonly growFreelyTo: number;
  // The current epoch.
  private arrivals = 0;
  private lowOutstanding = Number.POSITIVE_INFINITY;
  private lowBuffered = Number.POSITIVE_INFINITY;
  private starved = false;
  private epochStart = 0;
  /** Longest pause between two arrivals this epoch, and the shortest such pause of the last epochs. */
  private lastArrivalAt: number | undefined;
  private longestGap = 0;
  private readonly recentGaps: number[] = [];

  /** A window of `options.initial`, kept within [min, max]. */
  constructor(options: CreditWindowOptions) {
    this.min = Math.max(1, options.min);
    this.max = Math.max(this.min, options.max);
    this.size = Math.min(this.max, Math.max(this.min, options.initial));
    this.maxOutstanding = options.maxOutstanding;
    this.now = options.now;
    this.growFreelyTo = Math.min(this.max, options.growFreelyTo ?? this.max);
    this.epochStart = this.now?.() ?? 0;
  }

  /** True when the size never changes. */
  get fixed(): boolean {
    return this.min === this.max;
  }

  /** Takes over the credit of `n` held jobs of an ended stream (they count as held here). */
  adopt(n: number): void {
    this.held += n;
  }

  /** True when {@link takeGrant} would grant something. */
  get canGrant(): boolean {
    return this.grantable() > 0;
  }

  /**
   * The credit to grant now, counted as outstanding (the caller sends it):
   * the window less what is held and outstanding, within `maxOutstanding`;
   * nothing while that is less than the credit the broker still has (see
   * the module header: grants that at least double the broker's credit).
   */
  takeGrant(): number {
    const n = this.grantable();
    this.outstanding += n;
    return n;
  }

  private grantable(): number {
    const n = Math.min(this.size - this.held - this.outstanding, this.maxOutstanding - this.outstanding);
    return n > 0 && n >= this.outstanding ? n : 0;
  }

  /** A job arrived on the stream: it used one credit and is held. */
  arrived(): void {
    if (this.now !== undefined) {
      const at = this.now();
      if (this.lastArrivalAt !== undefined)
        this.longestGap = Math.max(this.longestGap, at - this.lastArrivalAt);
      this.lastArrivalAt = at;
    }
    this.outstanding = Math.max(0, this.outstanding - 1);
    this.held++;
    this.lowOutstanding = Math.min(this.lowOutstanding, this.outstanding);
    if (++this.arrivals >= this.size) this.endEpoch();
  }

  /** A held job's credit came back (its handler finished, or it was dropped). */
  returned(): void {
    this.held = Math.max(0, this.held - 1);
  }

  /** The handlers sat idle with nothing buffered. */
  noteStarved(): void {
    this.starved = true;
  }

  /** A handler started with `buffered` jobs still waiting behind it. */
  noteStarted(buffered: number): void {
    this.lowBuffered = Math.min(this.lowBuffered, buffered);
  }

  /** The jobs that arrive in {@link ROUND_TRIPS_HELD} commit intervals at this epoch's rate (0: unknown). */
  private jobsPerRoundTrips(now: number): number {
    // Unknown without a clock, before enough epochs, or when the clock went back (it may be wall time).
    if (this.now === undefined || this.recentGaps.length < GAP_EPOCHS || now < this.epochStart) return 0;
    const perMs = this.arrivals / Math.max(1, now - this.epochStart);
    return ROUND_TRIPS_HELD * perMs * Math.min(...this.recentGaps);
  }

  private endEpoch(): void {
    const now = this.now?.() ?? 0;
    this.recentGaps.push(this.longestGap);
    if (this.recentGaps.length > GAP_EPOCHS) this.recentGaps.shift();
    this.longestGap = 0;
    if (!this.fixed) {
      if (this.starved && this.lowOutstanding * 2 <= this.size) {
        // The broker took every credit it had: quadruple (a slow store's window is far off).
        const step = this.lowOutstanding === 0 ? 4 : 2;
        if (this.size < this.growFreelyTo) this.size = Math.min(this.growFreelyTo, this.size * step);
        else if (this.size < this.jobsPerRoundTrips(now)) this.size = Math.min(this.max, this.size * 2);
      } else if (!this.starved && this.lowBuffered > 0 && this.lowBuffered !== Number.POSITIVE_INFINITY) {
        this.size = Math.max(this.min, this.size - Math.ceil(this.lowBuffered / 2));
      } else if (this.starved && this.lowOutstanding * 4 > this.size * 3) {
        this.size = Math.max(this.min, this.size - Math.ceil((this.size - this.min) / 4));
      }
    }
    this.arrivals = 0;
    this.epochStart = now;
    this.lowOutstanding = Number.POSITIVE_INFINITY;
    this.lowBuffered = Number.POSITIVE_INFINITY;
    this.starved = false;
  }
}
