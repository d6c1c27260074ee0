import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { BytePieces } from "./byte-pieces.ts";
import { SplicedList } from "./spliced-list.ts";

/** A list entry: identity is the object itself plus `version` (as a message and its `targets`). */
interface Entry {
  readonly offset: number;
  readonly text: string;
  version: object;
}

const decoder = new TextDecoder();

/** A list whose JSON is framed by some text before and after (as in a head), encoded once per call. */
function encoder() {
  const list = new SplicedList<Entry>({
    keyOf: (e) => e,
    secondKeyOf: (e) => e.version,
    offsetOf: (e) => e.offset,
    writeJson: (out, e) =>
      out.text(JSON.stringify({ o: e.offset, t: e.text, v: (e.version as { n: number }).n })),
  });
  return (entries: readonly Entry[], remember = true): string => {
    const out = new BytePieces();
    out.text(`{"before":"é",`.repeat(entries.length % 3)); // the list starts at a varying place
    out.text("[");
    list.write(out, entries);
    out.text("]}");
    const bytes = out.toBytes();
    expect(bytes.byteLength).toBe(out.length);
    if (remember) list.remember(bytes);
    return decoder.decode(bytes);
  };
}

/** What a fresh encode writes. */
function fresh(entries: readonly Entry[]): string {
  const json = entries.map((e) =>
    JSON.stringify({ o: e.offset, t: e.text, v: (e.version as { n: number }).n }),
  );
  return `${`{"before":"é",`.repeat(entries.length % 3)}[${json.join(",")}]}`;
}

let versions = 0;
const entry = (offset: number, text: string): Entry => ({ offset, text, version: { n: versions++ } });

const step = fc.oneof(
  fc.record({
    t: fc.constant("append" as const),
    texts: fc.array(fc.string({ unit: "grapheme" }), { maxLength: 4 }),
  }),
  fc.record({ t: fc.constant("dropFront" as const), n: fc.nat({ max: 5 }) }),
  fc.record({ t: fc.constant("dropAt" as const), at: fc.nat() }),
  fc.record({ t: fc.constant("replace" as const), at: fc.nat() }),
  fc.record({ t: fc.constant("insert" as const), at: fc.nat(), text: fc.string() }),
  fc.record({ t: fc.constant("unremembered" as const) }),
  fc.record({ t: fc.constant("same" as const) }),
);

describe("spliced list", () => {
  it("writes byte for byte what a fresh encode writes, whatever changed since the last encode", () => {
    fc.assert(
      fc.property(fc.array(step, { maxLength: 40 }), (steps) => {
        const encode = encoder();
        let list: Entry[] = [];
        let next = 0;
        for (const s of steps) {
          switch (s.t) {
            case "append":
              for (const text of s.texts) {
                next += 2;
                list.push(entry(next, text));
              }
              break;
            case "dropFront":
              list = list.slice(s.n);
              break;
            case "dropAt":
              if (list.length > 0) list.splice(s.at % list.length, 1);
              break;
            case "replace": {
              const e = list[s.at % Math.max(1, list.length)];
              if (e !== undefined) e.version = { n: versions++ }; // a new identity for its changing part
              break;
            }
            case "insert": {
              // A new entry between two (offsets stay ascending), as a redriven message joins the tail.
              const i = s.at % (list.length + 1);
              const before = i > 0 ? (list[i - 1] as Entry).offset : -2;
              const after = i < list.length ? (list[i] as Entry).offset : before + 2;
              if (after - before >= 2) list.splice(i, 0, entry((before + after) / 2, s.text));
              break;
            }
            case "unremembered":
              // An encode whose document was never made (it failed later): the next copies nothing from it.
              encode([...list, entry(next + 1, "never written")], false);
              break;
            case "same":
              break;
          }
          expect(encode(list)).toBe(fresh(list));
        }
      }),
      { numRuns: 300 },
    );
  });

  it("copies the unchanged entries instead of encoding them again", () => {
    let encoded = 0;
    const list = new SplicedList<Entry>({
      keyOf: (e) => e,
      secondKeyOf: (e) => e.version,
      offsetOf: (e) => e.offset,
      writeJson: (out, e) => {
        encoded += 1;
        out.text(JSON.stringify(e.text));
      },
    });
    const write = (entries: Entry[]) => {
      const out = new BytePieces();
      list.write(out, entries);
      const bytes = out.toBytes();
      list.remember(bytes);
      return decoder.decode(bytes);
    };
    const entries = [entry(1, "a"), entry(2, "b"), entry(3, "c")];
    expect(write(entries)).toBe('"a","b","c"');
    expect(encoded).toBe(3);
    entries.push(entry(4, "d"));
    expect(write(entries.slice(1))).toBe('"b","c","d"');
    expect(encoded).toBe(4);
    (entries[2] as Entry).version = {};
    expect(write(entries)).toBe('"a","b","c","d"');
    expect(encoded).toBe(6); // "a" was not in the last encode, "c" changed
  });
});

describe("byte pieces", () => {
  it("writes strings as UTF-8 and copies byte ranges, into one buffer of the exact size", () => {
    const out = new BytePieces();
    expect(out.text("a-é-日本-🙂")).toBe(Buffer.byteLength("a-é-日本-🙂"));
    out.bytes(new TextEncoder().encode("|copied|").subarray(1, 7));
    out.text("");
    out.text("z");
    const bytes = out.toBytes();
    expect(bytes).toBeInstanceOf(Uint8Array);
    expect(bytes.byteLength).toBe(out.length);
    expect(decoder.decode(bytes)).toBe("a-é-日本-🙂copiedz");
  });
});
