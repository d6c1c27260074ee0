import { describe, expect, it } from "vitest";
import { formatAddress, parseListenAddress } from "./listen-address.ts";

describe("listen addresses", () => {
  it("parses HOST:PORT, [v6]:PORT and :PORT", () => {
    expect(parseListenAddress("127.0.0.1:50051")).toEqual({ host: "127.0.0.1", port: 50051 });
    expect(parseListenAddress("[::1]:0")).toEqual({ host: "::1", port: 0 });
    expect(parseListenAddress(":7000")).toEqual({ host: "0.0.0.0", port: 7000 });
    expect(parseListenAddress("localhost:1")).toEqual({ host: "localhost", port: 1 });
    for (const bad of ["50051", "host:", "host:99999", "a:b:1", ""])
      expect(() => parseListenAddress(bad)).toThrow();
    expect(formatAddress("::1", 5)).toBe("[::1]:5");
  });
});
