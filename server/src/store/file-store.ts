/**
 * `file:` — the embedded default backend: every object is one file under a
 * root directory on local disk. Several OS processes (e.g. two brokers on one
 * machine) may share the directory; compare-and-set stays atomic between them
 * and a process killed at any instant never leaves a torn object behind.
 *
 * ## On disk
 *
 * - Key `queues/q/0.json` is the file `<root>/queues/q/0.json`, in one of two
 *   formats:
 *   - a new key (put-if-absent) gets a one-line header
 *     `casq-object/1 <32 hex>\n` naming the version (the etag), followed by
 *     the object's bytes exactly (inspect it with `tail -n +2 <file>`);
 *   - a key that is overwritten (put-if-match) moves to a slotted file
 *     (`casq-object/2`, file-store/slotted-file.ts): two slots holding the
 *     current version and the one before, each with its etag and a CRC-32,
 *     written in place from then on. A shard's head is such a file.
 *
 *   A file with neither header (e.g. copied in by hand) is read whole, with
 *   an etag derived from its inode, mtime and size; the next write through
 *   the store gives it one. A store directory written by this version is
 *   refused by brokers from before slotted files: they read a slotted file
 *   whole, and their shard parser refuses it as unreadable (never writing
 *   over it).
 * - Everything internal has a `~` in its name, a character {@link validateKey}
 *   never accepts, so internal names can never collide with a key and are
 *   skipped by `list`: temp files `<name>~tmp~<owner>` beside their target,
 *   and `<root>/~casq/` holding per-key lock directories and lock staging.
 * - A key can be an object or a prefix of other keys, not both (a path is a
 *   file or a directory). Writing one over the other is refused as `invalid`.
 *
 * ## Crash-safe writes
 *
 * Every check and write of a put happens under the key's lock. A put over a
 * slotted file whose capacity the body fits writes the slot that does not
 * hold the current version (body, then header) and `fdatasync`s the file:
 * the current version stays whole until then, and a slot cut short by a
 * crash fails its CRC and is ignored (slotted-file.ts). Any other put
 * writes the new file (a slotted one when it overwrites, sized for the body
 * to double) to a fresh temp file in the target's directory and fsyncs it,
 * checks the condition and `rename`s the temp file over the target (the
 * commit point: rename is atomic, so readers see the old or the new file,
 * never a mix), then fsyncs the directory so the rename survives power loss.
 * A reader of a single-version file reads its header (etag) and body from
 * one inode, which is never modified in place; a reader of a slotted file
 * checks the slot's CRC and reads again if another process wrote over it
 * meanwhile. The etag is 128 random bits chosen per write, so rewriting
 * identical bytes still changes it, and an old etag never matches again
 * (inode numbers and mtimes can repeat; random ids practically cannot).
 * Temp files of dead writers are deleted when a store first writes into
 * their directory, or when it breaks that key's stale lock. A slotted file
 * none of whose slots is valid (damage on the disk) is never written over:
 * reads fail `unavailable`, conditional writes fail their condition.
 *
 * ## Cross-process lock (per key)
 *
 * The check and the commit of a put or delete run under the key's lock: a
 * directory `~casq/locks/<sha256(key)>` made by one atomic rename of a staged
 * directory holding the holder's marker, broken only when its holder is dead
 * (file-store/key-lock.ts describes the protocol; file-store/owner-liveness.ts
 * how a holder is known dead).
 *
 * ## Where the time goes
 *
 * A put makes up to fifteen file-system calls. Made asynchronously, each is a
 * trip to libuv's thread pool and back to the event loop (~50 µs of CPU on
 * the machines we measure, and a turn of a loop that is busy answering
 * calls). So a put of up to 4 MiB runs on one of the process's put threads
 * (file-store/put-threads.ts): the whole sequence as synchronous calls
 * (file-store/sync-put.ts), one message there and one back; the thread
 * answers once the write is durable and only then releases the key's lock
 * and stages the lock of its next put (a directory holding a marker, under
 * `~casq/staging`: one per thread while the process lives, swept with the
 * other leftovers of a process once it is gone). It takes the cross-process lock only if it is free (or, briefly,
 * once a sibling thread releases it); a lock held by another process, a
 * bigger body, or a thread that cannot start send the put down the
 * asynchronous path below, which waits for live holders and breaks dead
 * ones, and always writes a temp file and renames it. On that path the calls that only read (the condition check, the lock
 * check) and the write of a body of at most 1 MiB into the page cache run
 * synchronously (calls that change a directory can wait for the journal, so
 * they stay on the pool); the next lock's staging directory is made while
 * the current one is used, and a lock is removed after the put has answered
 * (the next call on the key waits for that). This store is meant for local
 * disks; on a network file system the synchronous reads would block.
 *
 * ## Deadlines and errors
 *
 * `options.signal` aborted before the commit point (the rename, or the
 * write of a slot) rejects with `unavailable` and nothing was written; once
 * past it the write resolves normally.
 * File-system errors are classified once (file-store/fs-errors.ts): a
 * missing file is "absent", path collisions (ENOTDIR, EISDIR, ENAMETOOLONG)
 * are `invalid`, everything else (EACCES, ENOSPC, EIO, ...) is `unavailable`;
 * a failed directory fsync after the rename, or a failed `fdatasync` after a
 * slot's header was written, is `ambiguous` (visible, durability unknown). A store
 * directory that cannot be created or written when the store opens is
 * `misconfigured`, at once (never a retry loop).
 */
import { accessSync, closeSync, constants, type Dirent } from "node:fs";
import { type FileHandle, mkdir, open, readdir } from "node:fs/promises";
import path from "node:path";
import {
  fsyncDir,
  fsyncFd,
  makeDirsSync,
  openFd,
  renamePath,
  unlinkPath,
  writeAll,
  writeAllSync,
} from "./file-store/file-io.ts";
import { classify, errnoCode, ignoreMissing, throwIfAborted, unusableRoot } from "./file-store/fs-errors.ts";
import { KeyLocks, LOCK_TAKEN_OVER } from "./file-store/key-lock.ts";
import {
  DAMAGED_ETAG,
  DAMAGED_MESSAGE,
  ETAG_ID_HEX,
  HEADER_BYTES,
  parseHeader,
  rawEtag,
  readCurrent,
  unmetCondition,
  versionHeader,
} from "./file-store/object-file.ts";
import { isAbandoned, newOwnerName, ORPHAN_MAX_AGE_MS } from "./file-store/owner-liveness.ts";
import { type PutThreads, putThreads, removeLeftovers } from "./file-store/put-threads.ts";
import { randomHex } from "./file-store/random-hex.ts";
import { isSlotted, parseSlotted, SLOTTED_READ_ATTEMPTS } from "./file-store/slotted-file.ts";
import type { SyncPutOutcome, SyncPutRequest } from "./file-store/sync-put.ts";
import { validateKey, validatePrefix } from "./keys.ts";
import type {
  CallOptions,
  ListedObject,
  ObjectStore,
  PutCondition,
  PutResult,
  StoredObject,
} from "./object-store.ts";
import {
  AmbiguousWriteError,
  InvalidRequestError,
  PreconditionFailedError,
  UnavailableError,
} from "./store-errors.ts";

export { fileStoreOwnerToken } from "./file-store/owner-liveness.ts";

/** Options of a {@link FileStore}. */
export interface FileStoreOptions {
  /** The directory holding the objects; created (with parents) if missing. */
  readonly root: string;
  /**
   * How long a lock whose holder cannot be checked by pid (another machine or
   * pid namespace) may go without a refresh before it is broken. Default 10 s.
   */
  readonly lockStaleMs?: number;
  /** How long a call waits for a key's lock held by a live process before failing `unavailable`. Default 30 s. */
  readonly lockTimeoutMs?: number;
  /** The put threads to write with (default: the process's, {@link putThreads}); tests give their own. */
  readonly putThreads?: PutThreads;
}

/** Name of the internal directory under the root (contains `~`, so never a key). */
export const FILE_STORE_INTERNAL_DIR = "~casq";

/** Longest key segment the file store accepts, in bytes (file names are limited to 255 and temp names add a suffix). */
export const FILE_STORE_MAX_SEGMENT_BYTES = 200;

const TEMP_INFIX = "~tmp~";
const SEGMENT_RE = /^[A-Za-z0-9._=-]+$/;
const IO_CHUNK = 4 * 1024 * 1024;
/** Bodies up to this size are written to the temp file synchronously (into the page cache; the fsync is async). */
const SYNC_WRITE_MAX_BYTES = 1024 * 1024;
/** Bodies up to this size are written by a put thread (file-store/put-threads.ts); bigger ones in chunks on the event loop. */
const THREAD_PUT_MAX_BYTES = IO_CHUNK;
const PREFIX_NOT_OBJECT =
  "the key is a prefix of other keys; the file store cannot also store an object there";
const DEFAULT_LOCK_STALE_MS = 10_000;

/** One put: its key and file, the new version's id, and the caller's arguments, deadline included. */
interface PutCall {
  readonly key: string;
  readonly file: string;
  readonly id: string;
  readonly body: Uint8Array;
  readonly condition: PutCondition;
  readonly signal: AbortSignal | undefined;
  readonly deadline: number;
}

function directorySyncFailed(code: string): string {
  return `the new version is visible but syncing its directory failed (${code}); it may not survive a power loss`;
}
const DEFAULT_LOCK_TIMEOUT_MS = 30_000;

/**
 * An {@link ObjectStore} on a local directory, safe between processes and
 * crash-safe (see the module comment for the protocol).
 */
export class FileStore implements ObjectStore {
  /** `file:` followed by the absolute root directory. */
  readonly description: string;
  /** The absolute root directory. */
  readonly root: string;
  private readonly lockTimeoutMs: number;
  private readonly locks: KeyLocks;
  private readonly putThreads: PutThreads;
  private readonly sweptDirs = new Set<string>();
  /** Directories this store made or found; a put into one skips the mkdir (see doPut for one removed since). */
  private readonly knownDirs = new Set<string>();
  private readonly inFlight = new Set<Promise<unknown>>();
  private closed = false;

  /** Opens (creating if missing) the store directory. Throws a `StoreError` if it cannot. */
  constructor(options: FileStoreOptions) {
    this.root = path.resolve(options.root);
    this.description = `file:${this.root}`;
    const lockStaleMs = Math.max(100, options.lockStaleMs ?? DEFAULT_LOCK_STALE_MS);
    this.lockTimeoutMs = Math.max(0, options.lockTimeoutMs ?? DEFAULT_LOCK_TIMEOUT_MS);
    this.putThreads = options.putThreads ?? putThreads;
    const locksDir = path.join(this.root, FILE_STORE_INTERNAL_DIR, "locks");
    const stagingDir = path.join(this.root, FILE_STORE_INTERNAL_DIR, "staging");
    try {
      makeDirsSync(locksDir);
      makeDirsSync(stagingDir);
      accessSync(locksDir, constants.W_OK);
    } catch (error) {
      throw unusableRoot(error, this.root);
    }
    this.locks = new KeyLocks({
      locksDir,
      stagingDir,
      lockStaleMs,
      lockTimeoutMs: this.lockTimeoutMs,
      // A dead holder's temp file of this key is its unfinished write: remove it.
      onBreak: (key) => this.sweepTemps(path.dirname(this.pathOf(key)), path.basename(this.pathOf(key))),
    });
  }

  /** Reads a key; body and etag come from the same version (checked by its CRC in a slotted file). */
  get(key: string, options?: CallOptions): Promise<StoredObject | undefined> {
    return this.track(key, () => this.doGet(key, options?.signal));
  }

  /** Conditionally writes a key under its lock: in place over a slotted file, else a temp file renamed over it (see the module comment). */
  put(key: string, body: Uint8Array, condition: PutCondition, options?: CallOptions): Promise<PutResult> {
    return this.track(key, () => this.doPut(key, body, condition, options?.signal));
  }

  /** Deletes a key under its lock; with `ifMatch`, only if the etag still matches. */
  delete(key: string, options?: CallOptions & { readonly ifMatch?: string }): Promise<void> {
    return this.track(key, () => this.doDelete(key, options?.ifMatch, options?.signal));
  }

  /** Lists keys starting with `prefix` in lexicographic order; internal files are never listed. */
  list(prefix: string, options?: CallOptions): Promise<ListedObject[]> {
    return this.track(prefix, () => this.doList(prefix, options?.signal), validatePrefix);
  }

  /** Waits for calls in flight; later calls reject with `unavailable`. No handles stay open between calls. */
  async close(): Promise<void> {
    this.closed = true;
    await this.locks.close(Promise.allSettled([...this.inFlight]));
  }

  private async track<T>(
    keyOrPrefix: string,
    run: () => Promise<T>,
    validate: (value: string) => void = validateKey,
  ): Promise<T> {
    validate(keyOrPrefix);
    if (this.closed) throw new UnavailableError(keyOrPrefix, "the file store is closed");
    const promise = run();
    this.inFlight.add(promise);
    try {
      return await promise;
    } finally {
      this.inFlight.delete(promise);
    }
  }

  /** Maps a validated key to its file, refusing anything that would leave the root. */
  private pathOf(key: string): string {
    const segments = key.split("/");
    for (const segment of segments) {
      if (Buffer.byteLength(segment) > FILE_STORE_MAX_SEGMENT_BYTES)
        throw new InvalidRequestError(
          key,
          `the file store accepts key segments of at most ${FILE_STORE_MAX_SEGMENT_BYTES} bytes`,
        );
    }
    const file = path.resolve(this.root, ...segments);
    const relative = path.relative(this.root, file);
    if (
      relative === "" ||
      relative === ".." ||
      relative.startsWith(`..${path.sep}`) ||
      path.isAbsolute(relative)
    )
      throw new InvalidRequestError(key, "key resolves outside the store directory");
    return file;
  }

  private async doGet(key: string, signal: AbortSignal | undefined): Promise<StoredObject | undefined> {
    const file = this.pathOf(key);
    // A slotted file met while another process writes both its slots is read again (slotted-file.ts).
    for (let attempt = 1; ; attempt++) {
      const read = await this.readFile(key, file, signal);
      if (read === undefined) return undefined;
      if (!isSlotted(read.data)) {
        const etag = parseHeader(read.data);
        if (etag !== undefined) return { body: read.data.subarray(HEADER_BYTES), etag };
        return { body: read.data, etag: rawEtag(read.info) };
      }
      const version = parseSlotted(read.data);
      if (version !== undefined) return version;
      if (attempt >= SLOTTED_READ_ATTEMPTS) throw new UnavailableError(key, DAMAGED_MESSAGE);
    }
  }

  /** The whole file of `key` and its stat; undefined when there is none (or a directory). */
  private async readFile(
    key: string,
    file: string,
    signal: AbortSignal | undefined,
  ): Promise<{ data: Buffer; info: { ino: bigint; mtimeNs: bigint; size: bigint } } | undefined> {
    throwIfAborted(signal, key, "before the read");
    let handle: FileHandle;
    try {
      handle = await open(file, "r");
    } catch (error) {
      const code = errnoCode(error);
      if (code === "ENOENT" || code === "ENOTDIR") return undefined;
      throw classify(error, key, "opening the object");
    }
    try {
      const info = await handle.stat({ bigint: true });
      if (info.isDirectory()) return undefined;
      const size = Number(info.size);
      const bytes = Buffer.allocUnsafeSlow(size);
      let offset = 0;
      while (offset < size) {
        throwIfAborted(signal, key, "during the read");
        const { bytesRead } = await handle.read(bytes, offset, Math.min(IO_CHUNK, size - offset), offset);
        if (bytesRead === 0) break;
        offset += bytesRead;
      }
      throwIfAborted(signal, key, "during the read");
      return { data: bytes.subarray(0, offset), info };
    } catch (error) {
      throw classify(error, key, "reading the object");
    } finally {
      await handle.close().catch(() => {});
    }
  }

  private async doPut(
    key: string,
    body: Uint8Array,
    condition: PutCondition,
    signal: AbortSignal | undefined,
  ): Promise<PutResult> {
    const file = this.pathOf(key);
    throwIfAborted(signal, key, "before the write started (nothing was written)");
    const deadline = Date.now() + this.lockTimeoutMs;
    const id = randomHex(ETAG_ID_HEX / 2);
    const etag = `"${id}"`;
    const call: PutCall = { key, file, id, body, condition, signal, deadline };
    if (body.byteLength <= THREAD_PUT_MAX_BYTES) {
      let landed: boolean;
      try {
        landed = await this.putOnThread(call);
      } catch (error) {
        throw classify(error, key, "writing the object");
      }
      if (landed) return { etag };
    }
    await this.putOnEventLoop(call);
    return { etag };
  }

  /**
   * The put on a put thread (file-store/put-threads.ts) under the key's
   * in-process mutex. True when it landed; false when it must take the
   * event loop's path instead (no thread, the key's lock held by another
   * process, its directory removed meanwhile); throws what the put failed
   * with otherwise.
   */
  private async putOnThread(call: PutCall): Promise<boolean> {
    const { key, file, id, body, condition, signal, deadline } = call;
    const dir = path.dirname(file);
    await this.ensureDir(dir);
    const release = await this.locks.turn(key, signal, deadline);
    let outcome: SyncPutOutcome | undefined;
    const request: SyncPutRequest = {
      file,
      temp: `${file}${TEMP_INFIX}${newOwnerName()}`,
      id,
      ifAbsent: "ifAbsent" in condition,
      ifMatch: "ifMatch" in condition ? condition.ifMatch : undefined,
      ...this.locks.stageFor(key),
      stageAhead: true,
    };
    try {
      outcome = await this.putThreads.run(request, body, signal);
    } catch (error) {
      // The thread may have stopped anywhere in the sequence: remove what only this put could have
      // made (a marker of this live process is never broken as stale), then say "unknown".
      await removeLeftovers(request);
      throw new AmbiguousWriteError(
        key,
        "the thread writing the object failed; whether the write landed is unknown",
        { cause: error },
      );
    } finally {
      release();
    }
    switch (outcome?.kind) {
      case undefined:
      case "lock-busy":
        return false;
      case "ok":
        return true;
      case "precondition":
        throw new PreconditionFailedError(key, outcome.message);
      case "prefix":
        throw new InvalidRequestError(key, PREFIX_NOT_OBJECT);
      case "aborted":
        throw new UnavailableError(
          key,
          "the call was aborted before the write committed (nothing was written)",
        );
      case "lock-lost":
        throw new UnavailableError(key, LOCK_TAKEN_OVER);
      case "ambiguous":
        throw new AmbiguousWriteError(key, directorySyncFailed(outcome.code));
      case "failed":
        // The directory was removed since this store made it: the event loop's path makes it again.
        if (outcome.step === "temp" && outcome.code === "ENOENT" && this.knownDirs.delete(dir)) return false;
        throw classify(
          Object.assign(new Error(outcome.message), { code: outcome.code }),
          key,
          "writing the object",
        );
    }
  }

  /** The put on the event loop, each file call a trip to libuv's thread pool (big bodies, contended locks). */
  private async putOnEventLoop(call: PutCall): Promise<void> {
    const { key, file, id, body, condition, signal, deadline } = call;
    const dir = path.dirname(file);
    const temp = `${file}${TEMP_INFIX}${newOwnerName()}`;
    let committed = false;
    try {
      await this.ensureDir(dir);
      // The key's lock is taken while the temp file is written and synced (the lock's
      // renames need not wait for that fsync, nor it for them); it guards only the check
      // and the rename below. If the temp file fails, the lock is released once taken.
      const locking = this.locks.lock(key, signal, deadline);
      locking.catch(() => {}); // its failure is seen where it is awaited
      try {
        try {
          await this.writeTemp(temp, id, body, key, signal);
        } catch (error) {
          if (errnoCode(error) !== "ENOENT" || !this.knownDirs.delete(dir)) throw error;
          // The directory was removed since this store made it: make it again, once.
          await this.ensureDir(dir);
          await this.writeTemp(temp, id, body, key, signal);
        }
      } catch (error) {
        locking.then(
          (lock) => this.locks.releaseLater(lock),
          () => {},
        );
        throw error;
      }
      const lock = await locking;
      try {
        const current = readCurrent(file);
        if (current.kind === "directory") throw new InvalidRequestError(key, PREFIX_NOT_OBJECT);
        const unmet = unmetCondition(current, condition);
        if (unmet !== undefined) throw new PreconditionFailedError(key, unmet);
        throwIfAborted(signal, key, "before the write committed (nothing was written)");
        lock.assertHeld(key);
        await renamePath(temp, file);
        committed = true;
        try {
          await fsyncDir(dir);
        } catch (error) {
          throw new AmbiguousWriteError(key, directorySyncFailed(errnoCode(error) ?? String(error)), {
            cause: error,
          });
        }
      } finally {
        // Not awaited: the answer need not wait for the lock's cleanup; the
        // next call on this key waits for it (the mutex is freed after it).
        this.locks.releaseLater(lock);
      }
    } catch (error) {
      throw classify(error, key, committed ? "syncing the written object" : "writing the object");
    } finally {
      if (!committed) await unlinkPath(temp).catch(() => {});
    }
  }

  private async doDelete(
    key: string,
    ifMatch: string | undefined,
    signal: AbortSignal | undefined,
  ): Promise<void> {
    const file = this.pathOf(key);
    throwIfAborted(signal, key, "before the delete started (nothing was deleted)");
    try {
      const lock = await this.locks.lock(key, signal, Date.now() + this.lockTimeoutMs);
      try {
        const current = readCurrent(file);
        if (ifMatch !== undefined) {
          const unmet = unmetCondition(current.kind === "directory" ? { kind: "absent" } : current, {
            ifMatch,
          });
          if (unmet !== undefined) throw new PreconditionFailedError(key, unmet);
        }
        if (current.kind !== "object" && current.kind !== "damaged") return;
        throwIfAborted(signal, key, "before the delete committed (nothing was deleted)");
        lock.assertHeld(key);
        await ignoreMissing(unlinkPath(file));
        try {
          await fsyncDir(path.dirname(file));
        } catch (error) {
          throw new AmbiguousWriteError(
            key,
            `the object is gone but syncing its directory failed (${errnoCode(error)})`,
            {
              cause: error,
            },
          );
        }
      } finally {
        this.locks.releaseLater(lock);
      }
    } catch (error) {
      throw classify(error, key, "deleting the object");
    }
  }

  private async doList(prefix: string, signal: AbortSignal | undefined): Promise<ListedObject[]> {
    throwIfAborted(signal, prefix, "before the list");
    const slash = prefix.lastIndexOf("/");
    const base = slash < 0 ? "" : prefix.slice(0, slash + 1);
    const found: ListedObject[] = [];
    const walk = async (dir: string, keyBase: string): Promise<void> => {
      throwIfAborted(signal, prefix, "during the list");
      let entries: Dirent[];
      try {
        entries = await readdir(dir, { withFileTypes: true });
      } catch (error) {
        const code = errnoCode(error);
        if (code === "ENOENT" || code === "ENOTDIR") return;
        throw error;
      }
      for (const entry of entries) {
        if (
          entry.name.includes("~") ||
          !SEGMENT_RE.test(entry.name) ||
          entry.name === "." ||
          entry.name === ".."
        )
          continue;
        const key = keyBase + entry.name;
        if (entry.isDirectory()) {
          const asPrefix = `${key}/`;
          if (asPrefix.startsWith(prefix) || prefix.startsWith(asPrefix))
            await walk(path.join(dir, entry.name), asPrefix);
        } else if (entry.isFile() && key.startsWith(prefix)) {
          try {
            const current = readCurrent(path.join(dir, entry.name));
            if (current.kind === "object") found.push({ key, etag: current.etag, size: current.size });
            else if (current.kind === "damaged") found.push({ key, etag: DAMAGED_ETAG, size: 0 });
          } catch (error) {
            if (errnoCode(error) !== "ENOENT") throw error;
          }
        }
      }
    };
    try {
      await walk(base === "" ? this.root : path.join(this.root, ...base.slice(0, -1).split("/")), base);
    } catch (error) {
      throw classify(error, prefix, "listing the store directory");
    }
    return found.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  }

  /** Writes header + body to a new temp file (O_EXCL) and fsyncs it; checks the signal between chunks. */
  private async writeTemp(
    temp: string,
    id: string,
    body: Uint8Array,
    key: string,
    signal: AbortSignal | undefined,
  ): Promise<void> {
    const fd = await openFd(temp, "wx");
    try {
      writeAllSync(fd, Buffer.from(versionHeader(id), "latin1"), 0);
      if (body.byteLength <= SYNC_WRITE_MAX_BYTES) writeAllSync(fd, body, HEADER_BYTES);
      else
        for (let offset = 0; offset < body.byteLength; offset += IO_CHUNK) {
          throwIfAborted(signal, key, "before the write committed (nothing was written)");
          const chunk = body.subarray(offset, Math.min(body.byteLength, offset + IO_CHUNK));
          await writeAll(fd, chunk, HEADER_BYTES + offset);
        }
      await fsyncFd(fd);
    } finally {
      closeSync(fd);
    }
  }

  /** Creates the object's directory (fsyncing new entries), and once per directory sweeps dead writers' temp files. */
  private async ensureDir(dir: string): Promise<void> {
    if (this.knownDirs.has(dir)) return;
    const first = await mkdir(dir, { recursive: true });
    if (first !== undefined) {
      let current = dir;
      const created = [current];
      while (current !== first && current.length > first.length) {
        current = path.dirname(current);
        created.push(current);
      }
      for (const made of created.reverse()) await fsyncDir(path.dirname(made));
    }
    if (!this.sweptDirs.has(dir)) {
      this.sweptDirs.add(dir);
      await this.sweepTemps(dir).catch(() => {});
    }
    this.knownDirs.add(dir);
  }

  /** Deletes temp files in `dir` (optionally only those of `onlyName`) whose writer is dead. */
  private async sweepTemps(dir: string, onlyName?: string): Promise<void> {
    let names: string[];
    try {
      names = await readdir(dir);
    } catch {
      return;
    }
    for (const name of names) {
      const at = name.indexOf(TEMP_INFIX);
      if (at < 0) continue;
      if (onlyName !== undefined && name.slice(0, at) !== onlyName) continue;
      const file = path.join(dir, name);
      if (await isAbandoned(name.slice(at + TEMP_INFIX.length), file, ORPHAN_MAX_AGE_MS))
        await unlinkPath(file).catch(() => {});
    }
  }
}
