import { EventEmitter } from "node:events";
import { Health } from "@casq/api/grpc/health/v1/health_pb.ts";
import { Code, ConnectError, createContextValues } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { CallSignals, GrpcJsCallContext } from "./grpc-js-call-context.ts";

/** The grpc-js side of a call, as far as the context uses it. */
class FakeCall extends EventEmitter {
  cancelled = false;
  metadataReads = 0;
  readonly metadata = {
    toHttp2Headers: () => {
      this.metadataReads += 1;
      return { "x-client": "test" };
    },
  };

  cancel(): void {
    this.cancelled = true;
    this.emit("cancelled");
  }
}

function contextOf(call: FakeCall, options: { deadline?: number; signals?: CallSignals } = {}) {
  return new GrpcJsCallContext(
    Health,
    Health.method.check,
    "/grpc.health.v1.Health/Check",
    createContextValues(),
    options.deadline ?? Number.POSITIVE_INFINITY,
    options.signals ?? new CallSignals(),
    call,
  );
}

describe("the context of a grpc-js call", () => {
  it("keeps its lazy parts on the class, not on each context", () => {
    // An object literal with getters gets a hidden class of its own per call, which kept every call
    // alive into V8's old generation (grpc-js-call-context.ts): the getters must be the prototype's.
    const a = contextOf(new FakeCall());
    const b = contextOf(new FakeCall());
    for (const part of ["signal", "requestHeader", "responseHeader", "responseTrailer", "timeoutMs"])
      expect(Object.getOwnPropertyDescriptor(a, part), part).toBeUndefined();
    expect(Object.getPrototypeOf(a)).toBe(Object.getPrototypeOf(b));
  });

  it("makes the request headers from the metadata once, when first read", () => {
    const call = new FakeCall();
    const context = contextOf(call);
    expect(call.metadataReads).toBe(0);
    expect(context.requestHeader.get("x-client")).toBe("test");
    expect(context.requestHeader).toBe(context.requestHeader);
    expect(call.metadataReads).toBe(1);
  });

  it("hands out response headers only once something read them", () => {
    const context = contextOf(new FakeCall());
    expect(context.responseHeaderIfAny()).toBeUndefined();
    expect(context.responseTrailerIfAny()).toBeUndefined();
    context.responseHeader.set("a", "1");
    context.responseTrailer.set("b", "2");
    expect(context.responseHeaderIfAny()?.get("a")).toBe("1");
    expect(context.responseTrailerIfAny()?.get("b")).toBe("2");
  });

  it("aborts the signal when the client cancels, and stops listening at the end of the call", () => {
    const call = new FakeCall();
    const context = contextOf(call);
    const signal = context.signal;
    expect(signal.aborted).toBe(false);
    expect(call.listenerCount("cancelled")).toBe(1);
    call.cancel();
    expect(signal.aborted).toBe(true);
    expect((signal.reason as ConnectError).code).toBe(Code.Canceled);

    const ended = new FakeCall();
    const other = contextOf(ended);
    void other.signal;
    const reason = new ConnectError("over", Code.Canceled);
    other.abort(reason);
    expect(ended.listenerCount("cancelled")).toBe(0);
    expect(other.signal.reason).toBe(reason);
  });

  it("says DEADLINE_EXCEEDED when grpc-js cancels a call whose deadline passed", () => {
    const call = new FakeCall();
    const context = contextOf(call, { deadline: Date.now() - 1 });
    expect(context.timeoutMs()).toBeLessThanOrEqual(0);
    call.cancelled = true;
    expect((context.signal.reason as ConnectError).code).toBe(Code.DeadlineExceeded);
    expect(contextOf(new FakeCall()).timeoutMs()).toBeUndefined();
  });

  it("makes a signal first read after the call ended already aborted, with the end's reason", () => {
    const context = contextOf(new FakeCall());
    const reason = new ConnectError("the call has ended", Code.Canceled);
    context.abort(reason);
    context.abort(new Error("later"));
    expect(context.signal.aborted).toBe(true);
    expect(context.signal.reason).toBe(reason);
  });

  it("aborts the live signals when the server shuts down, and later ones at once", () => {
    const shutdown = new AbortController();
    const signals = new CallSignals(shutdown.signal);
    const live = contextOf(new FakeCall(), { signals });
    const unread = contextOf(new FakeCall(), { signals });
    const signal = live.signal;
    const reason = new ConnectError("broker shutting down", Code.Unavailable);
    shutdown.abort(reason);
    expect(signal.reason).toBe(reason);
    expect(unread.signal.reason).toBe(reason);
  });

  it("copies into a plain context whose parts are its own properties and the same objects", () => {
    const call = new FakeCall();
    const context = contextOf(call, { deadline: Date.now() + 60_000 });
    const plain = { ...context.toPlainContext() };
    expect(plain.signal).toBe(context.signal);
    expect(plain.requestHeader).toBe(context.requestHeader);
    expect(plain.responseHeader).toBe(context.responseHeader);
    expect(plain.responseTrailer).toBe(context.responseTrailer);
    expect(plain.values).toBe(context.values);
    expect(plain.method).toBe(Health.method.check);
    expect(plain.timeoutMs()).toBeGreaterThan(0);
    call.cancel();
    expect(plain.signal.aborted).toBe(true);
  });
});
