/**
 * The open Work streams of a server: how many there are, how many distinct
 * workers hold them (for observability), and the switch that drains them all
 * when the server shuts down gracefully.
 */

/** What the registry needs from one open Work stream. */
export interface WorkSessionHandle {
  readonly sessionId: string;
  readonly workerId: string;
  readonly queue: string;
  readonly subscription: string;
  /**
   * Stops sending jobs, tells the worker (Draining), keeps answering its
   * requests for at most `graceMs` (less once it holds no job from this stream
   * and has nothing outstanding), then ends the stream with UNAVAILABLE.
   * Resolves when the stream has ended.
   */
  drain(graceMs: number): Promise<void>;
  /** Ends the stream at once with UNAVAILABLE. */
  abort(reason: string): void;
}

/** Tracks open Work streams (see the module header). */
export class WorkRegistry {
  private readonly sessions = new Set<WorkSessionHandle>();
  private drainingSince: number | undefined;

  /** True once the server started draining: new streams are refused. */
  get draining(): boolean {
    return this.drainingSince !== undefined;
  }

  /** Number of open Work streams. */
  get openStreams(): number {
    return this.sessions.size;
  }

  /** Number of distinct worker ids with an open stream. */
  get activeWorkers(): number {
    return new Set([...this.sessions].map((s) => s.workerId)).size;
  }

  /** Open streams per queue and subscription, for gauges. */
  streamsBySubscription(): Map<string, number> {
    const out = new Map<string, number>();
    for (const s of this.sessions) {
      const key = `${s.queue}/${s.subscription}`;
      out.set(key, (out.get(key) ?? 0) + 1);
    }
    return out;
  }

  /** Registers an open stream; returns the function that unregisters it. */
  add(session: WorkSessionHandle): () => void {
    this.sessions.add(session);
    return () => {
      this.sessions.delete(session);
    };
  }

  /** Drains every open stream (see {@link WorkSessionHandle.drain}); resolves when all have ended. */
  async drainAll(graceMs: number, now: number): Promise<void> {
    this.drainingSince ??= now;
    await Promise.all([...this.sessions].map((s) => s.drain(graceMs)));
  }

  /** Ends every open stream at once. */
  abortAll(reason: string): void {
    this.drainingSince ??= 0;
    for (const s of this.sessions) s.abort(reason);
  }
}
