/**
 * A frozen copy of the entry point of casq v1's shard document parser
 * (`parseShardDocument` in `server/src/model/document-codec.ts` as of
 * commit 02eb365, the last casq that wrote only `casq.shard.v1`): the
 * UTF-8/JSON check and the format gate, which every v1 broker runs on every
 * document it loads — leader loads and admin reads alike — before looking at
 * any field. A document this gate rejects is refused with `data_loss` by a
 * v1 broker, and v1's shard leader never writes over a refused document.
 *
 * Do not edit: it stands for brokers already deployed. It lets the
 * mixed-version test show what a v1 broker left running makes of what this
 * casq writes.
 */
import { CasqError } from "../../server/src/errors.ts";

/** The only format casq v1 reads and writes. */
export const V1_SHARD_FORMAT = "casq.shard.v1";

type Obj = Record<string, unknown>;
const json = JSON.stringify;

/** casq v1's gate: throws `data_loss` unless `bytes` are UTF-8 JSON of format `casq.shard.v1`. */
export function v1DocumentGate(bytes: Uint8Array): void {
  let root: unknown;
  try {
    root = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (error) {
    throw new CasqError(
      "data_loss",
      `shard document is not valid UTF-8 JSON (${error instanceof Error ? error.message : String(error)}); it may be truncated or corrupt — refusing to load or overwrite it, restore it from a backup or move it aside`,
      {},
      { cause: error },
    );
  }
  const top = typeof root === "object" && root !== null && !Array.isArray(root) ? (root as Obj) : undefined;
  const format = top?.format;
  if (format !== V1_SHARD_FORMAT) {
    const newer = typeof format === "string" && format.startsWith("casq.shard.");
    throw new CasqError(
      "data_loss",
      newer
        ? `shard document has format ${json(format)}, this casq only understands ${V1_SHARD_FORMAT}: written by a newer casq? refusing to touch it — upgrade this broker`
        : `object is not a casq shard document (format ${json(format)}, expected ${V1_SHARD_FORMAT}); refusing to load or overwrite it`,
    );
  }
}
