/**
 * A frozen copy of the field checks of casq's v2 shard head parser
 * (`parseShardDocument` in `server/src/model/document-codec.ts` as of
 * commit 97f4758, the last casq that wrote `casq.shard.v2` heads without
 * dead-letter segments): the format gate, then the strict field sets of the
 * head and of each subscription, which that parser checks on every head it
 * loads — leader loads and admin reads alike — before any value. A field it
 * does not know makes the head "corrupt" (`data_loss`), and that broker's
 * shard leader never writes over a refused head.
 *
 * Do not edit: it stands for brokers already deployed. It lets the
 * mixed-version test show what such a broker, left running during an
 * upgrade, makes of the heads this casq writes.
 */
import { CasqError } from "../../server/src/errors.ts";

type Obj = Record<string, unknown>;
const json = JSON.stringify;

const HEAD_REQUIRED = [
  "format",
  "queue",
  "shard",
  "created_at",
  "write_id",
  "broker",
  "next_offset",
  "config",
  "counters",
  "subscriptions",
  "dedup",
  "segments",
  "messages",
];
const HEAD_OPTIONAL = ["recent_write_ids", "dedup_segments"];
const SUBSCRIPTION_REQUIRED = [
  "name",
  "created_at",
  "acked_below",
  "acked",
  "deliveries",
  "dead_letters",
  "counters",
];

function fields(o: Obj, path: string, required: readonly string[], optional: readonly string[] = []): void {
  for (const key of required) if (!Object.hasOwn(o, key)) throw new Error(`${path}: missing field "${key}"`);
  for (const key of Object.keys(o))
    if (!required.includes(key) && !optional.includes(key))
      throw new Error(`${path}: unknown field "${key}"`);
}

/** That parser's gate: throws `data_loss` unless `bytes` are a v2 head with only the fields it knows. */
export function v2FieldGate(bytes: Uint8Array): void {
  let root: unknown;
  try {
    root = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (error) {
    throw new CasqError("data_loss", `shard document is not valid UTF-8 JSON (${String(error)})`);
  }
  const top = typeof root === "object" && root !== null && !Array.isArray(root) ? (root as Obj) : undefined;
  const format = top?.format;
  if (format !== "casq.shard.v2" && format !== "casq.shard.v1")
    throw new CasqError(
      "data_loss",
      `shard document has format ${json(format)}, this casq only understands casq.shard.v1 and casq.shard.v2: written by a newer casq? refusing to touch it — upgrade this broker`,
    );
  if (format === "casq.shard.v1") return; // its v1 field checks are not copied here
  const queueHint = typeof top?.queue === "string" ? top.queue : "?";
  try {
    const o = top as Obj;
    fields(o, "document", HEAD_REQUIRED, HEAD_OPTIONAL);
    const subs = Array.isArray(o.subscriptions) ? o.subscriptions : [];
    subs.forEach((sub, i) => {
      fields(sub as Obj, `document.subscriptions[${i}]`, SUBSCRIPTION_REQUIRED);
    });
  } catch (error) {
    throw new CasqError(
      "data_loss",
      `shard document of queue ${queueHint} is corrupt at ${error instanceof Error ? error.message : String(error)}; refusing to load or overwrite it — restore it from a backup or move it aside`,
    );
  }
}
