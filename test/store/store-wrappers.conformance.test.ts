/**
 * The shared object-store conformance suite over every store wrapper: a
 * wrapper must keep the contract of the store it wraps (the broker sees only
 * the outermost one). Each wraps a fresh memory store, and the production
 * stack (retrying around instrumented around the file store, as
 * `casq serve` builds it) runs over a fresh directory.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { expect } from "vitest";
import { FileStore } from "../../server/src/store/file-store.ts";
import { InstrumentedStore, type StoreObserver } from "../../server/src/store/instrumented-store.ts";
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import type { ObjectStore } from "../../server/src/store/object-store.ts";
import { RetryingStore } from "../../server/src/store/retrying-store.ts";
import { FaultInjectingStore } from "../../server/testing/fault-injecting-store.ts";
import { type ConformanceTarget, describeStoreConformance } from "./conformance-suite.ts";

/** An observer that uses every hook, and checks at cleanup that each call it saw start also ended. */
function countingObserver(): { observer: StoreObserver; check(): void } {
  let started = 0;
  let finished = 0;
  let ended = 0;
  const observer: StoreObserver = {
    onStart: () => {
      started++;
      return () => {
        finished++;
      };
    },
    onEnd: () => {
      ended++;
    },
    around: (_start, run) => run(),
  };
  return {
    observer,
    check() {
      expect(started).toBeGreaterThan(0);
      expect({ finished, ended }).toEqual({ finished: started, ended: started });
    },
  };
}

/** A target that wraps a fresh memory store; `check` runs after the store is closed. */
function overMemory(wrap: (inner: ObjectStore) => ObjectStore, check?: () => void): ConformanceTarget {
  const store = wrap(new MemoryStore());
  return {
    store,
    async cleanup() {
      await store.close();
      check?.();
    },
  };
}

describeStoreConformance("retrying (memory)", async () => overMemory((inner) => new RetryingStore(inner)));

describeStoreConformance("fault-injecting without faults (memory)", async () =>
  overMemory((inner) => new FaultInjectingStore(inner)),
);

describeStoreConformance("instrumented (memory)", async () => {
  const counting = countingObserver();
  return overMemory((inner) => new InstrumentedStore(inner, { observer: counting.observer }), counting.check);
});

describeStoreConformance("retrying(instrumented(file)), as casq serve builds it", async () => {
  const root = await mkdtemp(path.join(tmpdir(), "casq-wrapper-conformance-"));
  const counting = countingObserver();
  const store = new RetryingStore(
    new InstrumentedStore(new FileStore({ root }), { observer: counting.observer }),
  );
  return {
    store,
    async cleanup() {
      await store.close();
      await rm(root, { recursive: true, force: true });
      counting.check();
    },
  };
});
