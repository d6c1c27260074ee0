/**
 * Real-process race test of the file store: several child processes, started
 * together, increment one counter with read + put-if-match. Each child prints
 * every increment that won its CAS. Cross-process CAS is correct when the
 * final counter equals the number of reported wins and the reported values
 * are exactly 1..final, each once (nothing lost, nothing doubled).
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FileStore } from "../../server/src/store/file-store.ts";
import { spawnFixture } from "./fixtures/spawn-fixture.ts";

const KEY = "queues/race/0.json";
const CHILDREN = 3;
const ATTEMPTS_PER_CHILD = 150;

describe("file store: CAS between processes", () => {
  let root: string;

  beforeAll(async () => {
    root = await mkdtemp(path.join(tmpdir(), "casq-file-race-"));
  });

  afterAll(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it(`${CHILDREN} processes x ${ATTEMPTS_PER_CHILD} put-if-match increments: none lost, none doubled`, async () => {
    const store = new FileStore({ root });
    await store.put(KEY, new TextEncoder().encode(JSON.stringify({ n: 0 })), { ifAbsent: true });

    const children = Array.from({ length: CHILDREN }, (_, id) =>
      spawnFixture("counter.ts", [root, KEY, String(ATTEMPTS_PER_CHILD), `child-${id}`]),
    );
    await Promise.all(children.map((child) => child.waitForLine((line) => line === "ready")));
    for (const child of children) child.child.stdin?.write("go\n");
    const exits = await Promise.all(children.map((child) => child.exited));
    exits.forEach(({ code }, id) => {
      expect(code, children[id]?.stderr()).toBe(0);
    });

    const winsPerChild = children.map((child) =>
      child.lines.filter((line) => line.startsWith("ok ")).map((line) => Number(line.slice(3))),
    );
    const allWins = winsPerChild.flat().sort((a, b) => a - b);
    const final = await store.get(KEY);
    const { n } = JSON.parse(new TextDecoder().decode(final?.body)) as { n: number };

    expect(n).toBe(allWins.length);
    expect(allWins).toEqual(Array.from({ length: n }, (_, index) => index + 1));
    console.info(
      `file-store race test: ${CHILDREN} processes, ${ATTEMPTS_PER_CHILD} attempts each; ` +
        `wins per process ${winsPerChild.map((wins) => wins.length).join(", ")}; final counter ${n}`,
    );
    await store.close();
  });
});
