/**
 * The shared object-store conformance suite against {@link S3Store} talking to
 * each real S3-compatible server of the run (started once per run by
 * `test/support/global-setup.ts`): the gofakes3 fake and VersityGW. Each test
 * gets its own unique key prefix in the shared bucket, so tests never see
 * each other's keys.
 *
 * Both pass the strict race test: their conditional PutObject checks and
 * writes atomically (32 concurrent If-Match writers from one etag, exactly
 * one winner in every round; VersityGW serialises conditional writes of one
 * key with an advisory lock file).
 */
import { randomUUID } from "node:crypto";
import { inject } from "vitest";
import { S3Store } from "../../server/src/store/s3-store.ts";
import { S3_SERVER_KINDS } from "../support/s3-endpoints.ts";
import { S3_TEST_CREDENTIALS, S3_TEST_REGION } from "../support/s3-server.ts";
import { describeStoreConformance } from "./conformance-suite.ts";

for (const kind of S3_SERVER_KINDS) {
  describeStoreConformance(`s3 (${kind})`, async () => {
    const { endpoint, bucket } = inject("s3Servers")[kind];
    const prefix = `conformance/${randomUUID()}`;
    const store = new S3Store({
      bucket,
      prefix,
      endpoint,
      region: S3_TEST_REGION,
      forcePathStyle: true,
      credentials: S3_TEST_CREDENTIALS,
    });
    return {
      store,
      // S3 etags are the MD5 of the bytes; see ConformanceTarget.uniqueEtags.
      uniqueEtags: false,
      // VersityGW answers 204 to a conditional delete of a missing key (AWS: 404); see docs/operations.md.
      deleteIfMatchOfMissingKey: kind === "versitygw" ? "resolves" : "fails",
      cleanup: async () => {
        try {
          for (const { key } of await store.list("")) await store.delete(key);
        } finally {
          await store.close();
        }
      },
    };
  });
}
