/**
 * A file-store put as one run of synchronous file calls, for the store's put
 * threads (put-thread.ts): the same on-disk protocol as the store's own
 * asynchronous path (file-store.ts), without a trip to libuv's thread pool
 * and back to the event loop between the calls.
 *
 * Why: on the machines we measure, each asynchronous file call costs ~50 µs
 * of CPU and a turn of the event loop, and a put makes about fifteen of them
 * (temp file, lock staging, renames, fsyncs, lock release). Run back to back
 * on a thread of their own, the same calls cost the broker's event loop one
 * message out and one back.
 *
 * The sequence, stopping at the first failure:
 *
 * 1. take the key's cross-process lock: make the staging directory holding
 *    this writer's marker and rename it onto the lock path. A lock held by
 *    anyone else ends the run with `lock-busy` (nothing written): the store
 *    then takes its asynchronous path, which waits for live holders and
 *    breaks dead ones (key-lock.ts);
 * 2. under the lock: check the condition against the current file and that
 *    the marker is still ours; then
 *    - a slotted file (slotted-file.ts) the body fits ({@link fitsInPlace}): write
 *      the version over its other slot and `fdatasync` (the commit point);
 *    - otherwise: create the temp file (`O_EXCL`), write the new file (a
 *      slotted one when the put overwrites, since the key will likely be
 *      overwritten again; else the version header and the body), fsync it,
 *      rename it over the target (the commit point), fsync the directory;
 * 3. remove the temp file if it was not committed, whatever happened; and
 *    release the lock (marker, then directory) in {@link SyncPutRun.finish},
 *    which the thread runs after it has sent the outcome, so that a commit
 *    is answered without waiting for its lock's release. When the thread
 *    stages its next lock there and held this one only briefly, the lock
 *    directory itself becomes the next staged lock (two renames,
 *    {@link restageLock}), so a put makes and deletes no file or directory.
 *
 * `aborted()` is asked before the lock and before the rename; once it says
 * yes nothing is committed.
 *
 * A lock held by this process (another put thread still releasing it after
 * answering, as step 4 allows) is waited for briefly before the run gives
 * up with `lock-busy`: the in-process mutex already ordered the two puts.
 */
import {
  closeSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readdirSync,
  renameSync,
  rmdirSync,
  rmSync,
  statSync,
  unlinkSync,
  utimesSync,
  writeSync,
} from "node:fs";
import path from "node:path";
import { errnoCode } from "./fs-errors.ts";
import { readCurrent, unmetCondition, versionHeader } from "./object-file.ts";
import { fileStoreOwnerToken } from "./owner-liveness.ts";
import { fitsInPlace, newSlottedFile, slottedCapacity, writeSlot } from "./slotted-file.ts";

/** Everything one put needs besides its body; paths are absolute. */
export interface SyncPutRequest {
  /** The object's file. */
  readonly file: string;
  /** The temp file to write first (in the object's directory, which must exist). */
  readonly temp: string;
  /** The new version's id: 32 hex digits (the etag, unquoted). */
  readonly id: string;
  /** Put-if-absent, or put-if-match `ifMatch`. */
  readonly ifAbsent: boolean;
  readonly ifMatch?: string;
  /** The key's lock directory (`~casq/locks/<sha256(key)>`). */
  readonly lockDir: string;
  /** This writer's staging directory (`~casq/staging/<owner>`), renamed onto `lockDir`. */
  readonly stagedDir: string;
  /** The marker file's name (the owner) and its content, for humans. */
  readonly marker: string;
  readonly markerText: string;
  /** Let the put thread stage its next lock ahead, under the same staging directory (see put-threads.ts). */
  readonly stageAhead?: boolean;
  /** After this put, stage these names for the thread's next put (see {@link stageLock}). */
  readonly stageNext?: StageNames;
}

/** A staging directory holding a marker: what a writer renames onto a key's lock path to take the lock. */
export interface StageNames {
  readonly stagedDir: string;
  readonly marker: string;
  readonly markerText: string;
}

/** What a {@link syncPut} run did. Every outcome but `ok` and `ambiguous` committed nothing. */
export type SyncPutOutcome =
  | { readonly kind: "ok" }
  /** The condition does not hold (the message says how). */
  | { readonly kind: "precondition"; readonly message: string }
  /** The key's path is a directory (the key is a prefix of other keys). */
  | { readonly kind: "prefix" }
  /** `aborted()` said yes before the commit point. */
  | { readonly kind: "aborted" }
  /** Someone else holds the key's lock (or the locks or staging directory is gone): take the asynchronous path. */
  | { readonly kind: "lock-busy" }
  /** Our marker disappeared while we held the lock (broken as stale by another process). */
  | { readonly kind: "lock-lost" }
  /** A file call failed before the commit point (`step` names it; `code` is the errno code). */
  | { readonly kind: "failed"; readonly step: SyncPutStep; readonly code: string; readonly message: string }
  /** The rename landed but the directory's fsync failed, or a slot was written but its fdatasync failed: visible, durability unknown. */
  | { readonly kind: "ambiguous"; readonly code: string };

/** Where a failed run stopped: writing the temp file, taking the lock, or checking and writing or renaming under it. */
export type SyncPutStep = "temp" | "lock" | "commit";

function failure(step: SyncPutStep, error: unknown): SyncPutOutcome {
  const code = errnoCode(error);
  if (code === undefined) throw error; // not a file-system error: a bug, let it surface
  return { kind: "failed", step, code, message: error instanceof Error ? error.message : String(error) };
}

function writeAll(fd: number, bytes: Uint8Array, position: number): void {
  let done = 0;
  while (done < bytes.byteLength)
    done += writeSync(fd, bytes, done, bytes.byteLength - done, position + done);
}

function quietly(action: () => void): void {
  try {
    action();
  } catch {
    // best effort: leftovers are swept by liveness (see owner-liveness.ts)
  }
}

/** What a {@link syncPut} run decided, and the release of the key's lock it may still hold. */
export interface SyncPutRun {
  readonly outcome: SyncPutOutcome;
  /**
   * Releases the key's lock if the run took it; with `next`, also stages
   * that lock for the next put: the released lock itself when it was held
   * only briefly ({@link restageLock}), else a new one ({@link stageLock}).
   * Returns whether `next` is staged. Never throws.
   */
  readonly finish: (next?: StageNames) => boolean;
}

/**
 * Runs one put up to its outcome (see the module header); the caller runs
 * `finish` after it has passed the outcome on. `stagedAt` (performance.now())
 * says when `request.stagedDir` was staged ahead, if it was: the run then
 * only renames it (touching its marker first if it is no longer fresh).
 * `recycleWithinMs` bounds how long the lock may have been held for `finish`
 * to hand it on whole ({@link RECYCLE_WITHIN_MS}; tests change it). Throws
 * only for errors that are not file-system errors (after cleaning up).
 */
export function syncPut(
  request: SyncPutRequest,
  body: Uint8Array,
  aborted: () => boolean,
  stagedAt?: number,
  recycleWithinMs: number = RECYCLE_WITHIN_MS,
): SyncPutRun {
  let tempMade = false;
  let locked = false;
  let committed = false;
  /** When the run began to take the lock (its marker was fresh then, see {@link takeLock}). */
  let takingAt = 0;
  const finish = (next?: StageNames): boolean => {
    if (!locked) return stageAfresh(next);
    locked = false;
    if (next !== undefined && performance.now() - takingAt < recycleWithinMs && restageLock(request, next))
      return true;
    // ENOENT: broken as stale; ENOTEMPTY: the next holder moved in. Both fine.
    quietly(() => unlinkSync(path.join(request.lockDir, request.marker)));
    quietly(() => rmdirSync(request.lockDir));
    return stageAfresh(next);
  };
  const run = (): SyncPutOutcome => {
    if (aborted()) return { kind: "aborted" };
    takingAt = performance.now();
    const busy = takeLock(request, stagedAt);
    if (busy !== undefined) return busy;
    locked = true;
    let step: SyncPutStep = "commit";
    try {
      const current = readCurrent(request.file);
      if (current.kind === "directory") return { kind: "prefix" };
      const unmet = unmetCondition(
        current,
        request.ifAbsent ? { ifAbsent: true } : { ifMatch: request.ifMatch ?? "" },
      );
      if (unmet !== undefined) return { kind: "precondition", message: unmet };
      if (aborted()) return { kind: "aborted" };
      if (!markerStillOurs(request)) return { kind: "lock-lost" };
      const id = Buffer.from(request.id, "hex");
      if (
        current.kind === "object" &&
        current.slotted !== undefined &&
        fitsInPlace(current.slotted.capacity, body.byteLength)
      ) {
        const failed = writeSlot(request.file, current.slotted, id, body);
        if (failed === undefined) return { kind: "ok" };
        if (failed.visible)
          return { kind: "ambiguous", code: errnoCode(failed.error) ?? String(failed.error) };
        return failure("commit", failed.error);
      }
      step = "temp";
      let fd: number;
      try {
        fd = openSync(request.temp, "wx");
      } catch (error) {
        return failure("temp", error);
      }
      tempMade = true;
      try {
        if (request.ifAbsent) {
          const header = Buffer.from(versionHeader(request.id), "latin1");
          writeAll(fd, header, 0);
          writeAll(fd, body, header.byteLength);
        } else {
          writeAll(fd, newSlottedFile(slottedCapacity(body.byteLength), id, body), 0);
        }
        fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
      step = "commit";
      if (aborted()) return { kind: "aborted" };
      if (!markerStillOurs(request)) return { kind: "lock-lost" };
      renameSync(request.temp, request.file);
      committed = true;
      try {
        syncDirectory(path.dirname(request.file));
      } catch (error) {
        return { kind: "ambiguous", code: errnoCode(error) ?? String(error) };
      }
      return { kind: "ok" };
    } catch (error) {
      return failure(step, error);
    }
  };
  let outcome: SyncPutOutcome;
  try {
    outcome = run();
  } catch (error) {
    finish();
    throw error;
  } finally {
    if (tempMade && !committed) quietly(() => unlinkSync(request.temp));
  }
  return { outcome, finish };
}

/** How long, at most, a run waits for a lock this process holds (a sibling thread releasing it). */
const OWN_LOCK_WAIT_MS = 2;
/** Each wait for such a lock, in milliseconds. */
const OWN_LOCK_POLL_MS = 0.05;
/** Something to `Atomics.wait` on for a short sleep (nobody notifies it). */
const napCell = new Int32Array(new SharedArrayBuffer(4));

/**
 * A marker staged ahead longer ago than this (ms) gets its mtime refreshed
 * before it becomes a lock: a waiter that cannot check the holder's pid
 * judges it by age (at least 100 ms, see key-lock.ts).
 */
const STAGED_FRESH_MS = 20;

/**
 * Makes `names.stagedDir` holding its marker (a lock ready to be taken with
 * one rename). On failure removes what it made and returns the error.
 */
export function stageLock(names: StageNames): unknown {
  try {
    mkdirSync(names.stagedDir);
    const marker = openSync(path.join(names.stagedDir, names.marker), "wx");
    try {
      writeAll(marker, Buffer.from(names.markerText), 0);
    } finally {
      closeSync(marker);
    }
    return undefined;
  } catch (error) {
    quietly(() => rmSync(names.stagedDir, { recursive: true, force: true }));
    return error;
  }
}

/**
 * A lock released within this many milliseconds of the run starting to take
 * it is handed on whole to the next staged lock ({@link restageLock}). Its
 * marker was at most {@link STAGED_FRESH_MS} old when taken, so it is under
 * ~60 ms old at the release, and a waiter judges a marker stale only after
 * `lockStaleMs` (100 ms at the least, see key-lock.ts) without a refresh; a
 * waiter on this machine never breaks a live holder. A timing assumption,
 * as the protocol's others are: a holder frozen for longer than
 * `lockStaleMs` between its last check and its next step can be broken by a
 * waiter that cannot check its pid.
 */
export const RECYCLE_WITHIN_MS = 40;

/**
 * Releases the lock `request` holds by making it `next`'s staged lock:
 * checks that our marker is still in the lock directory, renames the
 * directory (the marker still in it, so nobody can move in meanwhile) to
 * next's staging path, then the marker to next's name, and refreshes the
 * marker's mtime (a waiter that cannot check the holder's pid judges a
 * marker by its age). Two renames instead of deleting a directory and a
 * file and making new ones: on ext4 without a journal, every inode made
 * scans past those deleted in the last minute or more, which made inode
 * allocation a large share of a put thread's time. Should the directory
 * moved not hold our marker after all, it is moved back. False when it did
 * not hand the lock on; the caller then releases what is left as usual.
 */
function restageLock(request: SyncPutRequest, next: StageNames): boolean {
  try {
    // Ours a moment ago (a lock broken as stale is left alone: the usual release finds nothing).
    if (!markerStillOurs(request)) return false;
    renameSync(request.lockDir, next.stagedDir);
  } catch {
    return false;
  }
  const marker = path.join(next.stagedDir, next.marker);
  try {
    renameSync(path.join(next.stagedDir, request.marker), marker);
  } catch {
    quietly(() => renameSync(next.stagedDir, request.lockDir));
    return false;
  }
  try {
    const now = new Date();
    utimesSync(marker, now, now);
    return true;
  } catch {
    return false; // an old mtime must not be staged as fresh: the caller removes it and stages anew
  }
}

/** Stages `next`, when given, as a new directory and marker ({@link stageLock}); true when it is staged. */
export function stageAfresh(next: StageNames | undefined): boolean {
  return next !== undefined && stageLock(next) === undefined;
}

/** Stages this writer's marker (unless staged ahead) and renames it onto the lock path; undefined when the lock is ours. */
function takeLock(request: SyncPutRequest, stagedAt: number | undefined): SyncPutOutcome | undefined {
  if (stagedAt === undefined) {
    const error = stageLock(request);
    // The staging directory itself is gone: the asynchronous path makes it again.
    if (error !== undefined)
      return errnoCode(error) === "ENOENT" ? { kind: "lock-busy" } : failure("lock", error);
  } else if (performance.now() - stagedAt > STAGED_FRESH_MS) {
    const now = new Date();
    quietly(() => utimesSync(path.join(request.stagedDir, request.marker), now, now));
  }
  const giveUpAt = performance.now() + OWN_LOCK_WAIT_MS;
  for (;;) {
    try {
      renameSync(request.stagedDir, request.lockDir);
      return undefined;
    } catch (error) {
      const code = errnoCode(error);
      const busy = code === "ENOTEMPTY" || code === "EEXIST";
      if (busy && heldByThisProcess(request.lockDir) && performance.now() < giveUpAt) {
        Atomics.wait(napCell, 0, 0, OWN_LOCK_POLL_MS);
        continue;
      }
      quietly(() => rmSync(request.stagedDir, { recursive: true, force: true }));
      if (busy || code === "ENOENT") return { kind: "lock-busy" };
      return failure("lock", error);
    }
  }
}

/** False when our marker left the lock directory (the lock was broken as stale and may be someone else's now). */
function markerStillOurs(request: SyncPutRequest): boolean {
  try {
    statSync(path.join(request.lockDir, request.marker));
    return true;
  } catch (error) {
    if (errnoCode(error) === "ENOENT") return false;
    throw error;
  }
}

/** True when the lock directory's marker names this process (see owner-liveness.ts). */
function heldByThisProcess(lockDir: string): boolean {
  try {
    const [marker] = readdirSync(lockDir);
    return marker?.startsWith(`${fileStoreOwnerToken()}.`) ?? false;
  } catch {
    return false;
  }
}

/** Fsyncs a directory, so that the rename in it survives a power loss. */
function syncDirectory(dir: string): void {
  const fd = openSync(dir, "r");
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}
