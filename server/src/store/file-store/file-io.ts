/**
 * The file calls the store makes outside of Node's promise API: writes that
 * loop over short writes (synchronous for small bodies, on the thread pool for
 * big ones), fsyncs of files and directories, and a `mkdir -p` that fails
 * instead of spinning.
 *
 * The calls of a put's critical path (open, rename, unlink, rmdir, mkdir)
 * are Node's callback functions wrapped by `promisify`, not `node:fs/promises`:
 * the promise API builds a `FileHandle` and more promise machinery per call,
 * which costs several times the callback call's CPU, and a put makes about
 * ten of them (see the file store's "Where the time goes").
 */
import {
  closeSync,
  fsync as fsyncCallback,
  mkdir as mkdirCallback,
  mkdirSync,
  open as openCallback,
  openSync,
  rename as renameCallback,
  rmdir as rmdirCallback,
  statSync,
  unlink as unlinkCallback,
  write as writeCallback,
  writeSync,
} from "node:fs";
import path from "node:path";
import { promisify } from "node:util";
import { errnoCode } from "./fs-errors.ts";

/**
 * `mkdir -p` that fails instead of spinning: Node 20's `mkdirSync(path,
 * { recursive: true })` loops forever when `mkdir` of a missing component
 * answers ENOENT although its parent exists (e.g. anything under /proc).
 * This one walks up to the nearest existing ancestor, then creates each
 * missing component once, and throws the first real error.
 */
export function makeDirsSync(dir: string): void {
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

/** `fsync(fd)` on the thread pool. */
export const fsyncFd = promisify(fsyncCallback);
/** `open(path, flags)` on the thread pool; resolves to the file descriptor. */
export const openFd = promisify(openCallback);
const writeFd = promisify(writeCallback);
/** `rename(from, to)` on the thread pool. */
export const renamePath = promisify(renameCallback);
/** `unlink(path)` on the thread pool. */
export const unlinkPath = promisify(unlinkCallback);
/** `rmdir(path)` on the thread pool. */
export const rmdirPath = promisify(rmdirCallback);
/** `mkdir(path, options)` on the thread pool; with `recursive`, resolves to the first directory made, if any. */
export const mkdirPath = promisify(mkdirCallback);

/** Creates the file `file` (it must not exist) holding `text`: one trip to the thread pool, then a synchronous write of a few bytes. */
export async function writeNewSmallFile(file: string, text: string): Promise<void> {
  const fd = await openFd(file, "wx");
  try {
    writeAllSync(fd, Buffer.from(text), 0);
  } finally {
    closeSync(fd);
  }
}

/** `write` until every byte of `bytes` is at `position` (a write may be short). */
export function writeAllSync(fd: number, bytes: Uint8Array, position: number): void {
  let done = 0;
  while (done < bytes.byteLength)
    done += writeSync(fd, bytes, done, bytes.byteLength - done, position + done);
}

/** {@link writeAllSync} on the thread pool, for big bodies. */
export async function writeAll(fd: number, bytes: Uint8Array, position: number): Promise<void> {
  let done = 0;
  while (done < bytes.byteLength) {
    const { bytesWritten } = await writeFd(fd, bytes, done, bytes.byteLength - done, position + done);
    done += bytesWritten;
  }
}

/** Fsyncs a directory, so that renames and unlinks in it survive a power loss. */
export async function fsyncDir(dir: string): Promise<void> {
  const fd = openSync(dir, "r");
  try {
    await fsyncFd(fd);
  } finally {
    closeSync(fd);
  }
}
