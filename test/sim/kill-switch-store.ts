/**
 * The store as one broker process sees it; `kill()` models the process dying.
 *
 * After `kill()`, every new call fails at once with `unavailable`: a dead
 * process sends nothing. Calls already sent keep going underneath — a request
 * on the wire may still land after its sender died, exactly the case fencing
 * by CAS must handle — but their answers reach nobody who matters.
 */
import type {
  CallOptions,
  ListedObject,
  ObjectStore,
  PutCondition,
  PutResult,
  StoredObject,
} from "../../server/src/store/object-store.ts";
import { UnavailableError } from "../../server/src/store/store-errors.ts";

/** An {@link ObjectStore} wrapper that refuses every call once killed. */
export class KillSwitchStore implements ObjectStore {
  readonly description: string;
  private killed = false;

  constructor(private readonly inner: ObjectStore) {
    this.description = inner.description;
  }

  /** From now on every call fails with `unavailable`. */
  kill(): void {
    this.killed = true;
  }

  get(key: string, options?: CallOptions): Promise<StoredObject | undefined> {
    return this.killed ? this.dead(key) : this.inner.get(key, options);
  }

  put(key: string, body: Uint8Array, condition: PutCondition, options?: CallOptions): Promise<PutResult> {
    return this.killed ? this.dead(key) : this.inner.put(key, body, condition, options);
  }

  delete(key: string, options?: CallOptions & { readonly ifMatch?: string }): Promise<void> {
    return this.killed ? this.dead(key) : this.inner.delete(key, options);
  }

  list(prefix: string, options?: CallOptions): Promise<ListedObject[]> {
    return this.killed ? this.dead(prefix) : this.inner.list(prefix, options);
  }

  close(): Promise<void> {
    return Promise.resolve();
  }

  private dead<T>(key: string): Promise<T> {
    return Promise.reject(new UnavailableError(key, "the broker process is dead"));
  }
}
