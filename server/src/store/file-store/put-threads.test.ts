/**
 * The file store's put threads: puts really run there (a failed thread start
 * would silently fall back to the event loop's path, which the conformance
 * suite cannot tell apart), each outcome of the synchronous sequence, and
 * aborts of queued and running puts.
 */
import { existsSync, mkdirSync, readdirSync, renameSync, rmdirSync, rmSync, writeFileSync } from "node:fs";
import {
  mkdir,
  mkdtemp,
  open,
  readdir,
  readFile,
  rm,
  rmdir,
  stat,
  utimes,
  writeFile,
} from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { FILE_STORE_INTERNAL_DIR, FileStore } from "../file-store.ts";
import { isStoreError } from "../store-errors.ts";
import { fileStoreOwnerToken } from "./owner-liveness.ts";
import { PutThreads, putThreads } from "./put-threads.ts";
import { parseSlotted } from "./slotted-file.ts";
import { type SyncPutRequest, syncPut } from "./sync-put.ts";

const bytes = (text: string) => new TextEncoder().encode(text);

describe("file store put threads", () => {
  let root: string;

  beforeEach(async () => {
    root = await mkdtemp(path.join(tmpdir(), "casq-put-threads-"));
    await mkdir(path.join(root, "locks"));
    await mkdir(path.join(root, "staging"));
  });

  afterEach(async () => {
    await rm(root, { recursive: true, force: true });
  });

  /**
   * The listing of `dir` once it is empty, or after 5 s: a thread releases a
   * put's lock after it answered, so the lock can outlive the answer a moment.
   */
  async function released(dir: string): Promise<string[]> {
    for (let waited = 0; (await readdir(dir)).length > 0 && waited < 5_000; waited += 10)
      await new Promise((resolve) => setTimeout(resolve, 10));
    return readdir(dir);
  }

  let nextOwner = 0;
  /** A request for `name` in `root`, with a lock and staging directory of its own. */
  function request(name: string, condition: { ifAbsent: true } | { ifMatch: string }): SyncPutRequest {
    const owner = `owner-${++nextOwner}`;
    return {
      file: path.join(root, name),
      temp: path.join(root, `${name}~tmp~${owner}`),
      id: "ab".repeat(16),
      ifAbsent: "ifAbsent" in condition,
      ifMatch: "ifMatch" in condition ? condition.ifMatch : undefined,
      lockDir: path.join(root, "locks", name.replaceAll("/", "_")),
      stagedDir: path.join(root, "staging", owner),
      marker: owner,
      markerText: "{}\n",
    };
  }

  it("a file store's puts run on the process's put threads", async () => {
    const store = new FileStore({ root: path.join(root, "store") });
    try {
      const before = putThreads.counts.answered;
      let etag = (await store.put("queues/q/0.json", bytes("v0"), { ifAbsent: true })).etag;
      for (let i = 1; i <= 5; i++)
        etag = (await store.put("queues/q/0.json", bytes(`v${i}`), { ifMatch: etag })).etag;
      expect(putThreads.counts.answered - before).toBe(6);
      expect(putThreads.counts.started).toBeGreaterThanOrEqual(1);
      expect(new TextDecoder().decode((await store.get("queues/q/0.json"))?.body)).toBe("v5");
    } finally {
      await store.close();
    }
  });

  it("answers each outcome of the sequence and leaves no lock, staging or temp file behind", async () => {
    const threads = new PutThreads({ maxThreads: 1 });
    const etag = `"${"ab".repeat(16)}"`;
    expect(await threads.run(request("doc", { ifAbsent: true }), bytes("one"))).toEqual({ kind: "ok" });
    expect(await readFile(path.join(root, "doc"), "utf8")).toBe(`casq-object/1 ${"ab".repeat(16)}\none`);
    expect(await threads.run(request("doc", { ifAbsent: true }), bytes("two"))).toEqual({
      kind: "precondition",
      message: "the key already exists",
    });
    expect(await threads.run(request("doc", { ifMatch: '"other"' }), bytes("two"))).toMatchObject({
      kind: "precondition",
    });
    expect(await threads.run(request("doc", { ifMatch: etag }), bytes("two"))).toEqual({ kind: "ok" });
    expect(await threads.run(request("missing", { ifMatch: etag }), bytes("x"))).toEqual({
      kind: "precondition",
      message: "the key does not exist",
    });
    await mkdir(path.join(root, "prefix"));
    expect(await threads.run(request("prefix", { ifAbsent: true }), bytes("x"))).toEqual({ kind: "prefix" });
    // A lock held by anyone else: nothing written, the store's own path takes over.
    await mkdir(path.join(root, "locks", "doc"));
    await writeFile(path.join(root, "locks", "doc", "someone"), "{}\n");
    expect(await threads.run(request("doc", { ifMatch: etag }), bytes("three"))).toEqual({
      kind: "lock-busy",
    });
    await rm(path.join(root, "locks", "doc"), { recursive: true });
    expect(await threads.run(request("nodir/doc", { ifAbsent: true }), bytes("x"))).toMatchObject({
      kind: "failed",
      step: "temp",
      code: "ENOENT",
    });

    // Overwritten: the file is a slotted one now (slotted-file.ts), holding "two".
    const doc = parseSlotted(await readFile(path.join(root, "doc")));
    expect(new TextDecoder().decode(doc?.body)).toBe("two");
    expect(doc?.etag).toBe(etag);
    expect(await released(path.join(root, "locks"))).toEqual([]);
    expect(await released(path.join(root, "staging"))).toEqual([]);
    expect((await readdir(root)).filter((name) => name.includes("~tmp~"))).toEqual([]);
  });

  it("starts a second thread for puts that would wait, and ends it once it sat idle", async () => {
    const threads = new PutThreads({ maxThreads: 2, spareIdleMs: 200 });
    const big = new Uint8Array(2 * 1024 * 1024).fill(1);
    const outcomes = await Promise.all(
      ["a", "b", "c", "d", "e", "f"].map((name) => threads.run(request(name, { ifAbsent: true }), big)),
    );
    expect(outcomes).toEqual(Array(6).fill({ kind: "ok" }));
    expect(threads.counts.started).toBe(2);
    for (let waited = 0; threads.threadCount > 1 && waited < 10_000; waited += 50)
      await new Promise((resolve) => setTimeout(resolve, 50));
    expect(threads.threadCount).toBe(1);
    expect(await threads.run(request("g", { ifAbsent: true }), bytes("x"))).toEqual({ kind: "ok" });
    expect(threads.counts.started).toBe(2);
  });

  it("an abort removes a queued put, and stops a running one before it commits", async () => {
    const threads = new PutThreads({ maxThreads: 1 });
    expect(await threads.run(request("warm", { ifAbsent: true }), bytes("x"))).toEqual({ kind: "ok" });
    const first = new AbortController();
    const second = new AbortController();
    // The thread is ready and idle: the first put is sent at once, the second waits behind it.
    // The first is large (its temp file takes the thread many milliseconds to write and fsync),
    // so the abort below lands before the thread's first check even on a loaded machine.
    const large = new Uint8Array(32 * 1024 * 1024).fill(120);
    const running = threads.run(request("first", { ifAbsent: true }), large, first.signal);
    const queued = threads.run(request("second", { ifAbsent: true }), bytes("x"), second.signal);
    second.abort();
    first.abort(); // while the thread writes the temp file: it stops at its first check
    expect(await queued).toEqual({ kind: "aborted" });
    expect(await running).toEqual({ kind: "aborted" });
    expect(existsSync(path.join(root, "first"))).toBe(false);
    expect(existsSync(path.join(root, "second"))).toBe(false);
    expect(await threads.run(request("late", { ifAbsent: true }), bytes("x"), first.signal)).toEqual({
      kind: "aborted",
    });
    expect(await released(path.join(root, "locks"))).toEqual([]);
    expect(await released(path.join(root, "staging"))).toEqual([]);
    expect((await readdir(root)).filter((name) => name.includes("~tmp~"))).toEqual([]);
  });

  it("a thread that dies holding the key's lock: the put is ambiguous and the store removes what it left", async () => {
    // Takes the lock and leaves a temp file, then ends the thread, as a crash mid-put would.
    const dying = new PutThreads({
      maxThreads: 1,
      script: `
        const { parentPort } = require("node:worker_threads");
        const fs = require("node:fs");
        const path = require("node:path");
        parentPort.on("message", ({ request }) => {
          fs.writeFileSync(request.temp, "torn");
          fs.mkdirSync(request.stagedDir);
          fs.writeFileSync(path.join(request.stagedDir, request.marker), "{}");
          fs.renameSync(request.stagedDir, request.lockDir);
          process.exit(1);
        });
        parentPort.postMessage({ ready: true });`,
    });
    const dir = path.join(root, "store");
    const store = new FileStore({ root: dir, putThreads: dying, lockTimeoutMs: 2_000 });
    const other = new FileStore({ root: dir, lockTimeoutMs: 2_000 });
    try {
      const outcome = await store.put("queues/q/0.json", bytes("v1"), { ifAbsent: true }).then(
        () => "landed",
        (error: unknown) => (isStoreError(error) ? error.kind : String(error)),
      );
      expect(outcome).toBe("ambiguous");
      expect(await readdir(path.join(dir, FILE_STORE_INTERNAL_DIR, "locks"))).toEqual([]);
      expect(await readdir(path.join(dir, "queues", "q"))).toEqual([]);
      // Not blocked by a lock of this (live) process: the key is free at once.
      await other.put("queues/q/0.json", bytes("v2"), { ifAbsent: true });
      expect(new TextDecoder().decode((await other.get("queues/q/0.json"))?.body)).toBe("v2");
    } finally {
      await store.close();
      await other.close();
    }
  });

  it("a thread that dies after answering, before it released the lock: the pool removes the lock", async () => {
    // Commits and answers as the real thread does, then ends without releasing the key's lock.
    const dying = new PutThreads({
      maxThreads: 1,
      script: `
        const { parentPort } = require("node:worker_threads");
        const fs = require("node:fs");
        const path = require("node:path");
        parentPort.on("message", ({ id, request, length }) => {
          fs.mkdirSync(request.stagedDir);
          fs.writeFileSync(path.join(request.stagedDir, request.marker), "{}");
          fs.renameSync(request.stagedDir, request.lockDir);
          fs.writeFileSync(request.file, "casq-object/1 " + request.id + "\\n" + "v1");
          parentPort.postMessage({ id, outcome: { kind: "ok" } });
          setTimeout(() => process.exit(1), 20);
        });
        parentPort.postMessage({ ready: true });`,
    });
    const dir = path.join(root, "store");
    const store = new FileStore({ root: dir, putThreads: dying, lockTimeoutMs: 2_000 });
    const other = new FileStore({ root: dir, lockTimeoutMs: 2_000 });
    try {
      const first = await store.put("queues/q/0.json", bytes("v1"), { ifAbsent: true });
      const locks = path.join(dir, FILE_STORE_INTERNAL_DIR, "locks");
      for (let waited = 0; (await readdir(locks)).length > 0 && waited < 10_000; waited += 20)
        await new Promise((resolve) => setTimeout(resolve, 20));
      expect(await readdir(locks)).toEqual([]);
      // Not blocked by the dead thread's lock of this (live) process.
      await other.put("queues/q/0.json", bytes("v2"), { ifMatch: first.etag });
      expect(new TextDecoder().decode((await other.get("queues/q/0.json"))?.body)).toBe("v2");
    } finally {
      await store.close();
      await other.close();
    }
  });

  it("a lock of this process is waited for briefly, then left to the store's own path", async () => {
    const threads = new PutThreads({ maxThreads: 1 });
    // Held by this process (as a sibling thread still releasing it would be), and never released.
    const lockDir = path.join(root, "locks", "doc");
    const marker = path.join(lockDir, `${fileStoreOwnerToken()}.0123456789abcdef`);
    await mkdir(lockDir);
    await writeFile(marker, "{}\n");
    expect(await threads.run(request("doc", { ifAbsent: true }), bytes("x"))).toEqual({ kind: "lock-busy" });
    // Released while the thread waits for it, as a holder releases it (marker, then directory): the
    // put takes it, possibly between the two steps (then the directory is the thread's: not empty,
    // or already released again).
    const held = threads.run(request("doc", { ifAbsent: true }), bytes("y"));
    await rm(marker);
    await rmdir(lockDir).catch((error: NodeJS.ErrnoException) => {
      if (!["ENOTEMPTY", "EEXIST", "ENOENT"].includes(error.code ?? "")) throw error;
    });
    const outcome = await held;
    expect(["ok", "lock-busy"]).toContain(outcome?.kind);
    expect(existsSync(path.join(root, "doc"))).toBe(outcome?.kind === "ok");
    expect(await readdir(path.join(root, "staging"))).toEqual([]);
  });

  it("stages the next lock ahead after a put that asks for it, and removes it when the next put does not", async () => {
    const threads = new PutThreads({ maxThreads: 1 });
    const staging = path.join(root, "staging");
    // The thread answers first and then releases the lock and stages or removes the next one.
    const settled = async (want: number, dir = staging) => {
      for (let waited = 0; (await readdir(dir)).length !== want && waited < 5_000; waited += 10)
        await new Promise((resolve) => setTimeout(resolve, 10));
      return readdir(dir);
    };
    const ahead = (name: string, condition: { ifAbsent: true } | { ifMatch: string }) => ({
      ...request(name, condition),
      stageAhead: true,
    });
    expect(await threads.run(ahead("a", { ifAbsent: true }), bytes("1"))).toEqual({ kind: "ok" });
    const first = await settled(1);
    expect(first).toHaveLength(1);
    // The next put takes the lock staged ahead (its own staging names are never made) and stages another.
    const next = ahead("b", { ifAbsent: true });
    expect(await threads.run(next, bytes("2"))).toEqual({ kind: "ok" });
    const second = await settled(1);
    expect(second).toHaveLength(1);
    expect(second).not.toEqual(first);
    expect(second).not.toContain(path.basename(next.stagedDir));
    expect(await readFile(path.join(root, "b"), "utf8")).toMatch(/\n2$/);
    // A put that does not ask for it: the thread removes the lock it staged.
    expect(await threads.run(request("c", { ifAbsent: true }), bytes("3"))).toEqual({ kind: "ok" });
    expect(await settled(0)).toEqual([]);
    expect(await settled(0, path.join(root, "locks"))).toEqual([]);
  });

  /** A put run directly (no thread) that holds its lock; `recycleWithinMs` as `syncPut` takes it. */
  function heldLock(recycleWithinMs: number) {
    const held = request("doc", { ifAbsent: true });
    const run = syncPut(held, bytes("x"), () => false, undefined, recycleWithinMs);
    expect(run.outcome).toEqual({ kind: "ok" });
    return { held, run };
  }

  /** The names of a next lock to stage. */
  const nextLock = () => ({
    stagedDir: path.join(root, "staging", "next"),
    marker: "next",
    markerText: "{}\n",
  });

  it("through the pool, a lock released soon after it was taken becomes the thread's next staged lock", async () => {
    // Any hold counts as brief here, so that a slow fsync on a loaded machine cannot change the path.
    const threads = new PutThreads({ maxThreads: 1, recycleWithinMs: 60_000 });
    const staging = path.join(root, "staging");
    /** The marker of the one lock staged, once the thread staged one other than `not`. */
    const stagedMarker = async (not?: string) => {
      for (let waited = 0; waited < 5_000; waited += 10) {
        const [dir, ...more] = await readdir(staging);
        const markers = dir === undefined ? [] : await readdir(path.join(staging, dir)).catch(() => []);
        const marker = markers[0] === undefined ? undefined : path.join(staging, dir as string, markers[0]);
        if (more.length === 0 && markers.length === 1 && marker !== not) return marker as string;
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      throw new Error("no lock staged");
    };
    const ahead = (name: string) => ({ ...request(name, { ifAbsent: true }), stageAhead: true });
    expect(await threads.run(ahead("a"), bytes("1"))).toEqual({ kind: "ok" });
    const first = await stagedMarker();
    // Held open, their inodes cannot be reused by others meanwhile.
    const marker = await open(first, "r");
    const dir = await open(path.dirname(first), "r");
    try {
      expect(await threads.run(ahead("b"), bytes("2"))).toEqual({ kind: "ok" });
      const second = await stagedMarker(first);
      // Named as its staging directory (the next owner); the very directory and file of the lock before.
      expect(path.basename(second)).toBe(path.basename(path.dirname(second)));
      expect((await stat(second)).ino).toBe((await marker.stat()).ino);
      expect((await stat(path.dirname(second))).ino).toBe((await dir.stat()).ino);
      expect((await marker.stat()).nlink).toBe(1);
      expect(await readdir(path.join(root, "locks"))).toEqual([]);
    } finally {
      await marker.close();
      await dir.close();
    }
  });

  it("a lock held briefly is handed on whole to the next staged lock, its marker renamed and its mtime refreshed", async () => {
    const { held, run } = heldLock(60_000);
    const lockDir = await open(held.lockDir, "r");
    try {
      await utimes(path.join(held.lockDir, held.marker), new Date(2000, 0, 1), new Date(2000, 0, 1));
      const next = nextLock();
      expect(run.finish(next)).toBe(true);
      expect(existsSync(held.lockDir)).toBe(false);
      expect(readdirSync(next.stagedDir)).toEqual(["next"]);
      expect((await stat(next.stagedDir)).ino).toBe((await lockDir.stat()).ino);
      expect((await stat(path.join(next.stagedDir, "next"))).mtimeMs).toBeGreaterThan(Date.now() - 60_000);
    } finally {
      await lockDir.close();
    }
  });

  it("a lock held longer is released as it always was, and the next lock is staged afresh", async () => {
    // Held longer than a hand-on allows (0 ms: any hold): a waiter elsewhere may judge by age.
    const { held, run } = heldLock(0);
    const lockDir = await open(held.lockDir, "r");
    try {
      const next = nextLock();
      expect(run.finish(next)).toBe(true);
      expect(existsSync(held.lockDir)).toBe(false);
      expect(readdirSync(next.stagedDir)).toEqual(["next"]);
      expect((await stat(next.stagedDir)).ino).not.toBe((await lockDir.stat()).ino);
    } finally {
      await lockDir.close();
    }
  });

  it("a lock broken while held: its release leaves the new holder's lock in place, and the next lock is staged afresh", async () => {
    const { held, run } = heldLock(60_000);
    // Broken as stale and taken by another writer before this one released it.
    rmSync(path.join(held.lockDir, held.marker));
    rmdirSync(held.lockDir);
    const other = request("other", { ifAbsent: true });
    mkdirSync(other.stagedDir);
    writeFileSync(path.join(other.stagedDir, other.marker), "{}\n");
    renameSync(other.stagedDir, held.lockDir);
    const othersLock = await open(held.lockDir, "r");
    try {
      const next = nextLock();
      expect(run.finish(next)).toBe(true);
      expect(readdirSync(held.lockDir)).toEqual([other.marker]);
      expect((await stat(held.lockDir)).ino).toBe((await othersLock.stat()).ino);
      expect(readdirSync(next.stagedDir)).toEqual(["next"]);
      // Released once: a second call stages nothing more and still leaves the other's lock alone.
      expect(run.finish()).toBe(false);
      expect(readdirSync(held.lockDir)).toEqual([other.marker]);
    } finally {
      await othersLock.close();
    }
  });
});
