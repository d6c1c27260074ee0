/**
 * `casq inspect QUEUE [--shard N]`: prints one shard's document exactly as it
 * is stored (AdminService.GetDocument reads the store directly, so this works
 * even for a document the broker refuses to load). The etag and size go to
 * stderr; stdout holds only the document.
 */
import type { Command } from "commander";
import { Option } from "commander";
import { addConnectionOptions, type ClientOptions, clientFromOptions } from "../client.ts";
import { jsonOption, note, printJson } from "../output.ts";
import { intIn } from "../parse.ts";

interface InspectOptions extends ClientOptions {
  shard: number;
  pretty?: boolean;
  json?: boolean;
}

/** Registers `casq inspect`. */
export function registerInspect(program: Command): void {
  const command = program
    .command("inspect")
    .description("print a shard's raw JSON document as stored (for debugging and repairs)")
    .argument("<queue>", "queue name")
    .addOption(new Option("--shard <n>", "shard index (0-based)").default(0).argParser(intIn(0, 255)))
    .option("--pretty", "indent the JSON (when it parses)")
    .addOption(jsonOption().conflicts("pretty"));
  addConnectionOptions(command);
  command.addHelpText(
    "after",
    `
Without --json, stdout is the document byte for byte (etag and size are noted on stderr).
With --json: {"queue", "shard", "etag", "totalBytes", "document"} where document is the parsed
JSON, or null with "raw" holding the text when it does not parse.
The document format is described in docs/document-format.md.

Examples:
  $ casq inspect jobs
  $ casq inspect jobs --shard 1 --pretty | less
  $ casq inspect jobs --json | jq '.document.leader'`,
  );
  command.action(async (queue: string, options: InspectOptions) => {
    const client = clientFromOptions(options);
    try {
      const { bytes, etag, totalBytes } = await client.call(async (c, o) => {
        const chunks: Uint8Array[] = [];
        let tag = "";
        let total = 0n;
        let first = true;
        for await (const part of c.admin.getDocument({ queue, shard: options.shard }, o)) {
          if (first) {
            tag = part.etag;
            total = part.totalBytes;
            first = false;
          }
          chunks.push(part.chunk);
        }
        return { bytes: Buffer.concat(chunks), etag: tag, totalBytes: total };
      });
      const text = bytes.toString("utf8");
      let parsed: unknown;
      let parses = true;
      try {
        parsed = JSON.parse(text);
      } catch {
        parses = false;
      }
      if (options.json) {
        printJson({
          queue,
          shard: options.shard,
          etag,
          totalBytes: Number(totalBytes),
          document: parses ? parsed : null,
          ...(parses ? {} : { raw: text }),
        });
        return;
      }
      note(
        `# ${queue} shard ${options.shard}: ${bytes.length} bytes, etag ${etag}${parses ? "" : " (NOT valid JSON)"}`,
      );
      if (options.pretty && parses) process.stdout.write(`${JSON.stringify(parsed, null, 2)}\n`);
      else process.stdout.write(bytes);
    } finally {
      client.close();
    }
  });
}
