/**
 * The streamed response messages of a grpc-js call, written several per
 * HTTP/2 write.
 *
 * grpc-js hands a call's messages to HTTP/2 one at a time: its stream asks
 * for the next message only once the previous one's HTTP/2 write completed,
 * which is after it went out on the socket (grpc/grpc-node#2899). So every
 * message costs its own `writev` syscall and its own turn of the event loop,
 * and a burst (the jobs a commit claimed for a Work stream, the answers to
 * the acks it carried) trickles out one message per turn.
 *
 * {@link batchStreamWrites} gives the call's writable side a `_writev`. Node's
 * Writable uses it for the messages written while a write was in flight:
 * they are framed as grpc-js frames them (a 5-byte prefix, no compression)
 * and go out in order, as one HTTP/2 write. A message alone still takes
 * grpc-js's own path. Everything grpc-js does per message is done per
 * message here too: the cancelled check, the size limit, the response
 * headers before the first message, and the channelz count.
 *
 * This reaches into the grpc-js call object under the public stream (its
 * `call`: the HTTP/2 stream, the serializer and the checks above), which
 * grpc-js does not export as API; `@grpc/grpc-js` is pinned in
 * server/package.json for this. Only a call of exactly that shape is
 * batched: behind a grpc-js server interceptor (which relies on one message
 * in flight at a time) or in another grpc-js version, the call keeps
 * grpc-js's one-message-at-a-time path, and
 * `grpc-js-batched-writes.test.ts` fails so that the loss is seen.
 */
import { status as GrpcStatus } from "@grpc/grpc-js";

/** The part of grpc-js's `BaseServerInterceptingCall` (1.14) the batched writes use. */
interface BaseServerCall {
  readonly stream: { write(chunk: Buffer, callback: (error?: Error | null) => void): boolean };
  readonly maxSendMessageSize: number;
  readonly callEventTracker?: { addMessageSent(): void } | null;
  checkCancelled(): boolean;
  maybeSendMetadata(): void;
  serializeMessage(message: unknown): Buffer;
  sendStatus(status: { code: number; details: string; metadata: null }): void;
}

/** A buffered write as Node's Writable hands it to `_writev`. */
interface BufferedWrite {
  readonly chunk: unknown;
}

/** The writable side of a grpc-js streaming call: the public stream object. */
interface WritableCall {
  _writev?: (writes: BufferedWrite[], callback: (error?: Error | null) => void) => void;
}

function isBaseServerCall(value: unknown): value is BaseServerCall {
  const call = value as Partial<Record<keyof BaseServerCall, unknown>> | undefined;
  return (
    typeof call === "object" &&
    call !== null &&
    typeof (call.stream as { write?: unknown } | undefined)?.write === "function" &&
    typeof call.maxSendMessageSize === "number" &&
    typeof call.checkCancelled === "function" &&
    typeof call.maybeSendMetadata === "function" &&
    typeof call.serializeMessage === "function" &&
    typeof call.sendStatus === "function"
  );
}

/**
 * Makes `call` (a server-streaming or bidi call as grpc-js hands it to a
 * handler) write the messages buffered behind an HTTP/2 write in flight
 * together (see the module header). Returns false, changing nothing, when
 * the call is not of the shape this relies on.
 */
export function batchStreamWrites(call: object): boolean {
  const base = (call as { call?: unknown }).call;
  if (!isBaseServerCall(base)) return false;
  (call as WritableCall)._writev = (writes, callback) => {
    // As grpc-js's sendMessage: a cancelled call takes no more writes and never calls back.
    if (base.checkCancelled()) return;
    const frames: Buffer[] = [];
    let bytes = 0;
    for (const write of writes) {
      let frame: Buffer;
      try {
        frame = base.serializeMessage(write.chunk);
      } catch (error) {
        base.sendStatus({
          code: GrpcStatus.INTERNAL,
          details: `Error serializing response: ${error instanceof Error ? error.message : String(error)}`,
          metadata: null,
        });
        return;
      }
      if (base.maxSendMessageSize !== -1 && frame.length - 5 > base.maxSendMessageSize) {
        base.sendStatus({
          code: GrpcStatus.RESOURCE_EXHAUSTED,
          details: `Sent message larger than max (${frame.length} vs. ${base.maxSendMessageSize})`,
          metadata: null,
        });
        return;
      }
      frames.push(frame);
      bytes += frame.length;
    }
    base.maybeSendMetadata();
    base.stream.write(Buffer.concat(frames, bytes), (error) => {
      if (error) {
        base.sendStatus({
          code: GrpcStatus.INTERNAL,
          details: `Error writing message: ${error.message}`,
          metadata: null,
        });
        return;
      }
      for (let i = 0; i < frames.length; i++) base.callEventTracker?.addMessageSent();
      callback();
    });
  };
  return true;
}
