import { create, toBinary } from "@bufbuild/protobuf";
import { LEADER_ADDRESS_TRAILER } from "@casq/sdk";
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { LeaderRedirectSchema } from "./api.ts";
import { ExitCode } from "./cli-error.ts";
import { describeRpcError, leaderAddressOf } from "./client.ts";

describe("leaderAddressOf", () => {
  it("reads the casq-leader-address trailer of an UNAVAILABLE error", () => {
    const error = new ConnectError("led elsewhere", Code.Unavailable, {
      [LEADER_ADDRESS_TRAILER]: "10.0.0.2:50051",
    });
    expect(leaderAddressOf(error)).toBe("10.0.0.2:50051");
  });

  it("falls back to the LeaderRedirect detail", () => {
    const redirect = create(LeaderRedirectSchema, { leaderAddress: "10.0.0.3:50051", queue: "q" });
    const error = new ConnectError("led elsewhere", Code.Unavailable);
    error.details.push({ type: "casq.v1.LeaderRedirect", value: toBinary(LeaderRedirectSchema, redirect) });
    expect(leaderAddressOf(error)).toBe("10.0.0.3:50051");
  });

  it("is undefined for other errors", () => {
    expect(leaderAddressOf(new ConnectError("store down", Code.Unavailable))).toBeUndefined();
    expect(
      leaderAddressOf(new ConnectError("x", Code.NotFound, { [LEADER_ADDRESS_TRAILER]: "a:1" })),
    ).toBeUndefined();
    expect(leaderAddressOf(new Error("x"))).toBeUndefined();
  });
});

describe("describeRpcError", () => {
  const refused = Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:50051"), { code: "ECONNREFUSED" });

  it("explains a refused connection (exit 4)", () => {
    const error = new ConnectError("connect ECONNREFUSED", Code.Unavailable, undefined, undefined, refused);
    const described = describeRpcError(error, "127.0.0.1:50051", false);
    expect(described.exitCode).toBe(ExitCode.connectionFailed);
    expect(described.message).toContain("connection refused: is casq serve running at 127.0.0.1:50051?");
  });

  it("maps status codes to exit codes", () => {
    const exit = (code: Code) => describeRpcError(new ConnectError("m", code), "a:1", false).exitCode;
    expect(exit(Code.NotFound)).toBe(ExitCode.notFound);
    expect(exit(Code.InvalidArgument)).toBe(ExitCode.usage);
    expect(exit(Code.FailedPrecondition)).toBe(ExitCode.serverError);
    expect(exit(Code.Unavailable)).toBe(ExitCode.serverError);
    expect(describeRpcError(new ConnectError("no", Code.Unauthenticated), "a:1", false).message).toContain(
      "--token",
    );
  });
});
