/**
 * The open EnqueueStreams of a server, and the switch that drains them all
 * when the server shuts down gracefully (a producer keeps its stream open,
 * so without it a graceful shutdown would wait for every producer to leave).
 */

/** What the registry needs from one open EnqueueStream. */
export interface EnqueueStreamHandle {
  /**
   * Refuses new requests (UNAVAILABLE: not applied), answers those in
   * flight, then ends the stream with UNAVAILABLE; resets it if it has not
   * ended after `graceMs`. Resolves when it ended.
   */
  drain(graceMs: number): Promise<void>;
  /** Ends the stream at once with UNAVAILABLE. */
  abort(reason: string): void;
}

/** Tracks open EnqueueStreams (see the module header). */
export class EnqueueStreamRegistry {
  private readonly streams = new Set<EnqueueStreamHandle>();
  private isDraining = false;

  /** True once the server started draining: new streams are refused. */
  get draining(): boolean {
    return this.isDraining;
  }

  /** Number of open streams. */
  get openStreams(): number {
    return this.streams.size;
  }

  /** Registers an open stream; returns the function that unregisters it. */
  add(stream: EnqueueStreamHandle): () => void {
    this.streams.add(stream);
    return () => {
      this.streams.delete(stream);
    };
  }

  /** Drains every open stream (see {@link EnqueueStreamHandle.drain}); resolves when all have ended. */
  async drainAll(graceMs: number): Promise<void> {
    this.isDraining = true;
    await Promise.all([...this.streams].map((s) => s.drain(graceMs)));
  }

  /** Ends every open stream at once. */
  abortAll(reason: string): void {
    this.isDraining = true;
    for (const s of this.streams) s.abort(reason);
  }
}
