/**
 * The file store's cross-process lock per key, taken around the check and the
 * commit of every put and delete.
 *
 * The lock of a key is the directory `~casq/locks/<sha256(key)>`; the holder is
 * named by the single marker file inside it (`<pid>.<start>.<host>.<nonce>`).
 * - Acquire: build a staging directory that already contains my marker, then
 *   `rename` it onto the lock path. The kernel makes that atomic, and lets it
 *   succeed only when the lock path is missing or an EMPTY directory, so exactly
 *   one contender wins and the lock is never observed half-made.
 * - Release: delete my marker, then `rmdir` the (now empty) lock directory.
 *   A put thread that held the lock only briefly (well under the least
 *   `lockStaleMs`, so no waiter can have judged it stale unless the thread
 *   was frozen meanwhile) releases it instead by renaming the lock
 *   directory, marker and all, to the staging path of its next lock
 *   (sync-put.ts): no file or directory made or deleted per put.
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
 * - Within one process, calls on the same key also queue on an in-memory mutex
 *   (keyed-mutex.ts), so concurrent callers do not spin on the file system.
 * - Staging directories of processes that died while acquiring are removed
 *   (by the first lock a store takes) once their owner is known dead.
 */
import { createHash } from "node:crypto";
import { statSync } from "node:fs";
import { mkdir, readdir, rm, utimes } from "node:fs/promises";
import { hostname } from "node:os";
import path from "node:path";
import { type Backoff, backoffDelay } from "@casq/sdk/backoff.ts";
import { UnavailableError } from "../store-errors.ts";
import { mkdirPath, renamePath, rmdirPath, unlinkPath, writeNewSmallFile } from "./file-io.ts";
import { errnoCode, ignoreMissing, throwIfAborted } from "./fs-errors.ts";
import { KeyedMutex } from "./keyed-mutex.ts";
import { isAbandoned, newOwnerName, ORPHAN_MAX_AGE_MS } from "./owner-liveness.ts";

/** Polling a held lock: after 1..2 ms, doubling, up to 20..40 ms (equal jitter, so waiters spread). */
const LOCK_WAIT_BACKOFF: Backoff = { immediateRetries: 0, baseDelayMs: 2, maxDelayMs: 40, jitter: "equal" };

/** What a write learns when its lock was broken as stale by another process before it committed. */
export const LOCK_TAKEN_OVER =
  "the key's lock was taken over as stale before the write committed; nothing was written";

/** A staging directory holding my marker, ready to become a key's lock directory by one rename. */
interface StagedLock {
  readonly owner: string;
  readonly dir: string;
  /** When its marker was written (Date.now()). */
  readonly at: number;
}

/** A held key lock: refreshes its marker while held and can tell whether it was broken. */
export class HeldLock {
  private readonly marker: string;
  private readonly heartbeat: NodeJS.Timeout;

  /** A lock just renamed into place at `lockDir` with marker `ownerName`; touches the marker every `refreshMs`. */
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
      if (errnoCode(error) === "ENOENT") throw new UnavailableError(key, LOCK_TAKEN_OVER);
      throw error;
    }
  }

  /** Deletes the marker and the lock directory, then lets the next in-process caller in. Never throws. */
  async release(): Promise<void> {
    clearInterval(this.heartbeat);
    try {
      // ENOENT: already gone (broken as stale); ENOTEMPTY/EEXIST: the next holder moved in. Both fine.
      await unlinkPath(this.marker).catch(() => {});
      await rmdirPath(this.lockDir).catch(() => {});
    } finally {
      this.afterRelease();
    }
  }
}

/** Where a store's locks live and how long they are waited for (see {@link KeyLocks}). */
export interface KeyLocksOptions {
  /** `~casq/locks` under the store's root: one directory per held key lock. */
  readonly locksDir: string;
  /** `~casq/staging` under the store's root: locks being made, before their rename into `locksDir`. */
  readonly stagingDir: string;
  /** How long a marker whose owner cannot be checked by pid may go unrefreshed before it is broken. */
  readonly lockStaleMs: number;
  /** How long a call waits for a lock held by a live process (for the timeout's message; callers pass the deadline). */
  readonly lockTimeoutMs: number;
  /**
   * Called after a dead holder's marker of `key` was deleted, so the store can
   * remove that writer's temp files; its failure is ignored.
   */
  readonly onBreak: (key: string) => Promise<void>;
}

/**
 * The per-key locks of one store directory: the in-process mutex, then the
 * cross-process lock directory (see the module comment). One lock is staged
 * ahead of need, and a lock is released after the call that held it answered
 * ({@link close} waits for those releases).
 */
export class KeyLocks {
  private readonly locksDir: string;
  private readonly stagingDir: string;
  private readonly lockStaleMs: number;
  private readonly lockTimeoutMs: number;
  private readonly onBreak: (key: string) => Promise<void>;
  private readonly mutex = new KeyedMutex();
  /** Lock releases still running after their call resolved (see releaseLater). */
  private readonly releases = new Set<Promise<void>>();
  /** A lock staged ahead of need (see acquireFileLock). */
  private spare: Promise<StagedLock> | undefined;
  private stagingSwept = false;
  private closed = false;

  /** Locks under `options.locksDir`; both directories must exist (the store makes them when it opens). */
  constructor(options: KeyLocksOptions) {
    this.locksDir = options.locksDir;
    this.stagingDir = options.stagingDir;
    this.lockStaleMs = options.lockStaleMs;
    this.lockTimeoutMs = options.lockTimeoutMs;
    this.onBreak = options.onBreak;
  }

  /**
   * Stops staging locks ahead at once; once `callsDone` settles (the store's
   * calls in flight), waits for the releases still running and removes the
   * spare staged lock.
   */
  async close(callsDone: Promise<unknown>): Promise<void> {
    this.closed = true;
    await callsDone;
    await Promise.allSettled([...this.releases]);
    const spare = this.spare;
    this.spare = undefined;
    const staged = spare ? await spare.catch(() => undefined) : undefined;
    if (staged) await rm(staged.dir, { recursive: true, force: true }).catch(() => {});
  }

  /** Takes the key's in-process mutex, then its cross-process lock; rejects `unavailable` at `deadline` or on abort. */
  async lock(key: string, signal: AbortSignal | undefined, deadline: number): Promise<HeldLock> {
    const releaseMutex = await this.mutex.acquire(key, signal, deadline);
    try {
      return await this.acquireFileLock(key, signal, deadline, releaseMutex);
    } catch (error) {
      releaseMutex();
      throw error;
    }
  }

  /**
   * Takes only the key's in-process mutex, for a caller that takes the
   * cross-process lock itself (a put thread, see sync-put.ts) with
   * {@link stageFor}; resolves to its release function.
   */
  async turn(key: string, signal: AbortSignal | undefined, deadline: number): Promise<() => void> {
    await this.sweepStagingOnce();
    return this.mutex.acquire(key, signal, deadline);
  }

  /**
   * Where the key's lock lives and what a new holder stages to take it: a
   * fresh owner name, its staging directory and its marker's content (for
   * humans; the protocol uses the name and the mtime).
   */
  stageFor(key: string): { lockDir: string; stagedDir: string; marker: string; markerText: string } {
    const owner = newOwnerName();
    return {
      lockDir: this.lockDirOf(key),
      stagedDir: path.join(this.stagingDir, owner),
      marker: owner,
      markerText: markerText(),
    };
  }

  private lockDirOf(key: string): string {
    return path.join(this.locksDir, createHash("sha256").update(key).digest("hex"));
  }

  private async sweepStagingOnce(): Promise<void> {
    if (this.stagingSwept) return;
    this.stagingSwept = true;
    await this.sweepStaging().catch(() => {});
  }

  /** Removes staging directories left by processes that died while acquiring a lock. */
  private async sweepStaging(): Promise<void> {
    for (const name of await readdir(this.stagingDir)) {
      const staged = path.join(this.stagingDir, name);
      if (await isAbandoned(name, staged, ORPHAN_MAX_AGE_MS))
        await rm(staged, { recursive: true, force: true });
    }
  }

  /** Renames a staged lock onto the key's lock path, breaking stale holders and backing off from live ones. */
  private async acquireFileLock(
    key: string,
    signal: AbortSignal | undefined,
    deadline: number,
    afterRelease: () => void,
  ): Promise<HeldLock> {
    await this.sweepStagingOnce();
    const lockDir = this.lockDirOf(key);
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
          await renamePath(staged.dir, lockDir);
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
  releaseLater(lock: HeldLock): void {
    const release = lock.release();
    this.releases.add(release);
    void release.finally(() => this.releases.delete(release));
  }

  /** Makes a staging directory holding a new marker, ready to be renamed onto a lock path. */
  private async stageLock(): Promise<StagedLock> {
    const owner = newOwnerName();
    const dir = path.join(this.stagingDir, owner);
    const at = Date.now();
    await mkdirPath(dir, { recursive: true });
    // The marker's content is for humans; the protocol only uses its name and mtime.
    await writeNewSmallFile(path.join(dir, owner), markerText());
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
        await ignoreMissing(unlinkPath(marker));
        await this.onBreak(key).catch(() => {});
      } else {
        live = `owner ${name}`;
      }
    }
    return live;
  }
}

/** This machine's name, read once: a system call each time otherwise, and every put writes a marker. */
const HOST = hostname();

/**
 * A lock marker's content, for humans reading a lock directory: who holds
 * it. Not when: a put thread moves its marker from lock to lock (sync-put.ts),
 * and the marker's mtime says when it was last staged or refreshed.
 */
function markerText(): string {
  return `${JSON.stringify({ pid: process.pid, host: HOST })}\n`;
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
