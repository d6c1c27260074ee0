/**
 * Unit tests of S3Store's error classification and request shape, against a
 * scripted HTTP server on loopback: each test decides how the "S3" answers
 * (an S3 error document, a hang, a reset socket, a refused connection) and
 * checks the typed store error the caller sees. The real-server behaviour is
 * covered by test/store/s3-store.conformance.test.ts.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { S3Client } from "@aws-sdk/client-s3";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { classifyS3Error, type S3ErrorContext, S3Store } from "./s3-store.ts";
import { isStoreError, type StoreErrorKind } from "./store-errors.ts";

/** One request as the scripted server saw it. */
interface SeenRequest {
  method: string;
  url: string;
  headers: IncomingMessage["headers"];
  body: Buffer;
}

type Script = (request: SeenRequest, res: ServerResponse) => void;

let server: Server;
let endpoint: string;
let script: Script = (_request, res) => res.end();
const seen: SeenRequest[] = [];
const stores: S3Store[] = [];

beforeAll(async () => {
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      const request = {
        method: req.method ?? "",
        url: req.url ?? "",
        headers: req.headers,
        body: Buffer.concat(chunks),
      };
      seen.push(request);
      script(request, res);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  endpoint = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterEach(async () => {
  seen.length = 0;
  script = (_request, res) => res.end();
  for (const store of stores.splice(0)) await store.close();
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

function makeStore(options: { requestTimeoutMs?: number; endpoint?: string; prefix?: string } = {}): S3Store {
  const store = new S3Store({
    bucket: "bkt",
    prefix: options.prefix ?? "pre/fix",
    endpoint: options.endpoint ?? endpoint,
    region: "us-east-1",
    forcePathStyle: true,
    credentials: { accessKeyId: "test", secretAccessKey: "test" },
    requestTimeoutMs: options.requestTimeoutMs ?? 5_000,
  });
  stores.push(store);
  return store;
}

function s3Error(status: number, code: string, message = "scripted"): Script {
  return (_request, res) => {
    res.writeHead(status, { "content-type": "application/xml", "x-amz-request-id": "req-1" });
    res.end(
      `<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>${code}</Code><Message>${message}</Message><RequestId>req-1</RequestId></Error>`,
    );
  };
}

const hang: Script = () => {};

const resetAfterRequest: Script = (_request, res) => {
  res.socket?.destroy();
};

async function kindOf(action: () => Promise<unknown>): Promise<StoreErrorKind> {
  try {
    await action();
  } catch (error) {
    if (isStoreError(error)) return error.kind;
    throw new Error(`expected a StoreError, got ${String(error)}`, { cause: error });
  }
  throw new Error("expected the call to reject, but it resolved");
}

const body = new TextEncoder().encode('{"v":1}');

describe("S3Store requests", () => {
  it("put-if-absent sends If-None-Match: * under the prefix, with no SDK checksum headers", async () => {
    script = (_request, res) => {
      res.writeHead(200, { etag: '"abc"' });
      res.end();
    };
    const result = await makeStore().put("queues/q/0.json", body, { ifAbsent: true });
    expect(result.etag).toBe('"abc"');
    expect(seen).toHaveLength(1);
    const [request] = seen;
    expect(request?.method).toBe("PUT");
    expect(request?.url.split("?")[0]).toBe("/bkt/pre/fix/queues/q/0.json");
    expect(request?.headers["if-none-match"]).toBe("*");
    expect(request?.headers["if-match"]).toBeUndefined();
    expect(Object.keys(request?.headers ?? {}).filter((name) => name.startsWith("x-amz-checksum"))).toEqual(
      [],
    );
    expect(request?.headers["content-encoding"]).toBeUndefined();
    expect(request?.body.toString()).toBe('{"v":1}');
  });

  it("put-if-match sends If-Match verbatim; delete-if-match too", async () => {
    script = (request, res) => {
      res.writeHead(request.method === "DELETE" ? 204 : 200, { etag: '"new"' });
      res.end();
    };
    const store = makeStore();
    await store.put("doc.json", body, { ifMatch: '"old"' });
    await store.delete("doc.json", { ifMatch: '"new"' });
    expect(seen.map((request) => [request.method, request.headers["if-match"]])).toEqual([
      ["PUT", '"old"'],
      ["DELETE", '"new"'],
    ]);
  });

  it("get returns the body bytes and the ETag", async () => {
    script = (_request, res) => {
      res.writeHead(200, { etag: '"e1"', "content-length": "7" });
      res.end('{"v":1}');
    };
    const read = await makeStore().get("doc.json");
    expect(read?.etag).toBe('"e1"');
    expect(new TextDecoder().decode(read?.body)).toBe('{"v":1}');
  });

  it("list follows continuation tokens and strips the store prefix", async () => {
    script = (request, res) => {
      const url = new URL(request.url, endpoint);
      const second = url.searchParams.get("continuation-token") === "page2";
      const contents = second
        ? `<Contents><Key>pre/fix/q/b</Key><ETag>"eb"</ETag><Size>2</Size></Contents>`
        : `<Contents><Key>pre/fix/q/a</Key><ETag>"ea"</ETag><Size>1</Size></Contents>`;
      res.writeHead(200, { "content-type": "application/xml" });
      res.end(
        `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>bkt</Name><Prefix>${url.searchParams.get("prefix")}</Prefix><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>${second ? "false" : "true"}</IsTruncated>${second ? "" : "<NextContinuationToken>page2</NextContinuationToken>"}${contents}</ListBucketResult>`,
      );
    };
    const listed = await makeStore().list("q/");
    expect(listed).toEqual([
      { key: "q/a", etag: '"ea"', size: 1 },
      { key: "q/b", etag: '"eb"', size: 2 },
    ]);
    expect(seen.map((request) => new URL(request.url, endpoint).searchParams.get("prefix"))).toEqual([
      "pre/fix/q/",
      "pre/fix/q/",
    ]);
  });

  it("never retries inside the SDK: one 503 is one request", async () => {
    script = s3Error(503, "SlowDown");
    expect(await kindOf(() => makeStore().put("doc.json", body, { ifAbsent: true }))).toBe("unavailable");
    expect(seen).toHaveLength(1);
  });

  it("rejects a bad key or prefix before sending anything", async () => {
    const store = makeStore();
    expect(await kindOf(() => store.get("../escape"))).toBe("invalid");
    expect(await kindOf(() => store.put("a//b", body, { ifAbsent: true }))).toBe("invalid");
    expect(await kindOf(() => store.list("/abs"))).toBe("invalid");
    expect(seen).toHaveLength(0);
    expect(() => new S3Store({ bucket: "bkt", prefix: "../up" })).toThrow(/segment/);
  });

  it("describes itself as s3://bucket/prefix with the endpoint", () => {
    expect(makeStore().description).toBe(`s3://bkt/pre/fix (endpoint ${endpoint})`);
    expect(new S3Store({ bucket: "b", prefix: "/p/q/" }).description).toBe("s3://b/p/q");
  });

  it("rejects calls after close() as unavailable", async () => {
    const store = makeStore();
    await store.close();
    expect(await kindOf(() => store.get("doc.json"))).toBe("unavailable");
  });

  it("a call waiting for the store's client (made when the SDK is loaded) fails unavailable if the store is closed or the call aborted meanwhile, sending nothing", async () => {
    // Every other test calls a store made a moment before: those calls wait for the client and go out.
    const closing = makeStore();
    const closed = kindOf(() => closing.put("k", body, { ifAbsent: true }));
    await closing.close();
    expect(await closed).toBe("unavailable");
    const controller = new AbortController();
    const aborting = makeStore();
    const aborted = kindOf(() => aborting.put("k", body, { ifAbsent: true }, { signal: controller.signal }));
    controller.abort();
    expect(await aborted).toBe("unavailable");
    expect(seen).toHaveLength(0);
  });
});

describe("S3Store error classification over HTTP", () => {
  const cases: {
    name: string;
    script: Script;
    put?: StoreErrorKind;
    putIfMatch?: StoreErrorKind;
    get?: StoreErrorKind | "undefined";
    del?: StoreErrorKind | "resolves";
    delIfMatch?: StoreErrorKind;
  }[] = [
    {
      name: "412 PreconditionFailed",
      script: s3Error(412, "PreconditionFailed"),
      put: "precondition_failed",
    },
    {
      name: "409 ConditionalRequestConflict",
      script: s3Error(409, "ConditionalRequestConflict"),
      put: "conflict",
      get: "unavailable",
    },
    {
      name: "404 NoSuchKey",
      script: s3Error(404, "NoSuchKey"),
      putIfMatch: "precondition_failed",
      get: "undefined",
      del: "resolves",
      delIfMatch: "precondition_failed",
    },
    {
      name: "404 NoSuchBucket",
      script: s3Error(404, "NoSuchBucket"),
      put: "misconfigured",
      putIfMatch: "misconfigured",
      get: "misconfigured",
      delIfMatch: "misconfigured",
    },
    {
      // VersityGW's answer to an unknown access key: a 404 that must not read as "no such key".
      name: "404 XAdminUserNotFound",
      script: s3Error(404, "XAdminUserNotFound"),
      put: "misconfigured",
      get: "misconfigured",
      del: "misconfigured",
    },
    { name: "503 SlowDown", script: s3Error(503, "SlowDown"), put: "unavailable", get: "unavailable" },
    { name: "429 TooManyRequests", script: s3Error(429, "TooManyRequests"), put: "unavailable" },
    {
      name: "500 InternalError",
      script: s3Error(500, "InternalError"),
      put: "unavailable",
      get: "unavailable",
    },
    {
      name: "504 from a gateway",
      script: s3Error(504, "GatewayTimeout"),
      put: "ambiguous",
      get: "unavailable",
    },
    {
      name: "403 AccessDenied",
      script: s3Error(403, "AccessDenied"),
      put: "misconfigured",
      get: "misconfigured",
    },
    {
      name: "403 SignatureDoesNotMatch",
      script: s3Error(403, "SignatureDoesNotMatch"),
      put: "misconfigured",
      get: "misconfigured",
    },
    { name: "403 without a known code", script: s3Error(403, "Forbidden"), get: "misconfigured" },
    { name: "400 EntityTooLarge", script: s3Error(400, "EntityTooLarge"), put: "invalid" },
    { name: "501 NotImplemented", script: s3Error(501, "NotImplemented"), putIfMatch: "misconfigured" },
    {
      name: "socket reset after the request arrived",
      script: resetAfterRequest,
      put: "ambiguous",
      putIfMatch: "ambiguous",
      get: "unavailable",
      del: "ambiguous",
    },
  ];

  for (const testCase of cases) {
    it(testCase.name, async () => {
      script = testCase.script;
      const store = makeStore();
      if (testCase.put)
        expect(await kindOf(() => store.put("k", body, { ifAbsent: true })), "put").toBe(testCase.put);
      if (testCase.putIfMatch)
        expect(await kindOf(() => store.put("k", body, { ifMatch: '"e"' })), "put-if-match").toBe(
          testCase.putIfMatch,
        );
      if (testCase.get === "undefined") expect(await store.get("k")).toBeUndefined();
      else if (testCase.get) expect(await kindOf(() => store.get("k")), "get").toBe(testCase.get);
      if (testCase.del === "resolves") await store.delete("k");
      else if (testCase.del) expect(await kindOf(() => store.delete("k")), "delete").toBe(testCase.del);
      if (testCase.delIfMatch)
        expect(await kindOf(() => store.delete("k", { ifMatch: '"e"' })), "delete-if-match").toBe(
          testCase.delIfMatch,
        );
    });
  }

  it("a request timeout after a put was sent is ambiguous; for get and list it is unavailable", async () => {
    script = hang;
    const store = makeStore({ requestTimeoutMs: 300 });
    expect(await kindOf(() => store.put("k", body, { ifMatch: '"e"' }))).toBe("ambiguous");
    expect(await kindOf(() => store.delete("k", { ifMatch: '"e"' }))).toBe("ambiguous");
    expect(await kindOf(() => store.get("k"))).toBe("unavailable");
    expect(await kindOf(() => store.list(""))).toBe("unavailable");
    expect(seen.map((request) => request.method)).toEqual(["PUT", "DELETE", "GET", "GET"]);
  });

  it("an abort while a put is in flight is ambiguous (it may have landed); for get it is unavailable", async () => {
    script = hang;
    const store = makeStore();
    const abortSoon = () => {
      const controller = new AbortController();
      setTimeout(() => controller.abort(new Error("deadline")), 150);
      return controller.signal;
    };
    expect(await kindOf(() => store.put("k", body, { ifAbsent: true }, { signal: abortSoon() }))).toBe(
      "ambiguous",
    );
    expect(await kindOf(() => store.get("k", { signal: abortSoon() }))).toBe("unavailable");
    expect(seen).toHaveLength(2);
  });

  it("an abort before sending is unavailable and sends nothing", async () => {
    const controller = new AbortController();
    controller.abort();
    const store = makeStore();
    expect(await kindOf(() => store.put("k", body, { ifAbsent: true }, { signal: controller.signal }))).toBe(
      "unavailable",
    );
    expect(await kindOf(() => store.delete("k", { signal: controller.signal }))).toBe("unavailable");
    expect(seen).toHaveLength(0);
  });

  it("an abort while credentials are still being resolved is unavailable and sends nothing", async () => {
    const client = new S3Client({
      endpoint,
      region: "us-east-1",
      forcePathStyle: true,
      maxAttempts: 1,
      credentials: async () => {
        await new Promise((resolve) => setTimeout(resolve, 300));
        return { accessKeyId: "test", secretAccessKey: "test" };
      },
    });
    const store = new S3Store({ bucket: "bkt", client });
    try {
      const controller = new AbortController();
      setTimeout(() => controller.abort(), 50);
      expect(
        await kindOf(() => store.put("k", body, { ifAbsent: true }, { signal: controller.signal })),
      ).toBe("unavailable");
      // The SDK gives up at the abort; wait past the credentials delay to see that nothing goes out later either.
      await new Promise((resolve) => setTimeout(resolve, 400));
      expect(seen).toHaveLength(0);
    } finally {
      await store.close();
      client.destroy();
    }
  });

  it("a refused connection is unavailable, even for a put (nothing was sent)", async () => {
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, "127.0.0.1", resolve));
    const port = (closed.address() as AddressInfo).port;
    await new Promise<void>((resolve) => closed.close(() => resolve()));
    const store = makeStore({ endpoint: `http://127.0.0.1:${port}` });
    expect(await kindOf(() => store.put("k", body, { ifMatch: '"e"' }))).toBe("unavailable");
    expect(await kindOf(() => store.delete("k"))).toBe("unavailable");
    expect(await kindOf(() => store.get("k"))).toBe("unavailable");
  });
});

describe("classifyS3Error", () => {
  const put: S3ErrorContext = { operation: "put", key: "k", sent: true, ifMatch: true };
  const get: S3ErrorContext = { operation: "get", key: "k", sent: true };
  const networkError = (code: string, name = "Error") =>
    Object.assign(new Error(`network ${code}`), { code, name });

  it("a failure before the request was handed to HTTP is unavailable, even for a write", () => {
    const timeout = Object.assign(new Error("timed out"), { name: "TimeoutError" });
    expect(classifyS3Error(timeout, { ...put, sent: false }).kind).toBe("unavailable");
  });

  it("no credentials at all is misconfigured (retrying cannot help) and says where credentials come from", () => {
    const credentials = Object.assign(new Error("Could not load credentials from any providers"), {
      name: "CredentialsProviderError",
    });
    const classified = classifyS3Error(credentials, { ...put, sent: false });
    expect(classified.kind).toBe("misconfigured");
    expect(classified.message).toContain("AWS_ACCESS_KEY_ID");
    expect(classifyS3Error(credentials, get).kind).toBe("misconfigured");
  });

  it("connection-level errors before sending are unavailable; resets and timeouts after are ambiguous for writes", () => {
    for (const code of ["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH"])
      expect(classifyS3Error(networkError(code), put).kind, code).toBe("unavailable");
    const connectTimeout = Object.assign(
      new Error("the request socket did not establish a connection with the server within 100 ms"),
      { name: "TimeoutError" },
    );
    expect(classifyS3Error(connectTimeout, put).kind).toBe("unavailable");
    for (const code of ["ECONNRESET", "EPIPE", "ETIMEDOUT"]) {
      expect(classifyS3Error(networkError(code, "TimeoutError"), put).kind, code).toBe("ambiguous");
      expect(classifyS3Error(networkError(code, "TimeoutError"), { ...put, operation: "delete" }).kind).toBe(
        "ambiguous",
      );
      expect(classifyS3Error(networkError(code, "TimeoutError"), get).kind, code).toBe("unavailable");
    }
    const abort = Object.assign(new Error("Request aborted"), { name: "AbortError" });
    expect(classifyS3Error(abort, put).kind).toBe("ambiguous");
    expect(classifyS3Error(abort, get).kind).toBe("unavailable");
  });

  it("a 2xx whose response could not be parsed means a write landed: ambiguous", () => {
    const parse = Object.assign(new Error("Deserialization error"), { $metadata: { httpStatusCode: 200 } });
    expect(classifyS3Error(parse, put).kind).toBe("ambiguous");
    expect(classifyS3Error(parse, get).kind).toBe("unavailable");
  });

  it("keeps the cause and the key, and passes store errors through", () => {
    const original = Object.assign(new Error("x"), { name: "SlowDown", $metadata: { httpStatusCode: 503 } });
    const classified = classifyS3Error(original, put);
    expect(classified.cause).toBe(original);
    expect(classified.key).toBe("k");
    expect(classified.message).toMatch(/SlowDown/);
    expect(classifyS3Error(classified, get)).toBe(classified);
  });
});
