/**
 * `s3://` — the object store on AWS S3 or any S3-compatible server, through
 * @aws-sdk/client-s3 and S3's conditional writes.
 *
 * How casq's CAS maps onto S3:
 *
 * | store call                  | S3 request                              | lost the race            |
 * |-----------------------------|-----------------------------------------|--------------------------|
 * | `get(key)`                  | GetObject → body bytes + `ETag` header  | (404 NoSuchKey → `undefined`) |
 * | `put(key, { ifAbsent })`    | PutObject `If-None-Match: *`            | 412 PreconditionFailed   |
 * | `put(key, { ifMatch: e })`  | PutObject `If-Match: e`                 | 412, or 404 NoSuchKey when the key is gone |
 * | `delete(key, { ifMatch })`  | DeleteObject `If-Match: e`              | 412, or 404 NoSuchKey    |
 * | `delete(key)`               | DeleteObject (a missing key is a 204)   | —                        |
 * | `list(prefix)`              | ListObjectsV2, every page               | —                        |
 *
 * S3 evaluates the condition and writes atomically, so of N writers holding
 * the same etag exactly one gets 200; the others get 412 (or 409
 * ConditionalRequestConflict when another conditional write on the key is
 * still in flight — a {@link ConflictError}: re-read, then retry).
 *
 * The etag is S3's `ETag` header, quotes included, passed back verbatim in
 * `If-Match`. Caveat: S3's ETag of a single-part upload (without SSE-KMS) is
 * the MD5 of the bytes, so rewriting identical bytes, or re-creating a key with
 * the bytes it had before, yields the same etag again (AWS, MinIO, moto and
 * gofakes3 all do this). CAS stays correct — an `If-Match` that succeeds
 * means the object holds exactly the bytes the writer read — but "the etag
 * changes on every write" does not hold here; a writer that needs to tell its
 * own write apart must put something unique (a write id) in the bytes.
 *
 * Errors are classified once, in {@link classifyS3Error}, from three facts:
 * the HTTP status / S3 error code, whether the request had been handed to
 * the HTTP layer ("sent"), and whether the call was a write. The rule that
 * matters for durability: once a put or delete may have reached the server,
 * a timeout, a reset socket or an abort is an {@link AmbiguousWriteError}
 * (it may have landed — find out by re-reading), never "unavailable".
 *
 * SDK settings, decided here once:
 * - `maxAttempts: 1`: the SDK never retries. A retried conditional put whose
 *   first attempt landed would come back 412 and turn a success into a
 *   "lost race"; the `RetryingStore` wrapper retries only what is safe. Reads
 *   go through the same single-attempt client so that there is exactly one
 *   retry policy in the process. A caller passing its own `client` must
 *   configure `maxAttempts: 1` itself.
 * - `requestChecksumCalculation` / `responseChecksumValidation` =
 *   `WHEN_REQUIRED`: newer SDKs add CRC32 checksum headers/trailers to every
 *   PutObject by default, which several S3-compatible servers reject or
 *   mishandle. The upload is still integrity-checked: the SDK signs the
 *   body's SHA-256 into `x-amz-content-sha256`, which S3 verifies.
 * - The SDK's Node version banner is turned off (see {@link NODE_VERSION_NOTICE_ENV}).
 * - The SDK is loaded when the first S3 store is made, not when this module
 *   is: it takes ~0.3 s of start-up that a broker, or a `casq` command, on
 *   another store does not pay.
 * - `requestTimeoutMs` bounds each HTTP exchange (connect + request + response
 *   headers) with `throwOnRequestTimeout`; a per-call deadline comes from
 *   `options.signal` (the SDK's `abortSignal`).
 */
import type {
  DeleteObjectCommand,
  GetObjectCommand,
  ListObjectsV2Command,
  ListObjectsV2CommandOutput,
  PutObjectCommand,
  PutObjectCommandOutput,
  S3Client,
  S3ClientConfig,
} from "@aws-sdk/client-s3";
import { validateKey, validatePrefix } from "./keys.ts";
import type {
  CallOptions,
  ListedObject,
  ObjectStore,
  PutCondition,
  PutResult,
  StoredObject,
} from "./object-store.ts";
import {
  AmbiguousWriteError,
  ConflictError,
  InvalidRequestError,
  NotFoundError,
  PreconditionFailedError,
  StoreError,
  StoreMisconfiguredError,
  UnavailableError,
} from "./store-errors.ts";

/** Default bound on one HTTP exchange with S3, in milliseconds. */
export const DEFAULT_S3_REQUEST_TIMEOUT_MS = 30_000;

/** Options of {@link S3Store}. */
export interface S3StoreOptions {
  /** Bucket name; it must exist. */
  readonly bucket: string;
  /** Key prefix inside the bucket (no leading or trailing `/` needed); store keys live under `prefix/`. */
  readonly prefix?: string;
  /** Endpoint URL of an S3-compatible server, e.g. `http://127.0.0.1:9000`. Omit for AWS. */
  readonly endpoint?: string;
  /** Region; defaults to `AWS_REGION`, then `us-east-1`. */
  readonly region?: string;
  /** Address buckets as `endpoint/bucket/key` instead of `bucket.endpoint/key` (most S3-compatible servers need this). */
  readonly forcePathStyle?: boolean;
  /** Bound on one HTTP exchange (default {@link DEFAULT_S3_REQUEST_TIMEOUT_MS}). Ignored when `client` is given. */
  readonly requestTimeoutMs?: number;
  /**
   * Static credentials; when omitted the standard AWS chain is used (env,
   * shared config, SSO, web identity, instance metadata). Ignored when
   * `client` is given.
   */
  readonly credentials?: { readonly accessKeyId: string; readonly secretAccessKey: string };
  /**
   * A ready client to use instead of building one. It must have
   * `maxAttempts: 1` (see the module header). The store does not destroy a
   * client it did not create.
   */
  readonly client?: S3Client;
}

/** The store operations, as {@link classifyS3Error} distinguishes them. */
export type S3Operation = "get" | "put" | "delete" | "list";

/** What {@link classifyS3Error} needs to know about the failed call. */
export interface S3ErrorContext {
  readonly operation: S3Operation;
  /** The store key (or list prefix) the call was about. */
  readonly key: string;
  /**
   * Whether the request had been handed to the HTTP layer (signed and about
   * to be written to a socket). False means it certainly never reached S3.
   */
  readonly sent: boolean;
  /** For put and delete: whether the write carried `If-Match`. */
  readonly ifMatch?: boolean;
}

/**
 * Network error codes that mean the request never left this machine (no
 * connection was made), so a write cannot have landed.
 */
const NOT_SENT_CODES = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EAI_FAIL",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENETDOWN",
  "EADDRNOTAVAIL",
  "ERR_INVALID_URL",
]);

/** S3 error codes that mean "slow down / try later": the request was refused, not executed. */
const THROTTLING_CODES = new Set([
  "SlowDown",
  "Throttling",
  "ThrottlingException",
  "TooManyRequests",
  "TooManyRequestsException",
  "RequestLimitExceeded",
  "ServiceUnavailable",
  "RequestTimeout",
]);

/**
 * Auth and configuration errors: every request fails the same way until an
 * operator changes something, so retrying will not help
 * ({@link StoreMisconfiguredError}). Each says what to fix.
 */
const CONFIGURATION_CODES = new Map<string, string>([
  ["AccessDenied", "access denied: check the credentials and the bucket policy"],
  ["AllAccessDisabled", "all access to the bucket is disabled: check the bucket and the account"],
  ["AccountProblem", "the account has a problem that prevents access: check the account"],
  ["InvalidAccessKeyId", "the access key id is not known to the server: check the credentials"],
  // VersityGW answers an unknown access key with a 404 of this code.
  ["XAdminUserNotFound", "the access key id is not known to the server: check the credentials"],
  ["SignatureDoesNotMatch", "the request signature does not match: check the secret key and region"],
  ["ExpiredToken", "the session token has expired: refresh the credentials"],
  ["InvalidToken", "the session token is not valid: check the credentials"],
  ["AuthorizationHeaderMalformed", "the authorization header is malformed: check the region"],
  ["PermanentRedirect", "the bucket is in another region or needs another endpoint: set region= in the URL"],
  ["NoSuchBucket", "the bucket does not exist: create it or fix the store URL"],
  ["InvalidBucketName", "the server does not accept the bucket name: fix the store URL"],
  ["NotImplemented", "the server does not implement this request (does it support conditional writes?)"],
  ["RequestTimeTooSkewed", "this machine's clock is too far from the server's: fix the clock (NTP)"],
]);

/** Request errors that are casq's own fault or the object's, not the configuration's. */
const REQUEST_CODES = new Map<string, string>([
  ["EntityTooLarge", "the object is larger than the server accepts"],
  ["InvalidArgument", "the server rejected an argument"],
]);

/** What to do when the AWS SDK found no credentials at all. */
const NO_CREDENTIALS =
  "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run where an instance or pod role provides them";

interface ErrorShape {
  name?: unknown;
  code?: unknown;
  Code?: unknown;
  message?: unknown;
  $metadata?: { httpStatusCode?: unknown };
  $response?: { statusCode?: unknown };
}

function shapeOf(error: unknown): ErrorShape {
  return typeof error === "object" && error !== null ? (error as ErrorShape) : {};
}

function statusOf(error: ErrorShape): number | undefined {
  const status = error.$metadata?.httpStatusCode ?? error.$response?.statusCode;
  return typeof status === "number" ? status : undefined;
}

function describe(error: unknown): string {
  const shape = shapeOf(error);
  const parts: string[] = [];
  const name = typeof shape.name === "string" ? shape.name : undefined;
  if (name && name !== "Error") parts.push(name);
  const status = statusOf(shape);
  if (status !== undefined) parts.push(`HTTP ${status}`);
  if (typeof shape.code === "string" && shape.code !== name) parts.push(shape.code);
  const message = typeof shape.message === "string" ? shape.message : String(error);
  return parts.length > 0 ? `${parts.join(" ")}: ${message}` : message;
}

/**
 * Maps any failure of an S3 call to the typed store error the layers above
 * decide on. This is the single place where S3 statuses, S3 error codes and
 * Node network errors are interpreted:
 *
 * - 412 / `PreconditionFailed` → {@link PreconditionFailedError}; 404
 *   `NoSuchKey` on an `If-Match` put or delete → also precondition failed
 *   (there is nothing to match); 404 on a get or an unconditional delete →
 *   {@link NotFoundError} (the store methods turn it into `undefined` / success).
 * - 409 (`ConditionalRequestConflict`, `OperationAborted`) on a write →
 *   {@link ConflictError}.
 * - 429, 503, 500, throttling codes → {@link UnavailableError} (S3 refused or
 *   failed the request; it was not executed). 502 / 504 come from a gateway
 *   that may have forwarded the request: ambiguous for writes.
 * - auth (403, unknown key, bad signature), missing bucket, wrong region,
 *   not implemented, no credentials at all → {@link StoreMisconfiguredError}
 *   (checked before 404, so a 404 NoSuchBucket or VersityGW's 404 for an
 *   unknown access key never reads as "no such key");
 * - too large, bad argument, other 400s → {@link InvalidRequestError}.
 * - no response at all: connection refused / DNS failure / connect timeout /
 *   not yet handed to HTTP → unavailable; anything else (timeout, reset,
 *   abort) after a write was sent → {@link AmbiguousWriteError}, for reads →
 *   unavailable.
 */
export function classifyS3Error(error: unknown, context: S3ErrorContext): StoreError {
  if (error instanceof StoreError) return error;
  const { operation, key, sent } = context;
  const isWrite = operation === "put" || operation === "delete";
  const shape = shapeOf(error);
  const status = statusOf(shape);
  const name = typeof shape.name === "string" ? shape.name : "";
  const code = typeof shape.Code === "string" ? shape.Code : name;
  const detail = describe(error);
  const options = { cause: error };

  if (status !== undefined && status > 0) {
    if (status === 412 || code === "PreconditionFailed") {
      const what = context.ifMatch
        ? "the etag no longer matches"
        : operation === "put"
          ? "the key already exists"
          : "the precondition did not hold";
      return new PreconditionFailedError(key, `${what} (${detail})`, options);
    }
    const configuration = CONFIGURATION_CODES.get(code);
    if (configuration !== undefined || status === 403)
      return new StoreMisconfiguredError(
        key,
        `${configuration ?? "the server refused access: check the credentials and the bucket policy"} (${detail})`,
        options,
      );
    if (status === 404 || code === "NoSuchKey" || code === "NotFound") {
      if (isWrite && context.ifMatch)
        return new PreconditionFailedError(key, `the key does not exist (${detail})`, options);
      return new NotFoundError(key, options);
    }
    if (status === 409 || code === "ConditionalRequestConflict" || code === "OperationAborted") {
      if (isWrite)
        return new ConflictError(key, `a concurrent conditional write was in progress (${detail})`, options);
      return new UnavailableError(key, detail, options);
    }
    if (status === 429 || THROTTLING_CODES.has(code)) return new UnavailableError(key, detail, options);
    if (status === 501)
      return new StoreMisconfiguredError(
        key,
        `the server does not implement this request (does it support conditional writes?) (${detail})`,
        options,
      );
    const request = REQUEST_CODES.get(code);
    if (request !== undefined || status === 400)
      return new InvalidRequestError(
        key,
        `${request ?? "the server rejected the request"} (${detail})`,
        options,
      );
    if ((status === 502 || status === 504) && isWrite)
      return new AmbiguousWriteError(
        key,
        `a gateway answered ${status} after the request was forwarded (${detail})`,
        options,
      );
    if (status >= 500) return new UnavailableError(key, detail, options);
    if (status >= 200 && status < 300) {
      // A 2xx whose body could not be read or parsed: for a write, it landed.
      if (isWrite)
        return new AmbiguousWriteError(
          key,
          `the server answered ${status} but the response was unreadable (${detail})`,
          options,
        );
      return new UnavailableError(key, detail, options);
    }
    return new InvalidRequestError(key, `unexpected answer from the server (${detail})`, options);
  }

  // No HTTP status: the failure is in this process or the network.
  const networkCode = typeof shape.code === "string" ? shape.code : "";
  const message = typeof shape.message === "string" ? shape.message : "";
  // Without credentials nothing can ever be signed: the chain was tried and came up empty.
  if (name === "CredentialsProviderError")
    return new StoreMisconfiguredError(key, `${NO_CREDENTIALS} (${detail})`, options);
  const neverSent =
    !sent || NOT_SENT_CODES.has(networkCode) || message.includes("did not establish a connection");
  if (neverSent) return new UnavailableError(key, `the request was not sent (${detail})`, options);
  if (isWrite)
    return new AmbiguousWriteError(key, `no answer after the request was sent (${detail})`, options);
  return new UnavailableError(key, detail, options);
}

/**
 * The AWS SDK's switch for its Node version notice (documented by the SDK:
 * see `emitWarningIfUnsupportedVersion` in @aws-sdk/core).
 */
export const NODE_VERSION_NOTICE_ENV = "AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED";

/**
 * Turns off the AWS SDK's 7-line `NodeVersionSupportWarning` banner, which
 * every client prints on Node < 22 to announce that SDK releases from 2027
 * on will need Node 22. casq pins its SDK version, so the banner asks
 * nothing of a casq operator today. Only that one notice is affected (every
 * other warning still prints), and an operator who sets the variable
 * (`=false`) keeps the SDK's own behaviour. See docs/operations.md.
 */
function quietNodeVersionNotice(): void {
  process.env[NODE_VERSION_NOTICE_ENV] ??= "true";
}

type S3Sdk = typeof import("@aws-sdk/client-s3");
let sdkLoading: Promise<S3Sdk> | undefined;

/** The AWS SDK for S3, imported once, by the first S3 store made (a failed import is tried again by the next store). */
function loadSdk(): Promise<S3Sdk> {
  sdkLoading ??= import("@aws-sdk/client-s3").catch((error: unknown) => {
    sdkLoading = undefined;
    throw error;
  });
  return sdkLoading;
}

/** Normalises a store prefix: no leading/trailing `/`, validated like a key. */
function normalizePrefix(prefix: string | undefined): string {
  const trimmed = (prefix ?? "").replace(/^\/+|\/+$/g, "");
  if (trimmed !== "") validateKey(trimmed);
  return trimmed;
}

/** An {@link ObjectStore} on an S3 bucket, using conditional PutObject / DeleteObject for CAS. */
export class S3Store implements ObjectStore {
  /** `s3://bucket/prefix`, plus the endpoint when it is not AWS. */
  readonly description: string;
  /** The bucket this store writes to. */
  readonly bucket: string;
  /** The key prefix inside the bucket, without trailing `/` (empty for the bucket root). */
  readonly prefix: string;
  /** The SDK and the client, once the SDK is loaded (the caller's own client too waits for the SDK's commands). */
  private readonly ready: Promise<{ readonly sdk: S3Sdk; readonly client: S3Client }>;
  /** The client, once made: `close` destroys it when this store made it. */
  private client: S3Client | undefined;
  private readonly ownsClient: boolean;
  private closed = false;

  constructor(options: S3StoreOptions) {
    if (!options.bucket) throw new InvalidRequestError(undefined, "an S3 store needs a bucket name");
    this.bucket = options.bucket;
    this.prefix = normalizePrefix(options.prefix);
    const where = `s3://${this.bucket}/${this.prefix}`;
    this.description = options.endpoint ? `${where} (endpoint ${options.endpoint})` : where;
    this.ownsClient = options.client === undefined;
    const requestTimeout = options.requestTimeoutMs ?? DEFAULT_S3_REQUEST_TIMEOUT_MS;
    const config: S3ClientConfig = {
      region: options.region ?? process.env.AWS_REGION ?? "us-east-1",
      forcePathStyle: options.forcePathStyle ?? false,
      maxAttempts: 1,
      requestChecksumCalculation: "WHEN_REQUIRED",
      responseChecksumValidation: "WHEN_REQUIRED",
      requestHandler: {
        requestTimeout,
        throwOnRequestTimeout: true,
        connectionTimeout: Math.min(requestTimeout, 5_000),
      },
    };
    if (options.endpoint) config.endpoint = options.endpoint;
    if (options.credentials) config.credentials = { ...options.credentials };
    this.ready = loadSdk().then((sdk) => {
      if (options.client !== undefined) this.client = options.client;
      else if (this.closed) {
        // Closed while the SDK loaded: every call fails as closed, so no client is made at all.
        throw new UnavailableError(undefined, `the store ${this.description} is closed`);
      } else {
        quietNodeVersionNotice();
        this.client = new sdk.S3Client(config);
      }
      return { sdk, client: this.client };
    });
    // A failure to load is reported by the first call that needs the SDK.
    this.ready.catch(() => undefined);
  }

  /** The S3 object key of a store key. */
  private objectKey(key: string): string {
    return this.prefix === "" ? key : `${this.prefix}/${key}`;
  }

  async get(key: string, options?: CallOptions): Promise<StoredObject | undefined> {
    validateKey(key);
    this.checkUsable(key, options);
    const { sdk, client } = await this.usable(key, options);
    const command = new sdk.GetObjectCommand({ Bucket: this.bucket, Key: this.objectKey(key) });
    const sent = trackSent(command, key, options?.signal);
    try {
      const response = await client.send(command, { abortSignal: options?.signal });
      if (!response.Body) throw new UnavailableError(key, "the server returned no body");
      const body = await response.Body.transformToByteArray();
      if (!response.ETag)
        throw new InvalidRequestError(key, "the server returned no ETag; casq needs an S3 store with ETags");
      return { body, etag: response.ETag };
    } catch (error) {
      const classified = classifyS3Error(error, { operation: "get", key, sent: sent.value });
      if (classified.kind === "not_found") return undefined;
      throw classified;
    }
  }

  async put(
    key: string,
    body: Uint8Array,
    condition: PutCondition,
    options?: CallOptions,
  ): Promise<PutResult> {
    validateKey(key);
    this.checkUsable(key, options);
    const ifMatch = "ifMatch" in condition;
    const { sdk, client } = await this.usable(key, options);
    const command = new sdk.PutObjectCommand({
      Bucket: this.bucket,
      Key: this.objectKey(key),
      Body: body,
      ContentLength: body.byteLength,
      ...("ifMatch" in condition ? { IfMatch: condition.ifMatch } : { IfNoneMatch: "*" }),
    });
    const sent = trackSent(command, key, options?.signal);
    let response: PutObjectCommandOutput;
    try {
      response = await client.send(command, { abortSignal: options?.signal });
    } catch (error) {
      throw classifyS3Error(error, { operation: "put", key, sent: sent.value, ifMatch });
    }
    if (!response.ETag)
      throw new AmbiguousWriteError(
        key,
        "the server accepted the write but returned no ETag; re-read to learn it",
      );
    return { etag: response.ETag };
  }

  async delete(key: string, options?: CallOptions & { readonly ifMatch?: string }): Promise<void> {
    validateKey(key);
    this.checkUsable(key, options);
    const ifMatch = options?.ifMatch;
    const { sdk, client } = await this.usable(key, options);
    const command = new sdk.DeleteObjectCommand({
      Bucket: this.bucket,
      Key: this.objectKey(key),
      ...(ifMatch === undefined ? {} : { IfMatch: ifMatch }),
    });
    const sent = trackSent(command, key, options?.signal);
    try {
      await client.send(command, { abortSignal: options?.signal });
    } catch (error) {
      const classified = classifyS3Error(error, {
        operation: "delete",
        key,
        sent: sent.value,
        ifMatch: ifMatch !== undefined,
      });
      if (classified.kind === "not_found") return; // unconditional delete of a missing key
      throw classified;
    }
  }

  async list(prefix: string, options?: CallOptions): Promise<ListedObject[]> {
    validatePrefix(prefix);
    this.checkUsable(prefix, options);
    const root = this.prefix === "" ? "" : `${this.prefix}/`;
    const listed: ListedObject[] = [];
    const { sdk, client } = await this.usable(prefix, options);
    let continuationToken: string | undefined;
    do {
      const command = new sdk.ListObjectsV2Command({
        Bucket: this.bucket,
        Prefix: root + prefix,
        ...(continuationToken === undefined ? {} : { ContinuationToken: continuationToken }),
      });
      const sent = trackSent(command, prefix, options?.signal);
      let page: ListObjectsV2CommandOutput;
      try {
        page = await client.send(command, { abortSignal: options?.signal });
      } catch (error) {
        throw classifyS3Error(error, { operation: "list", key: prefix, sent: sent.value });
      }
      for (const entry of page.Contents ?? []) {
        if (entry.Key === undefined || !entry.Key.startsWith(root)) continue;
        listed.push({
          key: entry.Key.slice(root.length),
          ...(entry.ETag === undefined ? {} : { etag: entry.ETag }),
          ...(entry.Size === undefined ? {} : { size: entry.Size }),
        });
      }
      continuationToken = page.IsTruncated ? page.NextContinuationToken : undefined;
      if (page.IsTruncated && continuationToken === undefined)
        throw new UnavailableError(prefix, "the server truncated a listing without a continuation token");
    } while (continuationToken !== undefined);
    // S3 lists in UTF-8 byte order, which for casq's ASCII keys is code-unit order; sort defensively anyway.
    return listed.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.ownsClient) this.client?.destroy();
  }

  /** The SDK and client once loaded, checked again after the wait (nothing is sent by a closed store, or past the deadline). */
  private async usable(
    key: string,
    options: CallOptions | undefined,
  ): Promise<{ readonly sdk: S3Sdk; readonly client: S3Client }> {
    let loaded: { readonly sdk: S3Sdk; readonly client: S3Client };
    try {
      loaded = await this.ready;
    } catch (error) {
      this.checkUsable(key, options);
      // Not an answer of S3 (classifyS3Error's domain): the SDK could not be loaded or the client made.
      throw new StoreMisconfiguredError(key, `cannot make the S3 client: ${String(error)}`, { cause: error });
    }
    this.checkUsable(key, options);
    return loaded;
  }

  /** Rejects calls after `close()` and calls whose deadline already passed: nothing was sent. */
  private checkUsable(key: string, options: CallOptions | undefined): void {
    if (this.closed) throw new UnavailableError(key, `the store ${this.description} is closed`);
    if (options?.signal?.aborted) throw new UnavailableError(key, "the call was aborted before it was sent");
  }
}

type SentMiddleware = (next: (args: unknown) => Promise<unknown>) => (args: unknown) => Promise<unknown>;

/** A flag that turns true when the command's request is handed to the HTTP layer. */
interface SentFlag {
  value: boolean;
}

/**
 * Adds a per-command middleware at the innermost step (`deserialize`, lowest
 * priority: after credentials, endpoint resolution and signing, right before
 * the HTTP handler) that records that the request is about to be written to a
 * socket. A failure before that point cannot have reached S3. The SDK rejects
 * `send` at the moment the signal aborts, so the flag is read as it was then:
 * an abort while credentials were still being fetched is "unavailable", an
 * abort once the request was handed over is "ambiguous". Should the request
 * get here after such an abort, the middleware stops it (belt and braces:
 * the HTTP handler checks the signal too).
 */
function trackSent(
  command: GetObjectCommand | PutObjectCommand | DeleteObjectCommand | ListObjectsV2Command,
  key: string,
  signal: AbortSignal | undefined,
): SentFlag {
  const flag: SentFlag = { value: false };
  // The four commands share one middleware stack shape; the middleware only flips a flag and passes through.
  const stack = command.middlewareStack as unknown as {
    add(middleware: SentMiddleware, options: { step: "deserialize"; priority: "low"; name: string }): void;
  };
  stack.add(
    (next) => async (args) => {
      if (signal?.aborted)
        throw new UnavailableError(key, "the call was aborted before the request was sent");
      flag.value = true;
      return next(args);
    },
    { step: "deserialize", priority: "low", name: "casqTrackSent" },
  );
  return flag;
}
