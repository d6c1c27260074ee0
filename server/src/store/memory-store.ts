/**
 * `memory:` — an in-process store for tests and benchmarks. CAS is atomic
 * because JavaScript runs one callback at a time; etags are a per-store
 * counter, so every successful write yields a new one.
 */
import { validateKey, validatePrefix } from "./keys.ts";
import type {
  CallOptions,
  ListedObject,
  ObjectStore,
  PutCondition,
  PutResult,
  StoredObject,
} from "./object-store.ts";
import { PreconditionFailedError, UnavailableError } from "./store-errors.ts";

interface Entry {
  body: Uint8Array;
  etag: string;
}

/** An {@link ObjectStore} held in a `Map`. Bodies are copied in and out, as a real store would. */
export class MemoryStore implements ObjectStore {
  readonly description = "memory:";
  private readonly entries = new Map<string, Entry>();
  private version = 0;

  async get(key: string, options?: CallOptions): Promise<StoredObject | undefined> {
    validateKey(key);
    checkSignal(key, options);
    const entry = this.entries.get(key);
    return entry ? { body: entry.body.slice(), etag: entry.etag } : undefined;
  }

  async put(
    key: string,
    body: Uint8Array,
    condition: PutCondition,
    options?: CallOptions,
  ): Promise<PutResult> {
    validateKey(key);
    checkSignal(key, options);
    const current = this.entries.get(key);
    if ("ifAbsent" in condition) {
      if (current) throw new PreconditionFailedError(key, "the key already exists");
    } else if (!current) {
      throw new PreconditionFailedError(key, "the key does not exist");
    } else if (current.etag !== condition.ifMatch) {
      throw new PreconditionFailedError(key, `etag is ${current.etag}, not ${condition.ifMatch}`);
    }
    this.version += 1;
    const etag = `"m${this.version}"`;
    this.entries.set(key, { body: body.slice(), etag });
    return { etag };
  }

  async delete(key: string, options?: CallOptions & { readonly ifMatch?: string }): Promise<void> {
    validateKey(key);
    checkSignal(key, options);
    const current = this.entries.get(key);
    if (options?.ifMatch !== undefined) {
      if (!current) throw new PreconditionFailedError(key, "the key does not exist");
      if (current.etag !== options.ifMatch)
        throw new PreconditionFailedError(key, `etag is ${current.etag}, not ${options.ifMatch}`);
    }
    this.entries.delete(key);
  }

  async list(prefix: string, options?: CallOptions): Promise<ListedObject[]> {
    validatePrefix(prefix);
    checkSignal(prefix, options);
    return [...this.entries.entries()]
      .filter(([key]) => key.startsWith(prefix))
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([key, entry]) => ({ key, etag: entry.etag, size: entry.body.byteLength }));
  }

  async close(): Promise<void> {}
}

function checkSignal(key: string, options: CallOptions | undefined): void {
  if (options?.signal?.aborted) throw new UnavailableError(key, "the call was aborted before it started");
}
