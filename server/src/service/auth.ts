/**
 * Optional bearer-token authentication and per-RPC permissions.
 *
 * With a token file (`casq serve --auth-tokens FILE`), every casq.v1 call
 * must carry the metadata `authorization: Bearer <token>`, and the token
 * must grant the permission the RPC needs:
 *
 * | permission | RPCs                                                            |
 * |------------|-----------------------------------------------------------------|
 * | `produce`  | QueueService.Enqueue, EnqueueStream, LookupShards               |
 * | `consume`  | QueueService.Claim, Heartbeat, Ack, Nack, Work, LookupShards    |
 * | `admin`    | every AdminService RPC, and everything `produce` and `consume` allow |
 *
 * Health checks and server reflection need no token (load balancers and
 * `grpcurl list` must work without one). A call without a token is
 * UNAUTHENTICATED, with an unknown token UNAUTHENTICATED, with a token that
 * lacks the permission PERMISSION_DENIED.
 *
 * Token file format: one token per line, `#` starts a comment:
 *
 * ```
 * # token                             permissions        name (optional, for logs)
 * 3f9a0c8e5b7d4e21a6c0f2d9b8e7a1c4   produce            billing-api
 * 8d2b6f0a9c3e4d5f7a1b2c3d4e5f6a7b   consume,produce    video-workers
 * c4a1e7b9d2f05e3a6b8c9d0e1f2a3b4c   admin              ops
 * ```
 *
 * Tokens are compared by their SHA-256 digest and never logged: logs name a
 * token by its name, or by the first 8 hex digits of its digest.
 */
import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import type { Logger } from "pino";

/** What a token may do. */
export type Permission = "produce" | "consume" | "admin";

const PERMISSIONS: readonly Permission[] = ["produce", "consume", "admin"];

/** One configured token (without the secret itself). */
export interface TokenEntry {
  /** Name for logs: from the file, or `token-<8 hex digits of its digest>`. */
  readonly name: string;
  readonly permissions: ReadonlySet<Permission>;
}

/** The tokens of a token file, by the SHA-256 hex digest of the token. */
export type TokenTable = ReadonlyMap<string, TokenEntry>;

/** A token file that cannot be used; the message names the line. */
export class TokenFileError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "TokenFileError";
  }
}

function digest(token: string): string {
  return createHash("sha256").update(token, "utf8").digest("hex");
}

/** Parses the text of a token file (format in the module header). Throws {@link TokenFileError}. */
export function parseTokenFile(text: string, source = "token file"): TokenTable {
  const table = new Map<string, TokenEntry>();
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.replace(/#.*$/, "").trim();
    if (line === "") return;
    const where = `${source} line ${i + 1}`;
    const [token, perms, name, ...rest] = line.split(/\s+/);
    if (token === undefined || perms === undefined)
      throw new TokenFileError(`${where}: expected "<token> <permissions> [name]"`);
    if (rest.length > 0)
      throw new TokenFileError(`${where}: too many fields; expected "<token> <permissions> [name]"`);
    if (token.length < 8) throw new TokenFileError(`${where}: the token is shorter than 8 characters`);
    const permissions = new Set<Permission>();
    for (const p of perms.split(",")) {
      if (!(PERMISSIONS as readonly string[]).includes(p))
        throw new TokenFileError(
          `${where}: unknown permission "${p}"; use ${PERMISSIONS.join(", ")} (comma-separated)`,
        );
      permissions.add(p as Permission);
    }
    const key = digest(token);
    if (table.has(key)) throw new TokenFileError(`${where}: the same token appears twice`);
    table.set(key, { name: name ?? `token-${key.slice(0, 8)}`, permissions });
  });
  if (table.size === 0) throw new TokenFileError(`${source} has no tokens: every call would be refused`);
  return table;
}

/** Reads and parses a token file. */
export async function loadTokenFile(path: string): Promise<TokenTable> {
  return parseTokenFile(await readFile(path, "utf8"), path);
}

/**
 * The permission a call needs: undefined for calls any client may make
 * (health, reflection). `LookupShards` is allowed with produce or consume.
 */
export function requiredPermissions(service: string, method: string): readonly Permission[] | undefined {
  if (service === "casq.v1.AdminService") return ["admin"];
  if (service === "casq.v1.QueueService") {
    if (method === "Enqueue" || method === "EnqueueStream") return ["produce", "admin"];
    if (method === "LookupShards") return ["produce", "consume", "admin"];
    return ["consume", "admin"];
  }
  if (service.startsWith("grpc.health.") || service.startsWith("grpc.reflection.")) return undefined;
  return ["admin"];
}

/** The interceptor that enforces the token table on every call (see the module header). */
export function createAuthInterceptor(tokens: TokenTable, logger: Logger): Interceptor {
  return (next) => async (req) => {
    const needed = requiredPermissions(req.service.typeName, req.method.name);
    if (needed === undefined) return next(req);
    const rpc = `${req.service.typeName}/${req.method.name}`;
    const header = req.header.get("authorization");
    const match = header === null ? null : /^Bearer\s+(\S+)\s*$/i.exec(header);
    if (!match?.[1]) {
      logger.debug({ rpc }, "call refused: no bearer token");
      throw new ConnectError(
        `${rpc} needs a bearer token: send the metadata "authorization: Bearer <token>"`,
        Code.Unauthenticated,
      );
    }
    const entry = tokens.get(digest(match[1]));
    if (entry === undefined) {
      logger.info({ rpc }, "call refused: unknown bearer token");
      throw new ConnectError("the bearer token is not valid for this server", Code.Unauthenticated);
    }
    if (!needed.some((p) => entry.permissions.has(p))) {
      logger.info({ rpc, token: entry.name }, "call refused: permission denied");
      throw new ConnectError(
        `token ${entry.name} may not call ${rpc}: it needs the ${needed.filter((p) => p !== "admin").join(" or ") || "admin"} permission`,
        Code.PermissionDenied,
      );
    }
    return next(req);
  };
}
