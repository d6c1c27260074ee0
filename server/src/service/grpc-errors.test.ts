import { anyUnpack } from "@bufbuild/protobuf/wkt";
import { BatchRedirectSchema, LeaderRedirectSchema } from "@casq/api/casq/v1/errors_pb.ts";
import { LEADER_ADDRESS_TRAILER } from "@casq/sdk/errors.ts";
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { CasqError, type CasqErrorCode } from "../errors.ts";
import { StoreMisconfiguredError, UnavailableError } from "../store/store-errors.ts";
import { GRPC_CODE_OF, toConnectError, toRpcStatus } from "./grpc-errors.ts";

describe("grpc-errors", () => {
  it("maps every engine code", () => {
    const expected: Record<CasqErrorCode, Code> = {
      invalid_argument: Code.InvalidArgument,
      not_found: Code.NotFound,
      already_exists: Code.AlreadyExists,
      resource_exhausted: Code.ResourceExhausted,
      failed_precondition: Code.FailedPrecondition,
      redirect: Code.Unavailable,
      batch_redirect: Code.Unavailable,
      unavailable: Code.Unavailable,
      data_loss: Code.DataLoss,
      cancelled: Code.Canceled,
      internal: Code.Internal,
    };
    expect(GRPC_CODE_OF).toEqual(expected);
    for (const [code, grpc] of Object.entries(expected)) {
      const mapped = toConnectError(new CasqError(code as CasqErrorCode, `m ${code}`));
      expect(mapped.code).toBe(grpc);
      expect(mapped.rawMessage).toBe(`m ${code}`);
    }
  });

  it("turns a redirect into UNAVAILABLE with the trailer and a LeaderRedirect detail", () => {
    const error = new CasqError("redirect", "go there", {
      leaderAddress: "10.0.0.7:50051",
      leaderId: "b-1",
      epoch: 4,
      queue: "q",
      shard: 2,
    });
    const mapped = toConnectError(error);
    expect(mapped.code).toBe(Code.Unavailable);
    expect(mapped.metadata.get(LEADER_ADDRESS_TRAILER)).toBe("10.0.0.7:50051");
    const status = toRpcStatus(error);
    expect(status.code).toBe(Code.Unavailable);
    const detail = status.details[0] ? anyUnpack(status.details[0], LeaderRedirectSchema) : undefined;
    expect(detail).toMatchObject({
      leaderAddress: "10.0.0.7:50051",
      leaderId: "b-1",
      epoch: 4n,
      queue: "q",
      shard: 2,
    });
    // An RpcStatus of an already mapped error keeps the detail.
    expect(toRpcStatus(mapped).details).toHaveLength(1);
  });

  it("turns a batch spanning several leaders into UNAVAILABLE with a BatchRedirect detail (no leader trailer)", () => {
    const error = new CasqError("batch_redirect", "split it", {
      queue: "q",
      batchRoutes: [
        { leaderAddress: "a:1", messageIndexes: [0, 2] },
        { leaderAddress: "b:1", messageIndexes: [1] },
      ],
    });
    const mapped = toConnectError(error);
    expect(mapped.code).toBe(Code.Unavailable);
    expect(mapped.metadata.get(LEADER_ADDRESS_TRAILER)).toBeNull();
    expect(mapped.findDetails(BatchRedirectSchema)[0]).toMatchObject({
      queue: "q",
      routes: [
        { leaderAddress: "a:1", messageIndexes: [0, 2] },
        { leaderAddress: "b:1", messageIndexes: [1] },
      ],
    });
  });

  it("tells a passed deadline from a cancellation", () => {
    const deadline = new AbortController();
    deadline.abort(new ConnectError("timed out", Code.DeadlineExceeded));
    const cancel = new AbortController();
    cancel.abort();
    const error = new CasqError("cancelled", "cancelled before it was written");
    expect(toConnectError(error, deadline.signal).code).toBe(Code.DeadlineExceeded);
    expect(toConnectError(error, cancel.signal).code).toBe(Code.Canceled);
  });

  it("maps store errors and unknown errors", () => {
    expect(toConnectError(new UnavailableError("k", "503")).code).toBe(Code.Unavailable);
    const bug = toConnectError(new TypeError("x is undefined"));
    expect(bug.code).toBe(Code.Internal);
    expect(bug.rawMessage).toMatch(/internal error in casq.*x is undefined/);
    const passthrough = new ConnectError("denied", Code.PermissionDenied);
    expect(toConnectError(passthrough)).toBe(passthrough);
  });

  it("a misconfigured store, however the engine wrapped it, is FAILED_PRECONDITION that does not say retry", () => {
    const store = new StoreMisconfiguredError(
      "k",
      "the bucket does not exist: create it or fix the store URL",
    );
    const wrapped = new CasqError(
      "unavailable",
      `object store: ${store.message}; retry`,
      {},
      { cause: store },
    );
    for (const error of [store, wrapped]) {
      const mapped = toConnectError(error);
      expect(mapped.code).toBe(Code.FailedPrecondition);
      expect(mapped.rawMessage).toContain("the bucket does not exist: create it or fix the store URL");
      expect(mapped.rawMessage).toContain("retrying will not help");
      expect(mapped.rawMessage).not.toMatch(/; retry$/);
      expect(toRpcStatus(error).code).toBe(Code.FailedPrecondition);
    }
  });
});
