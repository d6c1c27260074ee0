import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { buildExampleShard } from "../../testing/document-example.ts";
import { ShardState } from "./shard-state.ts";

const DOC = new URL("../../../docs/document-format.md", import.meta.url);

describe("docs/document-format.md", () => {
  it("shows the real encode() output of the example scenario", () => {
    const markdown = readFileSync(DOC, "utf8");
    const match = /<!-- example:begin -->\s*```json\n([\s\S]*?)```\s*<!-- example:end -->/.exec(markdown);
    expect(match, "example block not found").not.toBeNull();
    const documented = JSON.parse(match?.[1] ?? "null");
    const encoded = buildExampleShard().encode();
    expect(documented).toEqual(JSON.parse(new TextDecoder().decode(encoded)));
    // and the documented text, compacted, is a valid canonical document
    const compact = new TextEncoder().encode(JSON.stringify(documented));
    expect(Buffer.from(ShardState.decode(compact).encode()).equals(Buffer.from(encoded))).toBe(true);
  });
});
