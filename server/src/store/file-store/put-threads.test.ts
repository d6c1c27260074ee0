/**
 * The file store's put threads: puts really run there (a failed thread start
 * would silently fall back to the event loop's path, which the conformance
 * suite cannot tell apart), each outcome of the synchronous sequence, and
 * aborts of queued and running puts.
 */
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { FileStore } from "../file-store.ts";
import { PutThreads, putThreads } from "./put-threads.ts";
import type { SyncPutRequest } from "./sync-put.ts";

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

  let nextOwner = 0;
  /** A request for `name` in `root`, with a lock and staging directory of its own. */
  function request(name: string, condition: { ifAbsent: true } | { ifMatch: string }): SyncPutRequest {
    const owner = `owner-${++nextOwner}`;
    return {
      file: path.join(root, name),
      temp: path.join(root, `${name}~tmp~${owner}`),
      header: `casq-object/1 ${"ab".repeat(16)}\n`,
      ifAbsent: "ifAbsent" in condition,
      ifMatch: "ifMatch" in condition ? condition.ifMatch : undefined,
      lockDir: path.join(root, "locks", name),
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
    const threads = new PutThreads(1);
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

    expect((await readFile(path.join(root, "doc"), "utf8")).endsWith("\ntwo")).toBe(true);
    expect(await readdir(path.join(root, "locks"))).toEqual([]);
    expect(await readdir(path.join(root, "staging"))).toEqual([]);
    expect((await readdir(root)).filter((name) => name.includes("~tmp~"))).toEqual([]);
  });

  it("starts a second thread for puts that would wait, and ends it once it sat idle", async () => {
    const threads = new PutThreads(2, 200);
    const big = new Uint8Array(2 * 1024 * 1024).fill(1);
    const outcomes = await Promise.all(
      ["a", "b", "c", "d"].map((name) => threads.run(request(name, { ifAbsent: true }), big)),
    );
    expect(outcomes).toEqual(Array(4).fill({ kind: "ok" }));
    expect(threads.counts.started).toBe(2);
    expect(threads.threadCount).toBe(2);
    await new Promise((resolve) => setTimeout(resolve, 600));
    expect(threads.threadCount).toBe(1);
    expect(await threads.run(request("e", { ifAbsent: true }), bytes("x"))).toEqual({ kind: "ok" });
    expect(threads.counts.started).toBe(2);
  });

  it("an abort removes a queued put, and a running one commits nothing or lands whole", async () => {
    const threads = new PutThreads(1);
    const big = new Uint8Array(3 * 1024 * 1024).fill(7);
    const first = new AbortController();
    const second = new AbortController();
    const running = threads.run(request("first", { ifAbsent: true }), big, first.signal);
    const queued = threads.run(request("second", { ifAbsent: true }), bytes("x"), second.signal);
    second.abort();
    first.abort();
    expect(await queued).toEqual({ kind: "aborted" });
    expect(existsSync(path.join(root, "second"))).toBe(false);
    const outcome = await running;
    if (outcome?.kind === "aborted") expect(existsSync(path.join(root, "first"))).toBe(false);
    else expect(outcome).toEqual({ kind: "ok" });
    expect(await threads.run(request("late", { ifAbsent: true }), bytes("x"), first.signal)).toEqual({
      kind: "aborted",
    });
    expect((await readdir(root)).filter((name) => name.includes("~tmp~"))).toEqual([]);
  });
});
