import { describe, expect, it } from "vitest";
import { formatHostPort, intIn, numberIn, parseDurationMs, parseHostPort } from "./parse.ts";

describe("command-line value parsers", () => {
  it("parses durations with units", () => {
    expect(parseDurationMs("500ms")).toBe(500);
    expect(parseDurationMs("30s")).toBe(30_000);
    expect(parseDurationMs("1.5m")).toBe(90_000);
    expect(parseDurationMs("2h")).toBe(7_200_000);
    expect(parseDurationMs("7d")).toBe(604_800_000);
    expect(() => parseDurationMs("30")).toThrow(/use a number with a unit/);
    expect(() => parseDurationMs("-1s")).toThrow();
  });

  it("checks integer and number ranges", () => {
    expect(intIn(1, 10)("10")).toBe(10);
    expect(() => intIn(1, 10)("11")).toThrow(/expected 1\.\.10/);
    expect(() => intIn(1, 10)("1.5")).toThrow(/whole number/);
    expect(numberIn(0, 1)("0.25")).toBe(0.25);
    expect(() => numberIn(0, 1)("abc")).toThrow(/not a number/);
  });

  it("parses and formats HOST:PORT, IPv6 in brackets", () => {
    expect(parseHostPort("127.0.0.1:50051")).toEqual({ host: "127.0.0.1", port: 50051 });
    expect(parseHostPort("[::1]:80")).toEqual({ host: "::1", port: 80 });
    expect(parseHostPort("casq-1.internal:0")).toEqual({ host: "casq-1.internal", port: 0 });
    expect(formatHostPort({ host: "::1", port: 80 })).toBe("[::1]:80");
    for (const bad of ["localhost", ":80", "host:99999", "http://x:1", "::1:80"]) {
      expect(() => parseHostPort(bad), bad).toThrow(/HOST:PORT/);
    }
  });
});
