/** The shared object-store conformance suite against the file backend, one fresh directory per test. */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { FileStore } from "../../server/src/store/file-store.ts";
import { describeStoreConformance } from "./conformance-suite.ts";

describeStoreConformance("file", async () => {
  const root = await mkdtemp(path.join(tmpdir(), "casq-file-conformance-"));
  const store = new FileStore({ root });
  return {
    store,
    async cleanup() {
      await store.close();
      await rm(root, { recursive: true, force: true });
    },
  };
});
