/**
 * A job's abort signal, made on first use.
 *
 * Every held job can be aborted (lease lost, hard stop), but most handlers
 * never read `job.signal`, and a Node `AbortController` with its signal costs
 * about 4 µs of CPU to make and collect: a few percent of the worker's CPU
 * per job. So the controller is made only when the signal is first read; a
 * job aborted before that gets a signal that is already aborted, with the
 * same reason.
 */

/** Abort state of one held job whose `AbortSignal` is made on demand. */
export class LazyAbort {
  private controller: AbortController | undefined;
  private abortedWith: { readonly reason: unknown } | undefined;

  /** The job's signal (made now if it was not yet; already aborted if {@link abort} ran). */
  get signal(): AbortSignal {
    if (this.controller === undefined) {
      this.controller = new AbortController();
      if (this.abortedWith !== undefined) this.controller.abort(this.abortedWith.reason);
    }
    return this.controller.signal;
  }

  /** Whether {@link abort} ran. */
  get aborted(): boolean {
    return this.abortedWith !== undefined;
  }

  /** Aborts the signal with `reason`, now or when it is first read; later calls do nothing (as AbortController's). */
  abort(reason: unknown): void {
    if (this.abortedWith !== undefined) return;
    this.abortedWith = { reason };
    this.controller?.abort(reason);
  }
}
