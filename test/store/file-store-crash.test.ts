/**
 * Real-process crash test of the file store: a child process writes
 * multi-MiB self-checking versions of one key in a CAS loop and is killed
 * with SIGKILL at random moments, once with bodies written over the slots of
 * the key's file in place and once with bodies written by rename. After every kill a fresh store (a
 * "survivor") must read a complete version (old or new, never torn), at least
 * as new as the last one the child had acknowledged, then win a CAS of its own
 * (a lock left by the dead child must not block it), and see no temp file in
 * `list` or, after its own write, on disk.
 */
import { createHash } from "node:crypto";
import { mkdtemp, open, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FileStore } from "../../server/src/store/file-store.ts";
import { seededRandom } from "../../server/src/util/random.ts";
import { spawnFixture } from "./fixtures/spawn-fixture.ts";
import { makeVersionedBody, parseVersionedBody } from "./fixtures/versioned-body.ts";

const KEY = "queues/crash/0.json";
const KILLS = 6;
const MAX_KILL_DELAY_MS = 120;

/**
 * Bodies a put thread writes over the slots of the key's file in place
 * (slotted-file.ts), and bodies too big for a put thread, which the event
 * loop writes to a temp file renamed over the key's.
 */
const CASES = [
  { payloadBytes: 3 * 1024 * 1024, format: "casq-object/2 ", how: "in place" },
  { payloadBytes: 5 * 1024 * 1024, format: "casq-object/1 ", how: "by rename" },
] as const;

/** Checks the first bytes of `file`: which format its current version has. */
async function expectFormat(file: string, format: string): Promise<void> {
  const handle = await open(file, "r");
  try {
    const { buffer } = await handle.read(Buffer.alloc(format.length), 0, format.length, 0);
    expect(buffer.toString("latin1")).toBe(format);
  } finally {
    await handle.close();
  }
}

describe.each(CASES)(
  "file store: SIGKILL of a writer at random moments, writing $how",
  ({ payloadBytes, format }) => {
    let root: string;

    beforeAll(async () => {
      root = await mkdtemp(path.join(tmpdir(), "casq-file-crash-"));
    });

    afterAll(async () => {
      await rm(root, { recursive: true, force: true });
    });

    it(`survives ${KILLS} kills: never torn, acknowledged writes kept, survivor CAS not blocked`, async () => {
      const random = seededRandom(20_240_611);
      const lockDir = path.join(root, "~casq", "locks", createHash("sha256").update(KEY).digest("hex"));
      const stats = { lockHeldAtKill: 0, tempsLeftAtKill: 0, survivorWaitMs: [] as number[] };
      for (let kill = 0; kill < KILLS; kill += 1) {
        const writer = spawnFixture("writer.ts", [root, KEY, String(payloadBytes)]);
        await writer.waitForLine((line) => line.startsWith("committed "));
        await new Promise((resolve) => setTimeout(resolve, Math.floor(random.next() * MAX_KILL_DELAY_MS)));
        writer.child.kill("SIGKILL");
        const { signal } = await writer.exited;
        expect(signal, writer.stderr()).toBe("SIGKILL");
        const acknowledged = Math.max(
          ...writer.lines
            .filter((line) => line.startsWith("committed "))
            .map((line) => Number(line.split(" ")[1])),
        );

        // How the dead writer wrote (from the second writer on: the first one's first put made the key).
        if (kill > 0) await expectFormat(path.join(root, KEY), format);
        const lockEntries = await readdir(lockDir).catch(() => []);
        if (lockEntries.length > 0) stats.lockHeldAtKill += 1;
        const dir = path.dirname(path.join(root, KEY));
        if ((await readdir(dir)).some((name) => name.includes("~tmp~"))) stats.tempsLeftAtKill += 1;

        const survivor = new FileStore({ root });
        try {
          const current = await survivor.get(KEY);
          if (!current) throw new Error("the key vanished");
          const { version } = parseVersionedBody(current.body);
          expect(version).toBeGreaterThanOrEqual(acknowledged);
          expect(version).toBeLessThanOrEqual(acknowledged + 1);

          expect((await survivor.list("")).map((entry) => entry.key)).toEqual([KEY]);

          const started = performance.now();
          const next = makeVersionedBody(version + 1, 1024);
          const written = await survivor.put(KEY, next, { ifMatch: current.etag });
          stats.survivorWaitMs.push(Math.round(performance.now() - started));

          const after = await survivor.get(KEY);
          expect(after?.etag).toBe(written.etag);
          expect(parseVersionedBody(after?.body ?? new Uint8Array()).version).toBe(version + 1);
          expect((await readdir(dir)).filter((name) => name.includes("~"))).toEqual([]);
          // The survivor's own lock is released just after its put answered; a dead writer's would stay.
          for (
            let waited = 0;
            (await readdir(lockDir).catch(() => [])).length > 0 && waited < 2_000;
            waited += 10
          )
            await new Promise((resolve) => setTimeout(resolve, 10));
          expect(await readdir(lockDir).catch(() => [])).toEqual([]);
        } finally {
          await survivor.close();
        }
      }
      console.info(
        `file-store crash test (${payloadBytes} bytes): ${KILLS} kills; lock held by the dead writer at ${stats.lockHeldAtKill}, ` +
          `temp files left at ${stats.tempsLeftAtKill}; survivor CAS took ${stats.survivorWaitMs.join(", ")} ms`,
      );
    });
  },
);
