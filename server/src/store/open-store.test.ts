/** Store URL parsing and opening: every accepted form, and clear errors for the rest. */
import { mkdtemp, rm } from "node:fs/promises";
import { type AddressInfo, createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { FileStore } from "./file-store.ts";
import { MemoryStore } from "./memory-store.ts";
import { openStore, parseStoreUrl, STORE_URL_FORMS, StoreUrlError } from "./open-store.ts";
import { S3Store } from "./s3-store.ts";

const base = { cwd: "/srv/casq", env: {}, homeDir: "/home/ops" };

describe("parseStoreUrl: file:", () => {
  it.each([
    ["file:./casq-data", "/srv/casq/casq-data"],
    ["file:casq-data", "/srv/casq/casq-data"],
    ["file:../shared/state/", "/srv/shared/state"],
    ["file:/var/lib/casq", "/var/lib/casq"],
    ["file:///var/lib/casq", "/var/lib/casq"],
    ["file://localhost/var/lib/casq", "/var/lib/casq"],
    ["file:///var/lib/with%20space", "/var/lib/with space"],
    ["file:~/casq", "/home/ops/casq"],
    ["  file:/trimmed  ", "/trimmed"],
  ])("%s -> %s", (url, root) => {
    expect(parseStoreUrl(url, base)).toEqual({ kind: "file", root });
  });

  it.each([
    ["file:", /needs a directory/],
    ["file://server/share", /remote host/],
    ["file:/data?sync=1", /no \?parameters/],
    ["file:///data?sync=1", /no \?parameters/],
  ])("%s is refused", (url, message) => {
    expect(() => parseStoreUrl(url, base)).toThrow(message);
  });
});

describe("parseStoreUrl: s3://", () => {
  it("parses bucket, prefix, endpoint, region and path style", () => {
    expect(
      parseStoreUrl(
        "s3://my-bucket/casq/prod?endpoint=http://127.0.0.1:9000&region=eu-west-1&path_style=true",
        base,
      ),
    ).toEqual({
      kind: "s3",
      bucket: "my-bucket",
      prefix: "casq/prod",
      endpoint: "http://127.0.0.1:9000",
      region: "eu-west-1",
      forcePathStyle: true,
    });
  });

  it("defaults: region from AWS_REGION, then AWS_DEFAULT_REGION, then us-east-1; virtual-hosted style for AWS", () => {
    expect(parseStoreUrl("s3://bucket", base)).toEqual({
      kind: "s3",
      bucket: "bucket",
      prefix: "",
      region: "us-east-1",
      forcePathStyle: false,
    });
    expect(parseStoreUrl("s3://bucket/p", { ...base, env: { AWS_REGION: "ap-south-1" } })).toMatchObject({
      region: "ap-south-1",
    });
    expect(
      parseStoreUrl("s3://bucket/p", { ...base, env: { AWS_DEFAULT_REGION: "us-west-2" } }),
    ).toMatchObject({
      region: "us-west-2",
    });
    expect(
      parseStoreUrl("s3://bucket/p?region=eu-north-1", { ...base, env: { AWS_REGION: "ap-south-1" } }),
    ).toMatchObject({ region: "eu-north-1" });
  });

  it("path style defaults to true with a custom endpoint and can be turned off", () => {
    expect(parseStoreUrl("s3://bucket/p?endpoint=https://minio.local", base)).toMatchObject({
      forcePathStyle: true,
    });
    expect(parseStoreUrl("s3://bucket/p?endpoint=https://minio.local&path_style=false", base)).toMatchObject({
      forcePathStyle: false,
    });
    expect(parseStoreUrl("s3://bucket/p?path_style=1", base)).toMatchObject({ forcePathStyle: true });
  });

  it("trims slashes around the prefix and reads timeout_ms", () => {
    expect(parseStoreUrl("s3://bucket//a/b/?timeout_ms=2500", base)).toMatchObject({
      prefix: "a/b",
      requestTimeoutMs: 2500,
    });
  });

  it.each([
    ["s3://", /missing bucket/],
    ["s3:bucket/p", /s3:\/\/BUCKET\/PREFIX/],
    ["s3://Upper/p", /not a valid bucket name/],
    ["s3://ab/p", /not a valid bucket name/],
    ["s3://key:secret@bucket/p", /credentials do not go in the URL/],
    ["s3://bucket/a/../b", /bad prefix/],
    ["s3://bucket/with space", /bad prefix/],
    ["s3://bucket/p?endpoint=localhost:9000", /endpoint must be http/],
    ["s3://bucket/p?endpoint=not a url", /not a URL/],
    ["s3://bucket/p?path_style=yes", /path_style must be true or false/],
    ["s3://bucket/p?timeout_ms=0", /timeout_ms must be a positive/],
    ["s3://bucket/p?timeout_ms=1.5", /timeout_ms must be a positive/],
    ["s3://bucket/p?regoin=us-east-1", /unknown parameter "regoin"/],
    ["s3://bucket/p?region=a&region=b", /given twice/],
    ["s3://bucket/p?region=EU West", /not a region name/],
    ["s3://bucket/p#frag", /no #fragment/],
  ])("%s is refused", (url, message) => {
    expect(() => parseStoreUrl(url, base)).toThrow(message);
  });
});

describe("parseStoreUrl: memory: and everything else", () => {
  it("memory: is the in-process store", () => {
    expect(parseStoreUrl("memory:")).toEqual({ kind: "memory" });
    expect(parseStoreUrl("MEMORY:")).toEqual({ kind: "memory" });
    expect(() => parseStoreUrl("memory:foo")).toThrow(/takes no path/);
  });

  it.each([
    ["gs://bucket/p", /unknown scheme "gs:"/],
    ["http://127.0.0.1:9000/bucket", /unknown scheme "http:"/],
    ["./casq-data", /for a directory, write file:\.\/casq-data/],
    ["", /no scheme/],
  ])("%s is refused with the accepted forms", (url, message) => {
    let caught: unknown;
    try {
      parseStoreUrl(url);
    } catch (error) {
      caught = error;
    }
    expect(caught).toBeInstanceOf(StoreUrlError);
    expect((caught as Error).message).toMatch(message);
    expect((caught as Error).message).toContain(STORE_URL_FORMS);
    expect((caught as StoreUrlError).url).toBe(url);
  });
});

describe("openStore", () => {
  it("opens a FileStore for file:, an S3Store for s3:// and a MemoryStore for memory:", async () => {
    const dir = await mkdtemp(join(tmpdir(), "casq-open-store-"));
    try {
      const file = openStore(`file:${join(dir, "data")}`);
      expect(file).toBeInstanceOf(FileStore);
      expect(file.description).toBe(`file:${join(dir, "data")}`);
      await file.close();

      const relative = openStore("file:data", { cwd: dir });
      expect(relative.description).toBe(`file:${join(dir, "data")}`);
      await relative.close();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }

    const s3 = openStore("s3://casq-bucket/prod/eu?endpoint=http://127.0.0.1:9&region=eu-west-1");
    expect(s3).toBeInstanceOf(S3Store);
    expect(s3.description).toBe("s3://casq-bucket/prod/eu (endpoint http://127.0.0.1:9)");
    await s3.close();

    const memory = openStore("memory:");
    expect(memory).toBeInstanceOf(MemoryStore);
    await memory.close();
  });

  it("refuses an unknown scheme with the accepted forms", () => {
    expect(() => openStore("redis://localhost")).toThrow(
      'bad store URL "redis://localhost": unknown scheme "redis:"; expected file:PATH, s3://BUCKET/PREFIX or memory:',
    );
  });
});

describe("the AWS SDK is loaded by the first S3 store, not before", () => {
  it("a process on the file or memory store never loads it; the first s3:// store does", async () => {
    const port = await new Promise<number>((resolve) => {
      const probe = createServer().listen(0, "127.0.0.1", () => {
        const { port } = probe.address() as AddressInfo;
        probe.close(() => resolve(port));
      });
    });
    // A fresh process: the s3:// stores opened by the tests above have loaded the SDK in this one.
    const script = `
      import { createRequire } from "node:module";
      const { openStore } = await import(${JSON.stringify(new URL("./open-store.ts", import.meta.url).href)});
      const loaded = () => Object.keys(createRequire(import.meta.url).cache).some((k) => k.includes("/@aws-sdk/client-s3/"));
      const dir = await (await import("node:fs/promises")).mkdtemp((await import("node:os")).tmpdir() + "/casq-lazy-sdk-");
      const file = openStore("file:" + dir);
      await file.put("k", new Uint8Array([1]), { ifAbsent: true });
      await file.close();
      const memory = openStore("memory:");
      await memory.close();
      const before = loaded();
      const s3 = openStore("s3://bkt/p?endpoint=http://127.0.0.1:${port}&region=us-east-1&timeout_ms=5000");
      const failed = await s3.get("k").then(() => "none", (e) => e.kind);
      await s3.close();
      await (await import("node:fs/promises")).rm(dir, { recursive: true });
      console.log("RESULT " + JSON.stringify({ before, after: loaded(), failed }));
    `;
    const { execFile } = await import("node:child_process");
    const out = await new Promise<string>((resolve, reject) =>
      execFile(
        process.execPath,
        ["--import", "tsx", "--input-type=module", "-e", script],
        {
          timeout: 30_000,
          // Keys from the environment only: a profile or an instance role would be looked up instead.
          env: {
            ...process.env,
            AWS_ACCESS_KEY_ID: "a",
            AWS_SECRET_ACCESS_KEY: "b",
            AWS_PROFILE: undefined,
            AWS_EC2_METADATA_DISABLED: "true",
          },
        },
        (error, stdout, stderr) =>
          error ? reject(new Error(`${error.message}\n${stderr}`)) : resolve(stdout),
      ),
    );
    // Nothing listens on the port: the S3 store's call goes out (the SDK is loaded) and is refused.
    const result = out.split("\n").find((line) => line.startsWith("RESULT "));
    expect(JSON.parse(result?.slice("RESULT ".length) ?? "null")).toEqual({
      before: false,
      after: true,
      failed: "unavailable",
    });
  });
});
