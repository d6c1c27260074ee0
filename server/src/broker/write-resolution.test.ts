import { describe, expect, it } from "vitest";
import { resolveWrites, type WriteAttempt } from "./write-resolution.ts";

const attempts = (...list: [string, WriteAttempt<string>][]) => new Map(list);
const ambiguous = (value: string, basedOn: string | undefined): WriteAttempt<string> => ({
  value,
  basedOn,
  ambiguous: true,
});
const lostRace = (value: string, basedOn: string | undefined): WriteAttempt<string> => ({
  value,
  basedOn,
  ambiguous: false,
});

describe("resolveWrites", () => {
  it("an attempt that is the latest write landed", () => {
    expect(resolveWrites(["p", "w1"], true, attempts(["w1", ambiguous("r1", "p")]))).toEqual({
      kind: "landed",
      value: "r1",
    });
  });

  it("an attempt further back in the chain landed too (others wrote on top since)", () => {
    const verdict = resolveWrites(
      ["p", "w1", "rival.1", "rival.2"],
      false,
      attempts(["w1", ambiguous("r1", "p")]),
    );
    expect(verdict).toEqual({ kind: "landed", value: "r1" });
  });

  it("of several attempts, the one in the chain is the truth", () => {
    const tried = attempts(["w1", lostRace("r1", "p")], ["w2", ambiguous("r2", "q")]);
    expect(resolveWrites(["p", "q", "w2"], true, tried)).toEqual({ kind: "landed", value: "r2" });
  });

  it("did not land when its base version is still the latest", () => {
    expect(resolveWrites(["p"], true, attempts(["w1", ambiguous("r1", "p")]))).toEqual({
      kind: "not_landed",
    });
  });

  it("did not land when the chain shows another write followed its base version", () => {
    expect(resolveWrites(["p", "rival.1", "rival.2"], false, attempts(["w1", ambiguous("r1", "p")]))).toEqual(
      {
        kind: "not_landed",
      },
    );
  });

  it("is unknown when its base version left the history", () => {
    expect(resolveWrites(["x", "y", "z"], false, attempts(["w1", ambiguous("r1", "p")]))).toEqual({
      kind: "unknown",
    });
  });

  it("a lost race never landed, whatever the history", () => {
    expect(resolveWrites(["x", "y"], false, attempts(["w1", lostRace("r1", "p")]))).toEqual({
      kind: "not_landed",
    });
  });

  it("a first write (creating the document) is decided only while the chain reaches back to creation", () => {
    const create = attempts(["w1", ambiguous("r1", undefined)]);
    expect(resolveWrites(["rival.1"], true, create)).toEqual({ kind: "not_landed" });
    expect(resolveWrites([], true, create)).toEqual({ kind: "not_landed" });
    expect(resolveWrites(["rival.5", "rival.6"], false, create)).toEqual({ kind: "unknown" });
  });
});
