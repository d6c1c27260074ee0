/**
 * The shared object-store conformance suite against {@link S3Store} talking to
 * a real S3-compatible server (started once per run by
 * `test/support/global-setup.ts`). Each test gets its own unique key prefix in
 * the shared bucket, so tests never see each other's keys.
 *
 * atomicCas is true: the test server's conditional PutObject checks and
 * writes under one lock (measured: 32 concurrent If-Match writers from one
 * etag, exactly one winner in every round).
 */
import { randomUUID } from "node:crypto";
import { inject } from "vitest";
import { S3Store } from "../../server/src/store/s3-store.ts";
import { S3_TEST_CREDENTIALS, S3_TEST_REGION } from "../support/s3-server.ts";
import { describeStoreConformance } from "./conformance-suite.ts";

describeStoreConformance("s3", async () => {
  const prefix = `conformance/${randomUUID()}`;
  const store = new S3Store({
    bucket: inject("s3Bucket"),
    prefix,
    endpoint: inject("s3Endpoint"),
    region: S3_TEST_REGION,
    forcePathStyle: true,
    credentials: S3_TEST_CREDENTIALS,
  });
  return {
    store,
    atomicCas: true,
    // S3 etags are the MD5 of the bytes; see ConformanceTarget.uniqueEtags.
    uniqueEtags: false,
    cleanup: async () => {
      try {
        for (const { key } of await store.list("")) await store.delete(key);
      } finally {
        await store.close();
      }
    },
  };
});
