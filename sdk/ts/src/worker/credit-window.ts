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
 * arrivals (counts, no clock):
 *
 * - **grow** (doubles, up to `max`) when, within the epoch, the handlers sat
 *   idle with nothing buffered (starved) while the broker had used most of
 *   the credit (the lowest outstanding credit seen at an arrival was at most
 *   half the window): the credit, not the queue, was what they waited for;
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
}

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
  // The current epoch.
  private arrivals = 0;
  private lowOutstanding = Number.POSITIVE_INFINITY;
  private lowBuffered = Number.POSITIVE_INFINITY;
  private starved = false;

  /** A window of `options.initial`, kept within [min, max]. */
  constructor(options: CreditWindowOptions) {
    this.min = Math.max(1, options.min);
    this.max = Math.max(this.min, options.max);
    this.size = Math.min(this.max, Math.max(this.min, options.initial));
    this.maxOutstanding = options.maxOutstanding;
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

  private endEpoch(): void {
    if (!this.fixed) {
      if (this.starved && this.lowOutstanding * 2 <= this.size) {
        this.size = Math.min(this.max, this.size * 2);
      } else if (!this.starved && this.lowBuffered > 0 && this.lowBuffered !== Number.POSITIVE_INFINITY) {
        this.size = Math.max(this.min, this.size - Math.ceil(this.lowBuffered / 2));
      } else if (this.starved && this.lowOutstanding * 4 > this.size * 3) {
        this.size = Math.max(this.min, this.size - Math.ceil((this.size - this.min) / 4));
      }
    }
    this.arrivals = 0;
    this.lowOutstanding = Number.POSITIVE_INFINITY;
    this.lowBuffered = Number.POSITIVE_INFINITY;
    this.starved = false;
  }
}
