/**
 * The simulation's "truth": one in-memory store shared by every broker, with
 * an observer that sees every write that actually landed, in the order it
 * landed. This is how the auditor checks invariants of the form "in every
 * committed version of the document ...": it does not trust any broker's
 * account of what it wrote.
 *
 * The observer runs synchronously right after the inner store accepted the
 * write (the memory store's CAS is atomic), before any other caller can learn
 * the new etag, so the recorded order is the commit order.
 */
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import type {
  CallOptions,
  ListedObject,
  ObjectStore,
  PutCondition,
  PutResult,
  StoredObject,
} from "../../server/src/store/object-store.ts";

/** Called once per landed write. */
export type CommitListener = (key: string, body: Uint8Array, etag: string, condition: PutCondition) => void;

/** Called once per delete, right after it happened. */
export type DeleteListener = (key: string) => void;

/** A {@link MemoryStore} that reports every successful put, and every delete. */
export class ObservedStore implements ObjectStore {
  readonly description = "observed(memory:)";
  private readonly inner = new MemoryStore();

  constructor(
    private readonly listener: CommitListener,
    private readonly deleted: DeleteListener = () => {},
  ) {}

  /**
   * Stores an object the auditor does not judge (the queue manifest), before
   * the run starts; the listener does not hear of it.
   */
  async preload(key: string, body: Uint8Array): Promise<void> {
    await this.inner.put(key, body, { ifAbsent: true });
  }

  get(key: string, options?: CallOptions): Promise<StoredObject | undefined> {
    return this.inner.get(key, options);
  }

  put(key: string, body: Uint8Array, condition: PutCondition, options?: CallOptions): Promise<PutResult> {
    return this.inner.put(key, body, condition, options).then((result) => {
      this.listener(key, body, result.etag, condition);
      return result;
    });
  }

  delete(key: string, options?: CallOptions & { readonly ifMatch?: string }): Promise<void> {
    return this.inner.delete(key, options).then(() => this.deleted(key));
  }

  list(prefix: string, options?: CallOptions): Promise<ListedObject[]> {
    return this.inner.list(prefix, options);
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}
