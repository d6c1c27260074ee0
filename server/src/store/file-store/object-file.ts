/**
 * One object's file: a one-line version header `casq-object/1 <32 hex>\n`
 * (the etag) followed by the object's bytes; or a slotted file
 * (`casq-object/2`, slotted-file.ts) for an object that is overwritten in
 * place; a file with neither header is read whole, with an etag derived from
 * its inode, mtime and size (see the module comment of file-store.ts).
 */
import { closeSync, fstatSync, openSync, readSync } from "node:fs";
import type { PutCondition } from "../object-store.ts";
import { errnoCode } from "./fs-errors.ts";
import { isSlotted, readSlottedFd, SLOTTED_READ_ATTEMPTS, type SlotVersion } from "./slotted-file.ts";

/** The header's first bytes, before the version id. */
export const HEADER_MAGIC = "casq-object/1 ";
/** Hex digits of the version id in the header (128 random bits). */
export const ETAG_ID_HEX = 32;
/** Bytes of the version header: magic, 32 hex digits, newline. */
export const HEADER_BYTES = HEADER_MAGIC.length + ETAG_ID_HEX + 1;
const HEADER_RE = /^casq-object\/1 ([0-9a-f]{32})\n$/;

/** The version header line of a single-version file holding version `id` (32 hex digits). */
export function versionHeader(id: string): string {
  return `${HEADER_MAGIC}${id}\n`;
}

/** The etag named by a file's version header, or `undefined` if `bytes` does not start with one. */
export function parseHeader(bytes: Uint8Array): string | undefined {
  if (bytes.byteLength < HEADER_BYTES) return undefined;
  const match = HEADER_RE.exec(Buffer.from(bytes.buffer, bytes.byteOffset, HEADER_BYTES).toString("latin1"));
  return match ? `"${match[1]}"` : undefined;
}

/** What a key's path holds right now, read from one open file descriptor. */
export type Current =
  | { readonly kind: "absent" }
  | { readonly kind: "directory" }
  | {
      readonly kind: "object";
      readonly etag: string;
      readonly size: number;
      /** Set for a slotted file: its capacity and which slot holds this version. */
      readonly slotted?: { readonly capacity: number; readonly current: SlotVersion };
    }
  /** A slotted file none of whose slots is valid: never written over (see slotted-file.ts). */
  | { readonly kind: "damaged" };

/** The etag a damaged file reports (in listings): it never matches a condition. */
export const DAMAGED_ETAG = '"damaged"';

/** Why a damaged object file is refused, for error messages. */
export const DAMAGED_MESSAGE =
  "its file is damaged (neither of its two versions passes its checksum); it is never written over: restore the file from a backup or delete the key";

/**
 * Why what a key's path holds fails `condition` (the message of the
 * precondition failure), or undefined when it holds. A directory is the
 * caller's to refuse first.
 */
export function unmetCondition(
  current: Exclude<Current, { kind: "directory" }>,
  condition: PutCondition,
): string | undefined {
  if (current.kind === "damaged") return DAMAGED_MESSAGE;
  if ("ifAbsent" in condition) return current.kind === "object" ? "the key already exists" : undefined;
  if (current.kind === "absent") return "the key does not exist";
  return current.etag === condition.ifMatch ? undefined : `etag is ${current.etag}, not ${condition.ifMatch}`;
}

/**
 * Reads what `file` holds now (synchronously: an open, an fstat and a read of
 * at most the header, microseconds on a local disk; a slotted file's current
 * body is read too, to check its CRC). A slotted file found mid-write (by
 * another process: callers under the key's lock never meet one) is read
 * again a few times before it counts as damaged.
 */
export function readCurrent(file: string): Current {
  let fd: number;
  try {
    fd = openSync(file, "r");
  } catch (error) {
    const code = errnoCode(error);
    if (code === "ENOENT" || code === "ENOTDIR") return { kind: "absent" };
    throw error;
  }
  try {
    const info = fstatSync(fd, { bigint: true });
    if (info.isDirectory()) return { kind: "directory" };
    const size = Number(info.size);
    const head = Buffer.alloc(Math.min(size, HEADER_BYTES));
    const bytesRead = readSync(fd, head, 0, head.byteLength, 0);
    if (isSlotted(head.subarray(0, bytesRead))) {
      for (let attempt = 1; ; attempt++) {
        const state = readSlottedFd(fd);
        if (state.kind === "slotted")
          return { kind: "object", etag: state.current.etag, size: state.current.length, slotted: state };
        if (attempt >= SLOTTED_READ_ATTEMPTS) return { kind: "damaged" };
      }
    }
    const etag = parseHeader(head.subarray(0, bytesRead));
    if (etag !== undefined) return { kind: "object", etag, size: size - HEADER_BYTES };
    return { kind: "object", etag: rawEtag(info), size };
  } finally {
    closeSync(fd);
  }
}

/** The etag of a file without a version header (e.g. copied in by hand): its inode, mtime and size. */
export function rawEtag(info: { ino: bigint; mtimeNs: bigint; size: bigint }): string {
  return `"raw-${info.ino}-${info.mtimeNs}-${info.size}"`;
}
