/**
 * File-backend specifics that the shared conformance suite cannot see: the
 * on-disk format, internal names, object/prefix collisions, stale and live
 * locks of real (dead or running) processes, lock timeouts and aborts, two
 * store instances on one directory, and error classification.
 */
import { createHash, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import {
  chmod,
  chown,
  mkdir,
  mkdtemp,
  readdir,
  readFile,
  rm,
  stat,
  utimes,
  writeFile,
} from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { spawnFixture } from "../../../test/store/fixtures/spawn-fixture.ts";
import { FILE_STORE_INTERNAL_DIR, FileStore, fileStoreOwnerToken } from "./file-store.ts";
import { isStoreError, type StoreErrorKind } from "./store-errors.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const bytes = (text: string) => encoder.encode(text);

/** The uid and gid of `nobody`: any user without root's right to write everywhere. */
const UNPRIVILEGED_ID = 65534;

/**
 * Runs `action` as an unprivileged user when this process is root (CI runs
 * as root, and root may write into any directory, so an EACCES could not
 * happen): `dir` is handed to that user and the effective ids are switched
 * for the length of the action, then restored. Not root: runs it as it is.
 * Needs a test process of its own (vitest's default `forks` pool), where
 * `process.seteuid` exists.
 */
async function asUnprivileged<T>(dir: string, action: () => Promise<T>): Promise<T> {
  if (process.geteuid?.() !== 0) return action();
  if (process.seteuid === undefined || process.setegid === undefined)
    throw new Error("running as root without process.seteuid (a worker thread?): cannot drop privileges");
  await chown(dir, UNPRIVILEGED_ID, UNPRIVILEGED_ID);
  process.setegid(UNPRIVILEGED_ID);
  process.seteuid(UNPRIVILEGED_ID);
  try {
    return await action();
  } finally {
    process.seteuid(0);
    process.setegid(0);
  }
}

async function rejectionKind(action: () => Promise<unknown>): Promise<StoreErrorKind> {
  try {
    await action();
  } catch (error) {
    if (isStoreError(error)) return error.kind;
    throw error;
  }
  throw new Error("expected the call to reject, but it resolved");
}

function lockDirOf(root: string, key: string): string {
  return path.join(root, FILE_STORE_INTERNAL_DIR, "locks", createHash("sha256").update(key).digest("hex"));
}

/** Makes the key's lock look held by `ownerToken` (as the on-disk protocol writes it). */
async function plantLock(root: string, key: string, ownerToken: string): Promise<string> {
  const dir = lockDirOf(root, key);
  // A put resolves at its commit point and removes its lock right after: wait for that.
  for (let tries = 0; existsSync(dir); tries++) {
    if (tries > 500) throw new Error(`the lock directory ${dir} stayed after the put`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  await mkdir(dir, { recursive: true });
  const marker = path.join(dir, `${ownerToken}.${randomBytes(8).toString("hex")}`);
  await writeFile(marker, "{}\n");
  return marker;
}

/** The owner token of a real process that has exited. */
async function deadOwnerToken(): Promise<string> {
  const child = spawnFixture("owner-token.ts", []);
  const token = await child.waitForLine(() => true);
  await child.exited;
  return token;
}

describe("FileStore", () => {
  let root: string;
  let store: FileStore;

  beforeEach(async () => {
    root = path.join(await mkdtemp(path.join(tmpdir(), "casq-file-store-")), "nested", "data");
    store = new FileStore({ root });
  });

  afterEach(async () => {
    await store.close();
    await rm(path.dirname(path.dirname(root)), { recursive: true, force: true });
  });

  /** A key's body as text, and its etag. */
  async function readText(key: string): Promise<{ body: string; etag: string } | undefined> {
    const read = await store.get(key);
    return read && { body: decoder.decode(read.body), etag: read.etag };
  }

  it("creates its root directory and describes itself as file:<absolute root>", () => {
    expect(existsSync(root)).toBe(true);
    expect(store.description).toBe(`file:${root}`);
    // A relative root is resolved against the working directory (here one that lands on this
    // test's root, so that nothing is made in the working directory itself).
    const relative = `./${path.relative(process.cwd(), root)}/sub/..`;
    expect(new FileStore({ root: relative }).root).toBe(root);
  });

  it("refuses a root it cannot create at once as misconfigured, saying what to fix (never spins)", async () => {
    const refusal = (at: string) => {
      try {
        new FileStore({ root: at });
      } catch (error) {
        return error;
      }
      throw new Error(`opening ${at} succeeded`);
    };
    // Node 20's recursive mkdir loops forever under /proc; this returns at once with ENOENT.
    if (existsSync("/proc/self")) {
      const proc = refusal("/proc/casq-nope/data");
      expect(isStoreError(proc, "misconfigured")).toBe(true);
      expect((proc as Error).message).toContain("/proc/casq-nope/data (ENOENT)");
    }
    const file = path.join(root, "a-file");
    await writeFile(file, "x");
    const inTheWay = refusal(path.join(file, "data"));
    expect(isStoreError(inTheWay, "misconfigured")).toBe(true);
    expect((inTheWay as Error).message).toContain("a file is in the way");
  });

  it("stores an object at its natural path: a version header line, then the exact bytes", async () => {
    const { etag } = await store.put("queues/q/0.json", bytes('{"a":1}'), { ifAbsent: true });
    const raw = await readFile(path.join(root, "queues", "q", "0.json"), "latin1");
    const [header, ...rest] = raw.split("\n");
    expect(header).toMatch(/^casq-object\/1 [0-9a-f]{32}$/);
    expect(etag).toBe(`"${header?.split(" ")[1]}"`);
    expect(rest.join("\n")).toBe('{"a":1}');
    expect(fileStoreOwnerToken()).toMatch(/^\d+\.\d+\.[0-9a-f]{12}$/);
    expect(fileStoreOwnerToken().startsWith(`${process.pid}.`)).toBe(true);
  });

  it("an overwritten object moves to a slotted file, then each put writes it in place (same inode)", async () => {
    const key = "queues/q/0.json";
    const file = path.join(root, "queues", "q", "0.json");
    let { etag } = await store.put(key, bytes("v0"), { ifAbsent: true });
    ({ etag } = await store.put(key, bytes("v1"), { ifMatch: etag }));
    expect((await readFile(file, "latin1")).split("\n")[0]).toBe("casq-object/2 capacity=16384");
    const inode = (await stat(file)).ino;
    for (let i = 2; i <= 6; i++) {
      const written = await store.put(key, bytes(`v${i}`), { ifMatch: etag });
      expect(written.etag).not.toBe(etag);
      etag = written.etag;
      expect(await readText(key)).toEqual({ body: `v${i}`, etag });
      expect(await store.list("queues/")).toEqual([{ key, etag, size: 2 }]);
    }
    expect((await stat(file)).ino).toBe(inode);
    // An old etag never matches again, and a put-if-absent sees the key.
    expect(await rejectionKind(() => store.put(key, bytes("x"), { ifMatch: `"${"0".repeat(32)}"` }))).toBe(
      "precondition_failed",
    );
    expect(await rejectionKind(() => store.put(key, bytes("x"), { ifAbsent: true }))).toBe(
      "precondition_failed",
    );
    // A body beyond the slots' capacity: the file is made again, bigger.
    const big = new Uint8Array(40_000).fill(7);
    etag = (await store.put(key, big, { ifMatch: etag })).etag;
    expect((await readFile(file, "latin1")).split("\n")[0]).toBe("casq-object/2 capacity=81920");
    expect((await stat(file)).ino).not.toBe(inode);
    expect(Buffer.from((await store.get(key))?.body ?? []).equals(big)).toBe(true);
    expect((await store.get(key))?.etag).toBe(etag);
    // A body that needs a quarter of the capacity no more: made again, smaller.
    etag = (await store.put(key, bytes("small"), { ifMatch: etag })).etag;
    expect((await readFile(file, "latin1")).split("\n")[0]).toBe("casq-object/2 capacity=16384");
    expect(await readText(key)).toEqual({ body: "small", etag });
    await store.delete(key, { ifMatch: etag });
    expect(await store.get(key)).toBeUndefined();
  });

  it("a newer slot torn by a crash is ignored: the last whole version is read, and a CAS on it writes over the torn slot", async () => {
    const key = "queues/q/0.json";
    const file = path.join(root, "queues", "q", "0.json");
    const v0 = await store.put(key, bytes("v0"), { ifAbsent: true });
    const v1 = await store.put(key, bytes("v1"), { ifMatch: v0.etag }); // the slotted file: v1 in slot 0
    const v2 = await store.put(key, bytes("v2"), { ifMatch: v1.etag }); // v2 in slot 1
    // As if v2's write had been cut short: a byte of slot 1's body lost.
    const raw = await readFile(file);
    const slot1Body = 4096 + (4096 + 16384) + 4096;
    raw[slot1Body] = (raw[slot1Body] as number) ^ 0xff;
    await writeFile(file, raw);
    expect(await readText(key)).toEqual({ body: "v1", etag: v1.etag });
    expect(await rejectionKind(() => store.put(key, bytes("x"), { ifMatch: v2.etag }))).toBe(
      "precondition_failed",
    );
    const v3 = await store.put(key, bytes("v3"), { ifMatch: v1.etag });
    expect(await readText(key)).toEqual({ body: "v3", etag: v3.etag });
  });

  it("a file whose two slots both fail their checksums is never written over", async () => {
    const key = "queues/q/0.json";
    const file = path.join(root, "queues", "q", "0.json");
    let { etag } = await store.put(key, bytes("v0"), { ifAbsent: true });
    etag = (await store.put(key, bytes("v1"), { ifMatch: etag })).etag;
    etag = (await store.put(key, bytes("v2"), { ifMatch: etag })).etag;
    const raw = await readFile(file);
    for (const body of [4096 + 4096, 4096 + (4096 + 16384) + 4096]) raw[body] = (raw[body] as number) ^ 0xff;
    await writeFile(file, raw);
    const damaged = await store.get(key).catch((error: unknown) => error);
    expect(isStoreError(damaged, "unavailable")).toBe(true);
    expect(String(damaged)).toMatch(/damaged/);
    for (const write of [
      () => store.put(key, bytes("x"), { ifMatch: etag }),
      () => store.put(key, bytes("x"), { ifAbsent: true }),
      () => store.delete(key, { ifMatch: etag }),
    ])
      expect(await rejectionKind(write)).toBe("precondition_failed");
    expect(await store.list("queues/")).toEqual([{ key, etag: '"damaged"', size: 0 }]);
    expect(await readFile(file)).toEqual(raw);
    // An operator may still delete the key outright.
    await store.delete(key);
    expect(await store.get(key)).toBeUndefined();
  });

  it("never lists or reads internal files, and refuses keys that could name them", async () => {
    await store.put("dir/doc.json", bytes("doc"), { ifAbsent: true });
    await writeFile(path.join(root, "dir", "doc.json~tmp~not-a-real-owner"), "half written");
    await writeFile(path.join(root, "dir", "orphan.json~tmp~1.0.abc.def"), "half written");
    expect((await store.list("")).map((entry) => entry.key)).toEqual(["dir/doc.json"]);
    expect(decoder.decode((await store.get("dir/doc.json"))?.body)).toBe("doc");
    expect(await store.get("dir/orphan.json")).toBeUndefined();
    for (const key of ["~casq/locks", "dir/doc.json~tmp~x", "a~b"])
      expect(await rejectionKind(() => store.get(key)), key).toBe("invalid");
  });

  it("reads a file copied in by hand whole, and the first CAS over it gives it the store's format", async () => {
    await mkdir(path.join(root, "hand"), { recursive: true });
    await writeFile(path.join(root, "hand", "doc.json"), '{"restored":true}');
    const read = await store.get("hand/doc.json");
    expect(decoder.decode(read?.body)).toBe('{"restored":true}');
    expect(read?.etag).toMatch(/^"raw-/);
    expect((await store.list("hand/"))[0]).toEqual({ key: "hand/doc.json", etag: read?.etag, size: 17 });
    const next = await store.put("hand/doc.json", bytes('{"restored":true}'), { ifMatch: read?.etag ?? "" });
    expect(next.etag).not.toBe(read?.etag);
    expect((await store.get("hand/doc.json"))?.etag).toBe(next.etag);
  });

  it("refuses a key that is both an object and a prefix of other keys, as invalid", async () => {
    await store.put("a", bytes("file"), { ifAbsent: true });
    expect(await rejectionKind(() => store.put("a/b", bytes("x"), { ifAbsent: true }))).toBe("invalid");
    expect(await store.get("a/b")).toBeUndefined();
    await store.put("c/d", bytes("x"), { ifAbsent: true });
    expect(await rejectionKind(() => store.put("c", bytes("x"), { ifAbsent: true }))).toBe("invalid");
    expect(await store.get("c")).toBeUndefined();
    await store.delete("c");
    expect(await rejectionKind(() => store.delete("c", { ifMatch: '"x"' }))).toBe("precondition_failed");
    expect((await store.list("")).map((entry) => entry.key)).toEqual(["a", "c/d"]);
    expect(await readdir(root)).not.toContain(expect.stringContaining("~tmp~"));
  });

  it("accepts segments that merely start with dots", async () => {
    await store.put("..hidden/x..y", bytes("dots"), { ifAbsent: true });
    expect(decoder.decode((await store.get("..hidden/x..y"))?.body)).toBe("dots");
    expect((await store.list("..h")).map((entry) => entry.key)).toEqual(["..hidden/x..y"]);
  });

  it("refuses key segments longer than the file system can name with a temp suffix", async () => {
    const long = "x".repeat(201);
    expect(await rejectionKind(() => store.put(long, bytes("x"), { ifAbsent: true }))).toBe("invalid");
    expect(await rejectionKind(() => store.get(`a/${long}`))).toBe("invalid");
    await store.put("x".repeat(200), bytes("ok"), { ifAbsent: true });
  });

  it("breaks the lock of a dead process at once and sweeps its temp files", async () => {
    const dead = await deadOwnerToken();
    const key = "queues/q/0.json";
    const created = await store.put(key, bytes("v1"), { ifAbsent: true });
    const marker = await plantLock(root, key, dead);
    const deadTemp = path.join(root, "queues", "q", `0.json~tmp~${dead}.0123456789abcdef`);
    await writeFile(deadTemp, "torn");

    const fresh = new FileStore({ root, lockTimeoutMs: 5_000 });
    try {
      await fresh.put(key, bytes("v2"), { ifMatch: created.etag });
      expect(decoder.decode((await fresh.get(key))?.body)).toBe("v2");
    } finally {
      await fresh.close();
    }
    expect(existsSync(marker)).toBe(false);
    expect(existsSync(deadTemp)).toBe(false);
    expect(await readdir(lockDirOf(root, key)).catch(() => [])).toEqual([]);
  });

  it("waits for the lock of a live process, times out unavailable writing nothing, and proceeds once it is killed", async () => {
    const holder = spawnFixture("owner-token.ts", ["stay"]);
    try {
      const live = await holder.waitForLine(() => true);
      const key = "held.json";
      const created = await store.put(key, bytes("v1"), { ifAbsent: true });
      await plantLock(root, key, live);

      const impatient = new FileStore({ root, lockTimeoutMs: 300 });
      try {
        expect(await rejectionKind(() => impatient.put(key, bytes("v2"), { ifMatch: created.etag }))).toBe(
          "unavailable",
        );
        expect(await rejectionKind(() => impatient.delete(key))).toBe("unavailable");
        expect(decoder.decode((await impatient.get(key))?.body)).toBe("v1");
        expect((await readdir(root)).filter((name) => name.includes("~tmp~"))).toEqual([]);

        holder.child.kill("SIGKILL");
        await holder.exited;
        await impatient.put(key, bytes("v2"), { ifMatch: created.etag });
        expect(decoder.decode((await impatient.get(key))?.body)).toBe("v2");
      } finally {
        await impatient.close();
      }
    } finally {
      holder.child.kill("SIGKILL");
    }
  });

  it("breaks a lock it cannot check by pid (another machine) only after lockStaleMs without a refresh", async () => {
    const key = "remote.json";
    const created = await store.put(key, bytes("v1"), { ifAbsent: true });
    const marker = await plantLock(root, key, "4242.0.000000000000");

    const other = new FileStore({ root, lockStaleMs: 60_000, lockTimeoutMs: 200 });
    try {
      expect(await rejectionKind(() => other.put(key, bytes("v2"), { ifMatch: created.etag }))).toBe(
        "unavailable",
      );
      const longAgo = new Date(Date.now() - 120_000);
      await utimes(marker, longAgo, longAgo);
      await other.put(key, bytes("v2"), { ifMatch: created.etag });
      expect(decoder.decode((await other.get(key))?.body)).toBe("v2");
    } finally {
      await other.close();
    }
  });

  it("an abort while waiting for the lock rejects unavailable and writes nothing", async () => {
    const holder = spawnFixture("owner-token.ts", ["stay"]);
    try {
      const key = "abort.json";
      const created = await store.put(key, bytes("v1"), { ifAbsent: true });
      await plantLock(root, key, await holder.waitForLine(() => true));
      const controller = new AbortController();
      const attempt = rejectionKind(() =>
        store.put(key, bytes("v2"), { ifMatch: created.etag }, { signal: controller.signal }),
      );
      setTimeout(() => controller.abort(), 50);
      expect(await attempt).toBe("unavailable");
      await rm(lockDirOf(root, key), { recursive: true });
      expect(decoder.decode((await store.get(key))?.body)).toBe("v1");
      expect((await readdir(root)).filter((name) => name.includes("~"))).toEqual([FILE_STORE_INTERNAL_DIR]);
    } finally {
      holder.child.kill("SIGKILL");
    }
  });

  it("an abort during a large write either rejects unavailable with nothing written, or the write landed", async () => {
    const big = randomBytes(32 * 1024 * 1024);
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 5);
    const outcome = await store.put("big.bin", big, { ifAbsent: true }, { signal: controller.signal }).then(
      (result) => ({ landed: true as const, etag: result.etag }),
      (error: unknown) => ({ landed: false as const, error }),
    );
    const stored = await store.get("big.bin");
    if (outcome.landed) {
      expect(stored?.etag).toBe(outcome.etag);
    } else {
      expect(isStoreError(outcome.error, "unavailable")).toBe(true);
      expect(stored).toBeUndefined();
    }
    expect((await readdir(root)).filter((name) => name.includes("~tmp~"))).toEqual([]);
  });

  it("two store instances on one directory: exactly one of many concurrent CAS writers wins", async () => {
    const second = new FileStore({ root });
    try {
      let etag = (await store.put("shared.json", bytes("start"), { ifAbsent: true })).etag;
      for (let round = 0; round < 3; round += 1) {
        const writers = Array.from({ length: 16 }, (_, index) => ({
          store: index % 2 === 0 ? store : second,
          body: `round ${round} writer ${index}`,
        }));
        const results = await Promise.allSettled(
          writers.map((writer) => writer.store.put("shared.json", bytes(writer.body), { ifMatch: etag })),
        );
        const winners = results.flatMap((result, index) => (result.status === "fulfilled" ? [index] : []));
        expect(winners).toHaveLength(1);
        for (const result of results)
          if (result.status === "rejected")
            expect(isStoreError(result.reason, "precondition_failed")).toBe(true);
        const read = await second.get("shared.json");
        expect(decoder.decode(read?.body)).toBe(writers[winners[0] ?? -1]?.body);
        etag = read?.etag ?? "";
      }
    } finally {
      await second.close();
    }
  });

  it("close waits for calls in flight; later calls reject unavailable", async () => {
    const pending = store.put("late.json", randomBytes(1024 * 1024), { ifAbsent: true });
    await store.close();
    await expect(pending).resolves.toHaveProperty("etag");
    expect(await rejectionKind(() => store.get("late.json"))).toBe("unavailable");
  });

  it("an unwritable directory is unavailable, not a crash", async () => {
    const base = await mkdtemp(path.join(tmpdir(), "casq-file-store-unwritable-"));
    try {
      const kind = await asUnprivileged(base, async () => {
        const own = new FileStore({ root: path.join(base, "data") });
        try {
          await mkdir(path.join(own.root, "locked"), { mode: 0o500 });
          return await rejectionKind(() => own.put("locked/doc.json", bytes("x"), { ifAbsent: true }));
        } finally {
          await own.close();
        }
      });
      expect(kind).toBe("unavailable");
    } finally {
      await rm(base, { recursive: true, force: true });
    }
  });

  it("a put whose temp file cannot be written frees the key's lock (taken meanwhile) for the next call", async () => {
    const base = await mkdtemp(path.join(tmpdir(), "casq-file-store-temp-fails-"));
    try {
      const { kind, next } = await asUnprivileged(base, async () => {
        // A lock still held would make the next put wait for it, and time out.
        const own = new FileStore({ root: path.join(base, "data"), lockTimeoutMs: 500 });
        try {
          const dir = path.join(own.root, "locked");
          await mkdir(dir, { mode: 0o500 });
          const kind = await rejectionKind(() => own.put("locked/doc.json", bytes("x"), { ifAbsent: true }));
          await chmod(dir, 0o700);
          const next = await own.put("locked/doc.json", bytes("y"), { ifAbsent: true }).then(
            () => "written",
            (error: unknown) => (isStoreError(error) ? error.kind : String(error)),
          );
          return { kind, next };
        } finally {
          await own.close();
        }
      });
      expect(kind).toBe("unavailable");
      expect(next).toBe("written");
    } finally {
      await rm(base, { recursive: true, force: true });
    }
  });

  it.skipIf(!existsSync("/sys/kernel"))(
    "a root the OS refuses to create throws misconfigured at construction",
    () => {
      let thrown: unknown;
      try {
        new FileStore({ root: "/sys/casq-file-store-test" });
      } catch (error) {
        thrown = error;
      }
      expect(isStoreError(thrown, "misconfigured")).toBe(true);
    },
  );
});
