/**
 * `file:` — the embedded default backend: every object is one file under a
 * root directory on local disk. Several OS processes (e.g. two brokers on one
 * machine) may share the directory; compare-and-set stays atomic between them
 * and a process killed at any instant never leaves a torn object behind.
 *
 * ## On disk
 *
 * - Key `queues/q/0.json` is the file `<root>/queues/q/0.json`. The file starts
 *   with a one-line header `casq-object/1 <32 hex>\n` naming the version (the
 *   etag), followed by the object's bytes exactly (inspect it with
 *   `tail -n +2 <file>`). A file without that header (e.g. copied in by hand)
 *   is read whole, with an etag derived from its inode, mtime and size; the
 *   next write through the store gives it a header.
 * - Everything internal has a `~` in its name, a character {@link validateKey}
 *   never accepts, so internal names can never collide with a key and are
 *   skipped by `list`: temp files `<name>~tmp~<owner>` beside their target,
 *   and `<root>/~casq/` holding per-key lock directories and lock staging.
 * - A key can be an object or a prefix of other keys, not both (a path is a
 *   file or a directory). Writing one over the other is refused as `invalid`.
 *
 * ## Crash-safe writes
 *
 * A put writes header + bytes to a fresh temp file in the target's directory
 * and fsyncs it; then, under the key's lock, it checks the condition and
 * `rename`s the temp file over the target (the commit point: rename is atomic,
 * so readers see the old or the new file, never a mix), then fsyncs the
 * directory so the rename survives power loss. Files are never modified in
 * place, so a reader that opened one version reads its header (etag) and body
 * from that one inode: body and etag always match. The etag is 128 random bits
 * chosen per write, so rewriting identical bytes still changes it, and an old
 * etag never matches again (inode numbers and mtimes can repeat; random ids
 * practically cannot). Temp files of dead writers are deleted when a store
 * first writes into their directory, or when it breaks that key's stale lock.
 *
 * ## Cross-process lock (per key)
 *
 * The lock of a key is the directory `~casq/locks/<sha256(key)>`; the holder is
 * named by the single marker file inside it (`<pid>.<start>.<host>.<nonce>`).
 * - Acquire: build a staging directory that already contains my marker, then
 *   `rename` it onto the lock path. The kernel makes that atomic, and lets it
 *   succeed only when the lock path is missing or an EMPTY directory, so exactly
 *   one contender wins and the lock is never observed half-made.
 * - Release: delete my marker, then `rmdir` the (now empty) lock directory.
 * - Break a stale lock: delete the dead holder's marker BY ITS EXACT NAME. That
 *   can never remove a newer holder's marker (different name), which closes the
 *   race of plain "lock file + stale check" schemes (including proper-lockfile
 *   4.1.2, whose rmdir-then-mkdir takeover lets two waiters both win).
 * - Stale means: the holder ran on this machine (same hostname, boot id and pid
 *   namespace) and its pid is gone, a zombie, or reused by a process with a
 *   different start time; or, when we cannot check the pid (another machine or
 *   container), the marker was not refreshed for `lockStaleMs` (holders touch it
 *   every `lockStaleMs / 3`). A live holder on this machine is never broken:
 *   waiters give up after `lockTimeoutMs` with `unavailable`.
 * - Within one process, calls on the same key also queue on an in-memory mutex,
 *   so concurrent callers do not spin on the file system.
 *
 * ## Where the time goes
 *
 * A put makes about twenty file-system calls, and each trip to libuv's thread
 * pool costs a turn of the event loop, which under load (a broker answering
 * thousands of calls) is most of a put. So the put's critical path keeps only
 * what must wait: create the temp file, fsync it, rename the staged lock into
 * place, rename the temp file, fsync the directory. Calls that only read
 * (the condition check, the lock check) and the write of a body of at most
 * 1 MiB into the page cache run synchronously (microseconds on a local disk;
 * calls that change a directory can wait for the journal, so they stay on
 * the pool). The next lock's staging directory and marker are made while the
 * current one is used, and a lock is removed after the put has answered (the
 * next call on the key waits for that). This store is meant for local
 * disks; on a network file system the synchronous reads would block.
 *
 * ## Deadlines and errors
 *
 * `options.signal` aborted before the rename rejects with `unavailable` and
 * nothing was written; once the rename happened the write resolves normally.
 * File-system errors are classified once, here: a missing file is "absent",
 * path collisions (ENOTDIR, EISDIR, ENAMETOOLONG) are `invalid`, everything
 * else (EACCES, ENOSPC, EIO, ...) is `unavailable`; a failed directory fsync
 * after the rename is `ambiguous` (visible, durability unknown). A store
 * directory that cannot be created or written when the store opens is
 * `misconfigured`, at once (never a retry loop).
 */
import { createHash, randomBytes } from "node:crypto";
import {
  accessSync,
  closeSync,
  constants,
  type Dirent,
  fstatSync,
  fsync as fsyncCallback,
  mkdirSync,
  open as openCallback,
  openSync,
  readFileSync,
  readlinkSync,
  readSync,
  statSync,
  write as writeCallback,
  writeSync,
} from "node:fs";
import {
  type FileHandle,
  mkdir,
  open,
  readdir,
  readFile,
  rename,
  rm,
  rmdir,
  stat,
  unlink,
  utimes,
  writeFile,
} from "node:fs/promises";
import { hostname } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { type Backoff, backoffDelay } from "@casq/sdk/backoff.ts";
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
  StoreError,
  StoreMisconfiguredError,
  UnavailableError,
} from "./store-errors.ts";

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
}

/** Name of the internal directory under the root (contains `~`, so never a key). */
export const FILE_STORE_INTERNAL_DIR = "~casq";

/** Longest key segment the file store accepts, in bytes (file names are limited to 255 and temp names add a suffix). */
export const FILE_STORE_MAX_SEGMENT_BYTES = 200;

const HEADER_MAGIC = "casq-object/1 ";
const ETAG_ID_HEX = 32;
/** Bytes of the version header: magic, 32 hex digits, newline. */
const HEADER_BYTES = HEADER_MAGIC.length + ETAG_ID_HEX + 1;
const HEADER_RE = /^casq-object\/1 ([0-9a-f]{32})\n$/;
const TEMP_INFIX = "~tmp~";
const SEGMENT_RE = /^[A-Za-z0-9._=-]+$/;
const OWNER_RE = /^(\d+)\.(\d+)\.([0-9a-f]{12})\.[0-9a-f]{16}$/;
const IO_CHUNK = 4 * 1024 * 1024;
/** Bodies up to this size are written to the temp file synchronously (into the page cache; the fsync is async). */
const SYNC_WRITE_MAX_BYTES = 1024 * 1024;
const DEFAULT_LOCK_STALE_MS = 10_000;
const DEFAULT_LOCK_TIMEOUT_MS = 30_000;
/** Polling a held lock: after 1..2 ms, doubling, up to 20..40 ms (equal jitter, so waiters spread). */
const LOCK_WAIT_BACKOFF: Backoff = { immediateRetries: 0, baseDelayMs: 2, maxDelayMs: 40, jitter: "equal" };
/** Temp files and staging dirs whose owner cannot be checked are removed after this long. */
const ORPHAN_MAX_AGE_MS = 60 * 60 * 1000;

// ---------------------------------------------------------------------------
// Who we are, and whether another lock holder is still alive.
// ---------------------------------------------------------------------------

interface ProcStat {
  readonly state: string;
  readonly start: string;
}

function parseProcStat(text: string): ProcStat | undefined {
  const close = text.lastIndexOf(")");
  if (close < 0) return undefined;
  const fields = text
    .slice(close + 2)
    .trim()
    .split(/\s+/);
  const state = fields[0];
  const start = fields[19];
  return state !== undefined && start !== undefined && /^\d+$/.test(start) ? { state, start } : undefined;
}

function readQuietly(read: () => string): string {
  try {
    return read();
  } catch {
    return "";
  }
}

const selfStat = parseProcStat(readQuietly(() => readFileSync("/proc/self/stat", "utf8")));
/** True where `/proc/<pid>/stat` tells whether a pid is alive and when it started (Linux). */
const procSupported = selfStat !== undefined;

/**
 * This process, as written into lock markers and temp file names:
 * `<pid>.<start time in clock ticks since boot, or 0>.<host id>`, where the
 * host id hashes hostname, boot id and pid namespace, so that "same host id"
 * means "a pid in the name can be checked from here".
 */
const SELF = (() => {
  const host = createHash("sha256")
    .update(hostname())
    .update("\0")
    .update(readQuietly(() => readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim()))
    .update("\0")
    .update(readQuietly(() => readlinkSync("/proc/self/ns/pid")))
    .digest("hex")
    .slice(0, 12);
  const start = selfStat?.start ?? "0";
  return { pid: process.pid, start, host, token: `${process.pid}.${start}.${host}` };
})();

/**
 * This process's owner token, `<pid>.<start>.<host id>`, as it appears at the
 * start of lock markers (`~casq/locks/<sha256(key)>/<token>.<nonce>`) and
 * temp file names (`<name>~tmp~<token>.<nonce>`). For operator tooling and
 * tests that need to recognise (or fabricate) a given process's leftovers.
 */
export function fileStoreOwnerToken(): string {
  return SELF.token;
}

type Liveness = "alive" | "dead" | "unknown";

async function ownerLiveness(ownerName: string): Promise<Liveness> {
  const match = OWNER_RE.exec(ownerName);
  if (!match) return "unknown";
  const [, pidText = "", start = "", host = ""] = match;
  if (host !== SELF.host) return "unknown";
  const pid = Number(pidText);
  if (pid === SELF.pid) return start === SELF.start ? "alive" : "dead";
  if (procSupported) {
    let text: string;
    try {
      text = await readFile(`/proc/${pid}/stat`, "utf8");
    } catch (error) {
      if (errnoCode(error) === "ENOENT" || errnoCode(error) === "ESRCH") return "dead";
      return "unknown";
    }
    const procStat = parseProcStat(text);
    if (!procStat) return "unknown";
    if (procStat.state === "Z" || procStat.state === "X") return "dead";
    if (start !== "0" && procStat.start !== start) return "dead";
    return "alive";
  }
  try {
    process.kill(pid, 0);
    return "alive";
  } catch (error) {
    return errnoCode(error) === "ESRCH" ? "dead" : "alive";
  }
}

/** True when the owner of an internal file is dead, or unknown and silent for longer than `maxAgeMs`. */
async function isAbandoned(ownerName: string, filePath: string, maxAgeMs: number): Promise<boolean> {
  const liveness = await ownerLiveness(ownerName);
  if (liveness !== "unknown") return liveness === "dead";
  try {
    const info = await stat(filePath);
    return Date.now() - info.mtimeMs > maxAgeMs;
  } catch {
    return false;
  }
}

function newOwnerName(): string {
  return `${SELF.token}.${randomBytes(8).toString("hex")}`;
}

// ---------------------------------------------------------------------------
// Errors, signals, small helpers.
// ---------------------------------------------------------------------------

function errnoCode(error: unknown): string | undefined {
  if (typeof error !== "object" || error === null || !("code" in error)) return undefined;
  const code = (error as { code?: unknown }).code;
  return typeof code === "string" ? code : undefined;
}

const PATH_COLLISION_CODES = new Set(["ENOTDIR", "EISDIR", "EEXIST", "ENAMETOOLONG"]);

/**
 * The one place a file-system error becomes a {@link StoreError}. Store errors
 * pass through; errors that are not errno errors are bugs and pass unchanged.
 */
function classify(error: unknown, key: string | undefined, doing: string): unknown {
  if (error instanceof StoreError) return error;
  const code = errnoCode(error);
  if (code === undefined) return error;
  if (PATH_COLLISION_CODES.has(code))
    return new InvalidRequestError(
      key,
      `${doing} failed (${code}): a file is where a directory must be, or the reverse (in the file store a key cannot be both an object and a prefix of other keys)`,
      { cause: error },
    );
  return new UnavailableError(
    key,
    `${doing} failed (${code}); check the disk and the permissions of the store directory`,
    {
      cause: error,
    },
  );
}

/**
 * `mkdir -p` that fails instead of spinning: Node 20's `mkdirSync(path,
 * { recursive: true })` loops forever when `mkdir` of a missing component
 * answers ENOENT although its parent exists (e.g. anything under /proc).
 * This one walks up to the nearest existing ancestor, then creates each
 * missing component once, and throws the first real error.
 */
function makeDirsSync(dir: string): void {
  const missing: string[] = [];
  let at = path.resolve(dir);
  for (;;) {
    try {
      if (!statSync(at).isDirectory())
        throw Object.assign(new Error(`${at} is not a directory`), { code: "ENOTDIR" });
      break;
    } catch (error) {
      if (errnoCode(error) !== "ENOENT") throw error;
      const parent = path.dirname(at);
      if (parent === at) throw error;
      missing.push(at);
      at = parent;
    }
  }
  for (const component of missing.reverse()) {
    try {
      mkdirSync(component);
    } catch (error) {
      if (errnoCode(error) !== "EEXIST" || !statSync(component).isDirectory()) throw error;
    }
  }
}

/** Why the store directory cannot be used, as a {@link StoreMisconfiguredError} that says what to fix. */
function unusableRoot(error: unknown, root: string): unknown {
  if (error instanceof StoreError) return error;
  const code = errnoCode(error);
  if (code === undefined) return error;
  const why =
    code === "EACCES" || code === "EPERM"
      ? "permission denied: give the user running casq write access, or choose another directory"
      : code === "EROFS"
        ? "the file system is read-only: choose a writable directory"
        : code === "ENOTDIR" || code === "EEXIST"
          ? "a file is in the way where a directory must be: choose another path"
          : code === "ENOENT"
            ? "a parent directory does not exist and cannot be created there: choose a directory on a writable file system"
            : "check the disk and the path";
  return new StoreMisconfiguredError(
    undefined,
    `cannot create or write the store directory ${root} (${code}): ${why}`,
    { cause: error },
  );
}

function throwIfAborted(signal: AbortSignal | undefined, key: string, when: string): void {
  if (signal?.aborted) throw new UnavailableError(key, `the call was aborted ${when}`);
}

/** Resolves after `ms`, or as soon as `signal` aborts. */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

async function ignoreMissing(action: Promise<unknown>): Promise<void> {
  try {
    await action;
  } catch (error) {
    if (errnoCode(error) !== "ENOENT") throw error;
  }
}

const fsyncFd = promisify(fsyncCallback);
const openFd = promisify(openCallback);
const writeFd = promisify(writeCallback);

/** `write` until every byte of `bytes` is at `position` (a write may be short). */
function writeAllSync(fd: number, bytes: Uint8Array, position: number): void {
  let done = 0;
  while (done < bytes.byteLength)
    done += writeSync(fd, bytes, done, bytes.byteLength - done, position + done);
}

/** {@link writeAllSync} on the thread pool, for big bodies. */
async function writeAll(fd: number, bytes: Uint8Array, position: number): Promise<void> {
  let done = 0;
  while (done < bytes.byteLength) {
    const { bytesWritten } = await writeFd(fd, bytes, done, bytes.byteLength - done, position + done);
    done += bytesWritten;
  }
}

async function fsyncDir(dir: string): Promise<void> {
  const fd = openSync(dir, "r");
  try {
    await fsyncFd(fd);
  } finally {
    closeSync(fd);
  }
}

function parseHeader(bytes: Uint8Array): string | undefined {
  if (bytes.byteLength < HEADER_BYTES) return undefined;
  const match = HEADER_RE.exec(Buffer.from(bytes.buffer, bytes.byteOffset, HEADER_BYTES).toString("latin1"));
  return match ? `"${match[1]}"` : undefined;
}

/** What a key's path holds right now, read from one open file descriptor. */
type Current =
  | { readonly kind: "absent" }
  | { readonly kind: "directory" }
  | { readonly kind: "object"; readonly etag: string; readonly size: number };

function readCurrent(file: string): Current {
  let fd: number;
  try {
    fd = openSync(file, "r");
  } catch (error) {
    const code = errnoCode(error);
    if (code === "ENOENT" || code === "ENOTDIR") return { kind: "absent" };
    throw error;
  }
  try {
    const info = fstatSync(fd, { bigint: true });
    if (info.isDirectory()) return { kind: "directory" };
    const size = Number(info.size);
    const head = Buffer.alloc(Math.min(size, HEADER_BYTES));
    const bytesRead = readSync(fd, head, 0, head.byteLength, 0);
    const etag = parseHeader(head.subarray(0, bytesRead));
    if (etag !== undefined) return { kind: "object", etag, size: size - HEADER_BYTES };
    return { kind: "object", etag: rawEtag(info), size };
  } finally {
    closeSync(fd);
  }
}

function rawEtag(info: { ino: bigint; mtimeNs: bigint; size: bigint }): string {
  return `"raw-${info.ino}-${info.mtimeNs}-${info.size}"`;
}

// ---------------------------------------------------------------------------
// In-process mutex per key.
// ---------------------------------------------------------------------------

/** FIFO mutex per key; a waiter that gives up passes its turn on without blocking the queue. */
class KeyedMutex {
  private readonly tails = new Map<string, Promise<void>>();

  /** Waits for the key's turn; resolves to the release function. Rejects `unavailable` on abort or deadline. */
  async acquire(key: string, signal: AbortSignal | undefined, deadline: number): Promise<() => void> {
    const previous = this.tails.get(key) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((resolve) => {
      release = resolve;
    });
    const tail = previous.then(() => mine);
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    let turn = false;
    void previous.then(() => {
      turn = true;
    });
    await new Promise<void>((resolve) => {
      const finish = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", finish);
        resolve();
      };
      const timer = setTimeout(finish, Math.max(0, deadline - Date.now()));
      if (signal?.aborted) return finish();
      signal?.addEventListener("abort", finish, { once: true });
      void previous.then(finish);
    });
    if (!turn) {
      release();
      throwIfAborted(signal, key, "while waiting for the key's lock (nothing was written)");
      throw new UnavailableError(key, "timed out waiting for another call on the same key in this process");
    }
    return release;
  }
}

// ---------------------------------------------------------------------------
// Cross-process lock per key.
// ---------------------------------------------------------------------------

/** A staging directory holding my marker, ready to become a key's lock directory by one rename. */
interface StagedLock {
  readonly owner: string;
  readonly dir: string;
  /** When its marker was written (Date.now()). */
  readonly at: number;
}

/** A held key lock: refreshes its marker while held and can tell whether it was broken. */
class HeldLock {
  private readonly marker: string;
  private readonly heartbeat: NodeJS.Timeout;

  constructor(
    private readonly lockDir: string,
    ownerName: string,
    refreshMs: number,
    private readonly afterRelease: () => void,
  ) {
    this.marker = path.join(lockDir, ownerName);
    this.heartbeat = setInterval(() => {
      const now = new Date();
      utimes(this.marker, now, now).catch(() => {});
    }, refreshMs);
    this.heartbeat.unref();
  }

  /** Throws `unavailable` if another process broke this lock (then nothing must be committed). */
  assertHeld(key: string): void {
    try {
      statSync(this.marker);
    } catch (error) {
      if (errnoCode(error) === "ENOENT")
        throw new UnavailableError(
          key,
          "the key's lock was taken over as stale before the write committed; nothing was written",
        );
      throw error;
    }
  }

  /** Deletes the marker and the lock directory, then lets the next in-process caller in. Never throws. */
  async release(): Promise<void> {
    clearInterval(this.heartbeat);
    try {
      // ENOENT: already gone (broken as stale); ENOTEMPTY/EEXIST: the next holder moved in. Both fine.
      await unlink(this.marker).catch(() => {});
      await rmdir(this.lockDir).catch(() => {});
    } finally {
      this.afterRelease();
    }
  }
}

// ---------------------------------------------------------------------------
// The store.
// ---------------------------------------------------------------------------

/**
 * An {@link ObjectStore} on a local directory, safe between processes and
 * crash-safe (see the module comment for the protocol).
 */
export class FileStore implements ObjectStore {
  /** `file:` followed by the absolute root directory. */
  readonly description: string;
  /** The absolute root directory. */
  readonly root: string;
  private readonly locksDir: string;
  private readonly stagingDir: string;
  private readonly lockStaleMs: number;
  private readonly lockTimeoutMs: number;
  private readonly mutex = new KeyedMutex();
  private readonly sweptDirs = new Set<string>();
  /** Directories this store made or found; a put into one skips the mkdir (see doPut for one removed since). */
  private readonly knownDirs = new Set<string>();
  /** Lock releases still running after their call resolved (see releaseLater). */
  private readonly releases = new Set<Promise<void>>();
  /** A lock staged ahead of need (see acquireFileLock). */
  private spare: Promise<StagedLock> | undefined;
  private readonly inFlight = new Set<Promise<unknown>>();
  private stagingSwept = false;
  private closed = false;

  /** Opens (creating if missing) the store directory. Throws a {@link StoreError} if it cannot. */
  constructor(options: FileStoreOptions) {
    this.root = path.resolve(options.root);
    this.description = `file:${this.root}`;
    this.lockStaleMs = Math.max(100, options.lockStaleMs ?? DEFAULT_LOCK_STALE_MS);
    this.lockTimeoutMs = Math.max(0, options.lockTimeoutMs ?? DEFAULT_LOCK_TIMEOUT_MS);
    this.locksDir = path.join(this.root, FILE_STORE_INTERNAL_DIR, "locks");
    this.stagingDir = path.join(this.root, FILE_STORE_INTERNAL_DIR, "staging");
    try {
      makeDirsSync(this.locksDir);
      makeDirsSync(this.stagingDir);
      accessSync(this.locksDir, constants.W_OK);
    } catch (error) {
      throw unusableRoot(error, this.root);
    }
  }

  /** Reads a key; body and etag come from the same immutable file version. */
  get(key: string, options?: CallOptions): Promise<StoredObject | undefined> {
    return this.track(key, () => this.doGet(key, options?.signal));
  }

  /** Conditionally writes a key: temp file, fsync, then check and rename under the key's lock. */
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
    await Promise.allSettled([...this.inFlight]);
    await Promise.allSettled([...this.releases]);
    const spare = this.spare;
    this.spare = undefined;
    const staged = spare ? await spare.catch(() => undefined) : undefined;
    if (staged) await rm(staged.dir, { recursive: true, force: true }).catch(() => {});
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
      const data = bytes.subarray(0, offset);
      const etag = parseHeader(data);
      if (etag !== undefined) return { body: data.subarray(HEADER_BYTES), etag };
      return { body: data, etag: rawEtag(info) };
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
    const dir = path.dirname(file);
    const id = randomBytes(ETAG_ID_HEX / 2).toString("hex");
    const etag = `"${id}"`;
    const temp = `${file}${TEMP_INFIX}${newOwnerName()}`;
    let committed = false;
    try {
      await this.ensureDir(dir);
      try {
        await this.writeTemp(temp, id, body, key, signal);
      } catch (error) {
        if (errnoCode(error) !== "ENOENT" || !this.knownDirs.delete(dir)) throw error;
        // The directory was removed since this store made it: make it again, once.
        await this.ensureDir(dir);
        await this.writeTemp(temp, id, body, key, signal);
      }
      const lock = await this.lock(key, signal, deadline);
      try {
        const current = readCurrent(file);
        if (current.kind === "directory")
          throw new InvalidRequestError(
            key,
            "the key is a prefix of other keys; the file store cannot also store an object there",
          );
        if ("ifAbsent" in condition) {
          if (current.kind === "object") throw new PreconditionFailedError(key, "the key already exists");
        } else if (current.kind === "absent") {
          throw new PreconditionFailedError(key, "the key does not exist");
        } else if (current.etag !== condition.ifMatch) {
          throw new PreconditionFailedError(key, `etag is ${current.etag}, not ${condition.ifMatch}`);
        }
        throwIfAborted(signal, key, "before the write committed (nothing was written)");
        lock.assertHeld(key);
        await rename(temp, file);
        committed = true;
        try {
          await fsyncDir(dir);
        } catch (error) {
          throw new AmbiguousWriteError(
            key,
            `the new version is visible but syncing its directory failed (${errnoCode(error) ?? String(error)}); it may not survive a power loss`,
            { cause: error },
          );
        }
      } finally {
        // Not awaited: the answer need not wait for the lock's cleanup; the
        // next call on this key waits for it (the mutex is freed after it).
        this.releaseLater(lock);
      }
      return { etag };
    } catch (error) {
      throw classify(error, key, committed ? "syncing the written object" : "writing the object");
    } finally {
      if (!committed) await unlink(temp).catch(() => {});
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
      const lock = await this.lock(key, signal, Date.now() + this.lockTimeoutMs);
      try {
        const current = readCurrent(file);
        if (ifMatch !== undefined) {
          if (current.kind !== "object") throw new PreconditionFailedError(key, "the key does not exist");
          if (current.etag !== ifMatch)
            throw new PreconditionFailedError(key, `etag is ${current.etag}, not ${ifMatch}`);
        }
        if (current.kind !== "object") return;
        throwIfAborted(signal, key, "before the delete committed (nothing was deleted)");
        lock.assertHeld(key);
        await ignoreMissing(unlink(file));
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
        this.releaseLater(lock);
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
      writeAllSync(fd, Buffer.from(`${HEADER_MAGIC}${id}\n`, "latin1"), 0);
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
        await unlink(file).catch(() => {});
    }
  }

  /** Removes staging directories left by processes that died while acquiring a lock. */
  private async sweepStaging(): Promise<void> {
    for (const name of await readdir(this.stagingDir)) {
      const staged = path.join(this.stagingDir, name);
      if (await isAbandoned(name, staged, ORPHAN_MAX_AGE_MS))
        await rm(staged, { recursive: true, force: true });
    }
  }

  /** Takes the key's in-process mutex, then its cross-process lock (see the module comment). */
  private async lock(key: string, signal: AbortSignal | undefined, deadline: number): Promise<HeldLock> {
    const releaseMutex = await this.mutex.acquire(key, signal, deadline);
    try {
      return await this.acquireFileLock(key, signal, deadline, releaseMutex);
    } catch (error) {
      releaseMutex();
      throw error;
    }
  }

  private async acquireFileLock(
    key: string,
    signal: AbortSignal | undefined,
    deadline: number,
    afterRelease: () => void,
  ): Promise<HeldLock> {
    if (!this.stagingSwept) {
      this.stagingSwept = true;
      await this.sweepStaging().catch(() => {});
    }
    const lockDir = path.join(this.locksDir, createHash("sha256").update(key).digest("hex"));
    const refreshMs = Math.max(10, Math.floor(this.lockStaleMs / 3));
    let staged = await this.takeStagedLock(refreshMs);
    // The next lock's staging directory is made while this one is in use.
    if (!this.closed) this.spare = this.stageLock();
    let waits = 0;
    let quickRetries = 0;
    let healed = false;
    try {
      for (;;) {
        try {
          await rename(staged.dir, lockDir);
          return new HeldLock(lockDir, staged.owner, refreshMs, afterRelease);
        } catch (error) {
          const code = errnoCode(error);
          if (code === "ENOENT" && !healed) {
            // Someone removed the internal directory under us: recreate it once and retry.
            healed = true;
            await mkdir(this.locksDir, { recursive: true });
            await rm(staged.dir, { recursive: true, force: true }).catch(() => {});
            staged = await this.stageLock();
            continue;
          }
          if (code !== "ENOTEMPTY" && code !== "EEXIST") throw error;
        }
        const holder = await this.breakIfStale(key, lockDir);
        if (holder === undefined && quickRetries < 100) {
          quickRetries += 1;
          continue;
        }
        throwIfAborted(signal, key, "while waiting for the key's lock (nothing was written)");
        if (Date.now() >= deadline)
          throw new UnavailableError(
            key,
            `timed out after ${this.lockTimeoutMs} ms waiting for the key's lock held by ${holder ?? "another call"} (${lockDir}); if that process is gone, remove the directory`,
          );
        await sleep(Math.floor(backoffDelay(++waits, LOCK_WAIT_BACKOFF)), signal);
        quickRetries = 0;
      }
    } catch (error) {
      await rm(staged.dir, { recursive: true, force: true }).catch(() => {});
      throw error;
    }
  }

  /** Releases a lock without making the caller wait; {@link close} waits for it. */
  private releaseLater(lock: HeldLock): void {
    const release = lock.release();
    this.releases.add(release);
    void release.finally(() => this.releases.delete(release));
  }

  /** Makes a staging directory holding a new marker, ready to be renamed onto a lock path. */
  private async stageLock(): Promise<StagedLock> {
    const owner = newOwnerName();
    const dir = path.join(this.stagingDir, owner);
    const at = Date.now();
    await mkdir(dir, { recursive: true });
    // The marker's content is for humans; the protocol only uses its name and mtime.
    await writeFile(
      path.join(dir, owner),
      `${JSON.stringify({ pid: process.pid, host: hostname(), since: new Date(at).toISOString() })}\n`,
    );
    return { owner, dir, at };
  }

  /**
   * The spare staged lock if it is fresh (its marker's mtime must not look
   * stale to a waiter on another machine before the first refresh), else a
   * new one. Taken synchronously, so two calls never share one.
   */
  private async takeStagedLock(freshMs: number): Promise<StagedLock> {
    const pending = this.spare;
    this.spare = undefined;
    const spare = pending ? await pending.catch(() => undefined) : undefined;
    if (spare && Date.now() - spare.at < freshMs) return spare;
    if (spare) void rm(spare.dir, { recursive: true, force: true }).catch(() => {});
    return this.stageLock();
  }

  /**
   * Looks at a held lock. Deletes the holder's marker (by its exact name) if
   * the holder is dead, and then returns `undefined` (retry now); returns a
   * description of a live holder otherwise.
   */
  private async breakIfStale(key: string, lockDir: string): Promise<string | undefined> {
    let names: string[];
    try {
      names = await readdir(lockDir);
    } catch (error) {
      if (errnoCode(error) === "ENOENT") return undefined;
      throw error;
    }
    let live: string | undefined;
    for (const name of names) {
      const marker = path.join(lockDir, name);
      if (await isAbandoned(name, marker, this.lockStaleMs)) {
        await ignoreMissing(unlink(marker));
        await this.sweepTemps(path.dirname(this.pathOf(key)), path.basename(this.pathOf(key))).catch(
          () => {},
        );
      } else {
        live = `owner ${name}`;
      }
    }
    return live;
  }
}
