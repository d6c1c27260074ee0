/** The shared object-store conformance suite against the in-process memory backend. */
import { MemoryStore } from "../../server/src/store/memory-store.ts";
import { describeStoreConformance } from "./conformance-suite.ts";

describeStoreConformance("memory", async () => {
  const store = new MemoryStore();
  return { store, cleanup: () => store.close() };
});
