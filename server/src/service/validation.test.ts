/**
 * Enqueue input checks of the service layer: which field an error names.
 */
import { create } from "@bufbuild/protobuf";
import { NewMessageSchema, TraceContextSchema } from "@casq/api/casq/v1/message_pb.ts";
import { describe, expect, it } from "vitest";
import { MAX_TRACE_CONTEXT_BYTES } from "../model/input-validation.ts";
import { checkNewMessages } from "./validation.ts";

const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const hugeState = `k=${"v".repeat(MAX_TRACE_CONTEXT_BYTES)}`;
const message = (traceContext?: { traceparent: string; tracestate: string }) =>
  create(NewMessageSchema, {
    payload: new Uint8Array([1]),
    ...(traceContext ? { traceContext: create(TraceContextSchema, traceContext) } : {}),
  });

describe("checkNewMessages", () => {
  it("names the call's metadata, not a message's field, when the call's trace context is too large", () => {
    expect(() =>
      checkNewMessages([message({ traceparent, tracestate: "" }), message()], 0, {
        traceparent,
        tracestate: hugeState,
      }),
    ).toThrow(/^the call's traceparent \/ tracestate metadata \(the trace context of messages\[1\]/);
  });

  it("names the message's trace_context when its own is too large", () => {
    expect(() =>
      checkNewMessages([message(), message({ traceparent, tracestate: hugeState })], 0, undefined),
    ).toThrow(/^messages\[1\]\.trace_context is larger than/);
  });

  it("takes a large call trace context that no message uses", () => {
    const inputs = checkNewMessages([message({ traceparent, tracestate: "" })], 0, {
      traceparent,
      tracestate: hugeState,
    });
    expect(inputs[0]?.traceContext).toEqual({ traceparent });
  });
});
