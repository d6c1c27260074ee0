/**
 * The object store: the only thing casq persists to.
 *
 * casq keeps each queue shard in ONE object and changes it only by
 * compare-and-set (CAS): read the object with its etag, compute the next
 * version, and write it back with "put if the etag is still X" (or "put if
 * absent" to create). A writer that lost the race gets a
 * {@link PreconditionFailedError}, never a silently merged or torn object.
 *
 * The interface is deliberately narrow so that every backend (file, s3,
 * memory) stays thin, and cross-cutting behaviour (retries, fault injection,
 * instrumentation) is written once as a wrapper around any store.
 */

/** An object read from the store: its bytes and the etag that names this exact version. */
export interface StoredObject {
  readonly body: Uint8Array;
  /**
   * Opaque version tag. It changes whenever the content changes; the file and
   * memory stores change it on every write, while S3 derives it from the bytes
   * (MD5), so rewriting identical bytes keeps it. CAS is correct either way,
   * and casq documents never repeat their bytes (each write has a unique id).
   */
  readonly etag: string;
}

/** Result of a successful write: the etag of the version just written. */
export interface PutResult {
  readonly etag: string;
}

/** Per-call options shared by every store operation. */
export interface CallOptions {
  /** Aborts the call; the store rejects with an error whose kind tells whether the write may have landed. */
  readonly signal?: AbortSignal;
}

/** One entry of a {@link ObjectStore.list} result. */
export interface ListedObject {
  readonly key: string;
  readonly etag?: string;
  readonly size?: number;
}

/** The condition a put is made under. */
export type PutCondition =
  /** Write only if the key's current etag equals this one. */
  | { readonly ifMatch: string }
  /** Write only if the key does not exist. */
  | { readonly ifAbsent: true };

/**
 * A key/value store with conditional writes. Keys are `/`-separated relative
 * paths made of safe characters (see `validateKey`).
 */
export interface ObjectStore {
  /** A short description for logs, e.g. `file:/var/lib/casq` or `s3://bucket/prefix`. */
  readonly description: string;

  /** Reads a key. Resolves `undefined` when it does not exist. */
  get(key: string, options?: CallOptions): Promise<StoredObject | undefined>;

  /**
   * Writes a key under a condition. Rejects with `PreconditionFailedError`
   * when the condition does not hold (etag moved, or key already exists).
   */
  put(key: string, body: Uint8Array, condition: PutCondition, options?: CallOptions): Promise<PutResult>;

  /**
   * Deletes a key; with `ifMatch`, only if its etag still matches. Deleting a
   * missing key resolves (idempotent) unless `ifMatch` is given, which then
   * rejects with `PreconditionFailedError` (there is nothing to match).
   */
  delete(key: string, options?: CallOptions & { readonly ifMatch?: string }): Promise<void>;

  /** Lists keys that start with `prefix`, in lexicographic order. */
  list(prefix: string, options?: CallOptions): Promise<ListedObject[]>;

  /** Releases clients, file handles and timers. */
  close(): Promise<void>;
}
