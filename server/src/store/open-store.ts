/**
 * Store URLs: the one flag that says where casq's state lives.
 *
 * | URL                                   | backend                                   |
 * |---------------------------------------|-------------------------------------------|
 * | `file:./casq-data`, `file:relative`   | {@link FileStore} in that directory (relative to the working directory) — the embedded default |
 * | `file:/abs/path`, `file:///abs/path`  | {@link FileStore} at an absolute path; `file:~/x` is under the home directory |
 * | `s3://BUCKET/PREFIX?endpoint=…&region=…&path_style=true&timeout_ms=…` | {@link S3Store} |
 * | `memory:`                             | {@link MemoryStore} (tests; state dies with the process) |
 *
 * `s3://` parameters, all optional:
 * - `endpoint`: an `http(s)://` URL of an S3-compatible server (MinIO, …); omit for AWS.
 * - `region`: default `AWS_REGION`, then `AWS_DEFAULT_REGION`, then `us-east-1`.
 * - `path_style`: `true`/`false`; defaults to `true` when `endpoint` is set
 *   (what S3-compatible servers expect) and `false` for AWS.
 * - `timeout_ms`: bound on one HTTP exchange (default 30000).
 *
 * Credentials never go in the URL: they come from the standard AWS chain
 * (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, `AWS_PROFILE`, SSO, web
 * identity, instance role). Unknown parameters are refused, so a typo is an
 * error at startup rather than a silently different store.
 */
import { homedir } from "node:os";
import { isAbsolute, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { FileStore } from "./file-store.ts";
import { validateKey } from "./keys.ts";
import { MemoryStore } from "./memory-store.ts";
import type { ObjectStore } from "./object-store.ts";
import { S3Store } from "./s3-store.ts";

/** The accepted forms, quoted in every error message. */
export const STORE_URL_FORMS = "expected file:PATH, s3://BUCKET/PREFIX or memory:";

/** The embedded default store URL. */
export const DEFAULT_STORE_URL = "file:./casq-data";

/** A parsed store URL. */
export type StoreUrl =
  | {
      readonly kind: "file";
      /** Absolute directory. */
      readonly root: string;
    }
  | {
      readonly kind: "s3";
      readonly bucket: string;
      /** Key prefix inside the bucket, without leading/trailing `/` (may be empty). */
      readonly prefix: string;
      readonly endpoint?: string;
      readonly region: string;
      readonly forcePathStyle: boolean;
      readonly requestTimeoutMs?: number;
    }
  | { readonly kind: "memory" };

/** A store URL that cannot be understood; the message says what was expected. */
export class StoreUrlError extends Error {
  /** The URL as given. */
  readonly url: string;

  constructor(url: string, problem: string) {
    super(`bad store URL ${JSON.stringify(url)}: ${problem}`);
    this.name = "StoreUrlError";
    this.url = url;
  }
}

/** Where relative paths and defaults come from; tests pass their own. */
export interface ParseStoreUrlOptions {
  /** Base of relative `file:` paths (default `process.cwd()`). */
  readonly cwd?: string;
  /** Environment for the region default (default `process.env`). */
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** Home directory for `file:~/…` (default `os.homedir()`). */
  readonly homeDir?: string;
}

const S3_PARAMS = ["endpoint", "region", "path_style", "timeout_ms"] as const;
const BUCKET_NAME = /^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/;
const REGION_NAME = /^[a-z0-9-]+$/;

/** Parses a store URL into a typed description. Throws {@link StoreUrlError}. */
export function parseStoreUrl(url: string, options: ParseStoreUrlOptions = {}): StoreUrl {
  const trimmed = url.trim();
  const scheme = /^([A-Za-z][A-Za-z0-9+.-]*):/.exec(trimmed)?.[1]?.toLowerCase();
  if (scheme === undefined) {
    const hint = trimmed === "" ? "" : ` (for a directory, write file:${trimmed})`;
    throw new StoreUrlError(url, `no scheme; ${STORE_URL_FORMS}${hint}`);
  }
  switch (scheme) {
    case "file":
      return parseFileUrl(url, trimmed, options);
    case "s3":
      return parseS3Url(url, trimmed, options);
    case "memory":
      if (trimmed.toLowerCase() !== "memory:" && trimmed.toLowerCase() !== "memory://")
        throw new StoreUrlError(url, "memory: takes no path or parameters");
      return { kind: "memory" };
    default:
      throw new StoreUrlError(url, `unknown scheme "${scheme}:"; ${STORE_URL_FORMS}`);
  }
}

function parseFileUrl(url: string, trimmed: string, options: ParseStoreUrlOptions): StoreUrl {
  const rest = trimmed.slice("file:".length);
  let path: string;
  if (rest.startsWith("//")) {
    // A standard file URL: file:///abs/path (no remote hosts).
    let parsed: URL;
    try {
      parsed = new URL(trimmed);
    } catch {
      throw new StoreUrlError(url, `not a valid file URL; ${STORE_URL_FORMS}`);
    }
    if (parsed.host !== "" && parsed.host !== "localhost")
      throw new StoreUrlError(
        url,
        `file: URLs cannot name a remote host ("${parsed.host}"); use file:/abs/path`,
      );
    if (parsed.search !== "" || parsed.hash !== "")
      throw new StoreUrlError(url, "file: URLs take no ?parameters or #fragment");
    path = fileURLToPath(parsed);
  } else {
    if (rest.includes("?")) throw new StoreUrlError(url, "file: URLs take no ?parameters");
    path = rest;
  }
  if (path === "") throw new StoreUrlError(url, `file: needs a directory, e.g. ${DEFAULT_STORE_URL}`);
  if (path.includes("\0")) throw new StoreUrlError(url, "the path contains a NUL byte");
  if (path === "~" || path.startsWith("~/"))
    path = resolve(options.homeDir ?? homedir(), `.${path.slice(1)}`);
  const root = isAbsolute(path) ? resolve(path) : resolve(options.cwd ?? process.cwd(), path);
  return { kind: "file", root };
}

function parseS3Url(url: string, trimmed: string, options: ParseStoreUrlOptions): StoreUrl {
  if (!/^s3:\/\//i.test(trimmed)) throw new StoreUrlError(url, `s3 URLs look like s3://BUCKET/PREFIX`);
  const afterScheme = trimmed.slice("s3://".length);
  const queryAt = afterScheme.indexOf("?");
  const location = queryAt === -1 ? afterScheme : afterScheme.slice(0, queryAt);
  const query = new URLSearchParams(queryAt === -1 ? "" : afterScheme.slice(queryAt + 1));
  if (location.includes("#")) throw new StoreUrlError(url, "s3 URLs take no #fragment");

  const slash = location.indexOf("/");
  const bucket = slash === -1 ? location : location.slice(0, slash);
  const prefix = (slash === -1 ? "" : location.slice(slash + 1)).replace(/^\/+|\/+$/g, "");
  if (bucket.includes("@"))
    throw new StoreUrlError(url, "credentials do not go in the URL; use AWS_ACCESS_KEY_ID / AWS_PROFILE");
  if (bucket === "") throw new StoreUrlError(url, "missing bucket; s3 URLs look like s3://BUCKET/PREFIX");
  if (!BUCKET_NAME.test(bucket))
    throw new StoreUrlError(
      url,
      `"${bucket}" is not a valid bucket name (3-63 of a-z 0-9 . -, starting and ending with a letter or digit)`,
    );
  if (prefix !== "") {
    try {
      validateKey(prefix);
    } catch (error) {
      throw new StoreUrlError(url, `bad prefix "${prefix}": ${(error as Error).message}`);
    }
  }

  for (const name of new Set(query.keys())) {
    if (!(S3_PARAMS as readonly string[]).includes(name))
      throw new StoreUrlError(url, `unknown parameter "${name}"; s3 URLs accept ${S3_PARAMS.join(", ")}`);
    if (query.getAll(name).length > 1) throw new StoreUrlError(url, `parameter "${name}" is given twice`);
  }

  const endpoint = query.get("endpoint") ?? undefined;
  if (endpoint !== undefined) {
    let parsed: URL;
    try {
      parsed = new URL(endpoint);
    } catch {
      throw new StoreUrlError(
        url,
        `endpoint "${endpoint}" is not a URL; e.g. endpoint=http://127.0.0.1:9000`,
      );
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:")
      throw new StoreUrlError(url, `endpoint must be http:// or https://, not ${parsed.protocol}`);
  }

  const env = options.env ?? process.env;
  const region = query.get("region") ?? env.AWS_REGION ?? env.AWS_DEFAULT_REGION ?? "us-east-1";
  if (!REGION_NAME.test(region)) throw new StoreUrlError(url, `"${region}" is not a region name`);

  const pathStyleText = query.get("path_style");
  let forcePathStyle = endpoint !== undefined;
  if (pathStyleText !== null) {
    if (pathStyleText === "true" || pathStyleText === "1") forcePathStyle = true;
    else if (pathStyleText === "false" || pathStyleText === "0") forcePathStyle = false;
    else throw new StoreUrlError(url, `path_style must be true or false, not "${pathStyleText}"`);
  }

  const timeoutText = query.get("timeout_ms");
  let requestTimeoutMs: number | undefined;
  if (timeoutText !== null) {
    requestTimeoutMs = Number(timeoutText);
    if (!/^\d+$/.test(timeoutText) || requestTimeoutMs <= 0)
      throw new StoreUrlError(
        url,
        `timeout_ms must be a positive whole number of milliseconds, not "${timeoutText}"`,
      );
  }

  return {
    kind: "s3",
    bucket,
    prefix,
    ...(endpoint === undefined ? {} : { endpoint }),
    region,
    forcePathStyle,
    ...(requestTimeoutMs === undefined ? {} : { requestTimeoutMs }),
  };
}

/** Builds the store a parsed URL describes. */
export function storeFromUrl(parsed: StoreUrl): ObjectStore {
  switch (parsed.kind) {
    case "file":
      return new FileStore({ root: parsed.root });
    case "s3":
      return new S3Store({
        bucket: parsed.bucket,
        prefix: parsed.prefix,
        region: parsed.region,
        forcePathStyle: parsed.forcePathStyle,
        ...(parsed.endpoint === undefined ? {} : { endpoint: parsed.endpoint }),
        ...(parsed.requestTimeoutMs === undefined ? {} : { requestTimeoutMs: parsed.requestTimeoutMs }),
      });
    case "memory":
      return new MemoryStore();
  }
}

/**
 * Opens the store a URL names: `file:PATH` (the embedded default), `s3://BUCKET/PREFIX?…`
 * or `memory:`. Throws {@link StoreUrlError} for anything else.
 */
export function openStore(url: string, options?: ParseStoreUrlOptions): ObjectStore {
  return storeFromUrl(parseStoreUrl(url, options));
}
