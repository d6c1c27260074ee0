/**
 * The network of one simulated SDK client process: a connect `Transport` per
 * broker address (the SDK's `transportFactory`), reaching that slot's
 * current broker process in memory ({@link BrokerSlot.services}), with the
 * failures of a real connection, all on the run's ManualClock:
 *
 * - a few ms of latency before each call is made and before a unary answer
 *   is handed over;
 * - **refused** (UNAVAILABLE, cause ECONNREFUSED: surely not applied) while
 *   the slot's process is down or stopping, or this client is dead;
 * - **reset** (UNAVAILABLE, cause ECONNRESET: may have been applied) for
 *   every call and stream in flight when the process crashes, finishes a
 *   graceful stop, or this client dies ({@link SimConnections.kill}); a unary
 *   answer still on the wire then is lost;
 * - **deadlines** on the virtual clock: the SDK's per-attempt `timeoutMs`
 *   is not passed on to connect (whose timers are real `setTimeout`s); the
 *   call is aborted with DEADLINE_EXCEEDED when the ManualClock reaches it.
 *
 * Every request that leaves the client and every response handed to it goes
 * through the {@link WireTap}: that is how the auditor learns what the SDK
 * sent and what it was told, without trusting the SDK's own account.
 */
import type {
  DescMessage,
  DescMethodStreaming,
  DescMethodUnary,
  MessageInitShape,
  MessageShape,
} from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  type ContextValues,
  type StreamResponse,
  type Transport,
  type UnaryResponse,
} from "@connectrpc/connect";
import type { ManualClock } from "../../server/testing/manual-clock.ts";
import type { BrokerSlot } from "./broker-slot.ts";
import type { SimRandom } from "./sim-random.ts";

/** Sees what crosses the wire of one client (method names as in the proto, e.g. `Ack`, `Work`). */
export interface WireTap {
  /** A request message left the client. */
  request(method: string, message: unknown): void;
  /** A response message was handed to the client. */
  response(method: string, message: unknown): void;
}

/** Headers of a call, as connect's `Transport` takes them. */
type Headers = Parameters<Transport["unary"]>[3];

function systemError(code: string, message: string): Error {
  return Object.assign(new Error(message), { code });
}

/** The connections of one client process (see module header). */
export class SimConnections {
  private readonly transports = new Map<string, Transport>();
  private readonly cuts = new Set<() => void>();
  private dead = false;

  constructor(
    private readonly slots: readonly BrokerSlot[],
    private readonly clock: ManualClock,
    private readonly random: SimRandom,
    private readonly tap: WireTap,
  ) {}

  /** The transport to `address` (the SDK's `transportFactory`). */
  transport(address: string): Transport {
    let t = this.transports.get(address);
    if (t === undefined) {
      const slot = this.slots.find((s) => s.address === address);
      if (slot === undefined) throw new Error(`no simulated broker at ${address}`);
      t = this.slotTransport(slot);
      this.transports.set(address, t);
    }
    return t;
  }

  /** The client process dies: every call in flight is reset, every later one refused. */
  kill(): void {
    this.dead = true;
    for (const cut of [...this.cuts]) cut();
    this.cuts.clear();
  }

  private slotTransport(slot: BrokerSlot): Transport {
    return {
      unary: <I extends DescMessage, O extends DescMessage>(
        method: DescMethodUnary<I, O>,
        signal: AbortSignal | undefined,
        timeoutMs: number | undefined,
        header: Headers,
        input: MessageInitShape<I>,
        contextValues?: ContextValues,
      ): Promise<UnaryResponse<I, O>> =>
        this.unary(slot, method, signal, timeoutMs, header, input, contextValues),
      stream: <I extends DescMessage, O extends DescMessage>(
        method: DescMethodStreaming<I, O>,
        signal: AbortSignal | undefined,
        timeoutMs: number | undefined,
        header: Headers,
        input: AsyncIterable<MessageInitShape<I>>,
        contextValues?: ContextValues,
      ): Promise<StreamResponse<I, O>> =>
        this.stream(slot, method, signal, timeoutMs, header, input, contextValues),
    };
  }

  /** Waits the network latency, then the slot's process transport, or throws "connection refused". */
  private async connect(slot: BrokerSlot): Promise<Transport> {
    await this.clock.sleep(this.random.int(1, 3));
    const services = slot.services;
    if (this.dead || services === undefined)
      throw new ConnectError(
        `broker ${slot.name}: connection refused`,
        Code.Unavailable,
        undefined,
        undefined,
        systemError("ECONNREFUSED", `connect ECONNREFUSED ${slot.address}`),
      );
    return services.transport;
  }

  /**
   * Starts one call's life: an abort controller linked to the caller's signal,
   * cut by a crash of the slot or of this client, and aborted at the
   * deadline on the virtual clock. Returns it and the function that ends it.
   */
  private open(
    slot: BrokerSlot,
    signal: AbortSignal | undefined,
    timeoutMs: number | undefined,
  ): { controller: AbortController; close: () => void; connection: number } {
    const controller = new AbortController();
    const onCallerAbort = () => controller.abort(signal?.reason);
    if (signal?.aborted) onCallerAbort();
    signal?.addEventListener("abort", onCallerAbort, { once: true });
    const cut = () =>
      controller.abort(
        new ConnectError(
          `broker ${slot.name}: connection reset`,
          Code.Unavailable,
          undefined,
          undefined,
          systemError("ECONNRESET", "read ECONNRESET"),
        ),
      );
    this.cuts.add(cut);
    const offSlot = slot.onCut(cut);
    const timer = new AbortController();
    if (timeoutMs !== undefined)
      this.clock.sleep(Math.max(0, timeoutMs), timer.signal).then(
        () => controller.abort(new ConnectError("the operation timed out", Code.DeadlineExceeded)),
        () => {},
      );
    return {
      controller,
      connection: slot.connection,
      close: () => {
        timer.abort();
        signal?.removeEventListener("abort", onCallerAbort);
        this.cuts.delete(cut);
        offSlot();
      },
    };
  }

  private async unary<I extends DescMessage, O extends DescMessage>(
    slot: BrokerSlot,
    method: DescMethodUnary<I, O>,
    signal: AbortSignal | undefined,
    timeoutMs: number | undefined,
    header: Headers,
    input: MessageInitShape<I>,
    contextValues?: ContextValues,
  ): Promise<UnaryResponse<I, O>> {
    const inner = await this.connect(slot);
    const call = this.open(slot, signal, timeoutMs);
    try {
      this.tap.request(method.name, input);
      const response = await inner.unary(
        method,
        call.controller.signal,
        undefined,
        header,
        input,
        contextValues,
      );
      await this.clock.sleep(this.random.int(1, 3));
      // The process died, or this client did, while the answer was on the wire.
      if (call.connection !== slot.connection || this.dead || call.controller.signal.aborted)
        throw new ConnectError(
          `broker ${slot.name}: connection lost before the answer arrived`,
          Code.Unavailable,
          undefined,
          undefined,
          systemError("ECONNRESET", "read ECONNRESET"),
        );
      this.tap.response(method.name, response.message);
      return response;
    } finally {
      call.close();
    }
  }

  private async stream<I extends DescMessage, O extends DescMessage>(
    slot: BrokerSlot,
    method: DescMethodStreaming<I, O>,
    signal: AbortSignal | undefined,
    timeoutMs: number | undefined,
    header: Headers,
    input: AsyncIterable<MessageInitShape<I>>,
    contextValues?: ContextValues,
  ): Promise<StreamResponse<I, O>> {
    const inner = await this.connect(slot);
    const call = this.open(slot, signal, timeoutMs);
    const tap = this.tap;
    const name = method.name;
    async function* requests(): AsyncIterable<MessageInitShape<I>> {
      for await (const message of input) {
        tap.request(name, message);
        yield message;
      }
    }
    let response: StreamResponse<I, O>;
    try {
      response = await inner.stream(
        method,
        call.controller.signal,
        undefined,
        header,
        requests(),
        contextValues,
      );
    } catch (error) {
      call.close();
      throw error;
    }
    const messages = response.message;
    async function* delivered(): AsyncIterable<MessageShape<O>> {
      try {
        for await (const message of messages) {
          tap.response(name, message);
          yield message;
        }
      } finally {
        call.close();
      }
    }
    return { ...response, message: delivered() };
  }
}
