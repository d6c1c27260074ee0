/**
 * gRPC health checking (`grpc.health.v1.Health`).
 *
 * The server is SERVING while the object store answers and the server is not
 * shutting down: a {@link HealthMonitor} reads one small key from the store
 * every few seconds (`probeStore`: a missing key is a perfectly good answer;
 * only failures count) and flips to NOT_SERVING after two failures in a row,
 * back to SERVING on the next success. A graceful shutdown flips it to
 * NOT_SERVING first, so load balancers stop sending traffic before the
 * listener closes.
 *
 * Why it is NOT_SERVING is logged once per cause: at error level when the
 * store is misconfigured (credentials, bucket, directory: retrying cannot
 * help), at warn level for an outage; recovery is logged at info level.
 * While NOT_SERVING for a store failure, Check answers carry the cause in the
 * `casq-health-detail` response header (printable ASCII, at most 512 bytes),
 * e.g. `grpcurl -v -plaintext HOST:PORT grpc.health.v1.Health/Check`.
 *
 * `service` may be empty (the server as a whole) or the name of a served
 * service (e.g. `casq.v1.QueueService`); they all share the one status.
 * Check answers NOT_FOUND for any other name; Watch sends SERVICE_UNKNOWN
 * for it, as the health protocol asks, and keeps the stream open.
 */

import {
  type Health,
  HealthCheckResponse_ServingStatus as ServingStatus,
} from "@casq/api/grpc/health/v1/health_pb.ts";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import type { Logger } from "pino";
import type { ObjectStore } from "../store/object-store.ts";
import { probeStore, STORE_PROBE_KEY } from "../store/store-probe.ts";
import type { Clock } from "../util/clock.ts";

/** The key probed in the store; it never needs to exist. */
export const HEALTH_PROBE_KEY = STORE_PROBE_KEY;

/** Response header of Health/Check that says why the server is NOT_SERVING. */
export const HEALTH_DETAIL_HEADER = "casq-health-detail";

/** Longest {@link HEALTH_DETAIL_HEADER} value, in bytes. */
const MAX_DETAIL_BYTES = 512;

/** Tracks whether this server can do its job. */
export class HealthMonitor {
  private current = ServingStatus.NOT_SERVING;
  private failures = 0;
  private shuttingDown = false;
  private readonly listeners = new Set<(status: ServingStatus) => void>();
  private readonly stopTimer = new AbortController();
  private running: Promise<void> | undefined;
  /** The failure of the last probe, when it failed. */
  private problem: { readonly reason: string; readonly permanent: boolean } | undefined;
  /** The reason last logged, so that one cause is logged once, not every probe. */
  private logged: string | undefined;

  constructor(
    private readonly store: ObjectStore,
    private readonly clock: Clock,
    private readonly logger: Logger,
    private readonly intervalMs = 5_000,
  ) {}

  /** The status now. */
  get status(): ServingStatus {
    return this.current;
  }

  /** Why the last probe failed (undefined after a success), and whether retrying can help. */
  get storeProblem(): { readonly reason: string; readonly permanent: boolean } | undefined {
    return this.problem;
  }

  /** Probes once now, then keeps probing every interval until {@link stop}. */
  async start(): Promise<void> {
    await this.probe();
    this.running = this.loop();
  }

  /** Marks the server as shutting down (NOT_SERVING from now on) and stops probing. */
  async stop(): Promise<void> {
    this.shuttingDown = true;
    this.set(ServingStatus.NOT_SERVING);
    this.stopTimer.abort();
    await this.running;
  }

  /** Marks the server as shutting down without stopping the probe loop yet. */
  beginShutdown(): void {
    this.shuttingDown = true;
    this.set(ServingStatus.NOT_SERVING);
  }

  /** Calls `listener` with every change of status; returns the unsubscribe. */
  onChange(listener: (status: ServingStatus) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** One probe of the store. */
  async probe(): Promise<void> {
    const result = await probeStore(this.store);
    if (result.ok) {
      this.failures = 0;
      if (this.problem !== undefined && this.logged !== undefined)
        this.logger.info({ store: this.store.description }, "object store answers again");
      this.problem = undefined;
      this.logged = undefined;
      if (!this.shuttingDown) this.set(ServingStatus.SERVING);
      return;
    }
    this.failures += 1;
    this.problem = { reason: result.reason, permanent: result.permanent };
    // A permanent cause counts at once; an outage after two failures, or at once before the first success.
    if (!result.permanent && this.failures < 2 && this.current === ServingStatus.SERVING) return;
    if (this.logged !== result.reason && !this.shuttingDown) {
      this.logged = result.reason;
      const fields = { err: result.error, store: this.store.description, cause: result.reason };
      if (result.permanent)
        this.logger.error(
          fields,
          "object store misconfigured: NOT_SERVING until an operator fixes it (retrying cannot help)",
        );
      else this.logger.warn(fields, "object store unreachable: NOT_SERVING");
    }
    this.set(ServingStatus.NOT_SERVING);
  }

  private async loop(): Promise<void> {
    while (!this.stopTimer.signal.aborted) {
      try {
        await this.clock.sleep(this.intervalMs, this.stopTimer.signal);
      } catch {
        return;
      }
      await this.probe();
    }
  }

  private set(status: ServingStatus): void {
    if (status === this.current) return;
    this.current = status;
    this.logger.debug({ status: ServingStatus[status] }, "health status changed");
    for (const listener of this.listeners) listener(status);
  }
}

/** The Health implementation; `services` are the names it answers for besides "". */
export function createHealthService(
  monitor: HealthMonitor,
  services: readonly string[],
): ServiceImpl<typeof Health> {
  const known = new Set(["", ...services]);
  return {
    check(req, call) {
      if (!known.has(req.service))
        throw new ConnectError(`unknown service ${JSON.stringify(req.service)}`, Code.NotFound);
      const problem = monitor.storeProblem;
      if (monitor.status !== ServingStatus.SERVING && problem !== undefined)
        call.responseHeader.set(
          HEALTH_DETAIL_HEADER,
          headerText(`${problem.permanent ? "store misconfigured" : "store unreachable"}: ${problem.reason}`),
        );
      return { status: monitor.status };
    },
    async *watch(req, call) {
      if (!known.has(req.service)) {
        yield { status: ServingStatus.SERVICE_UNKNOWN };
        await new Promise<void>((resolve) =>
          call.signal.addEventListener("abort", () => resolve(), { once: true }),
        );
        return;
      }
      let pending: ServingStatus[] = [monitor.status];
      let wake: (() => void) | undefined;
      const off = monitor.onChange((status) => {
        pending.push(status);
        wake?.();
      });
      const onAbort = () => wake?.();
      call.signal.addEventListener("abort", onAbort, { once: true });
      try {
        let last: ServingStatus | undefined;
        while (!call.signal.aborted) {
          const batch = pending;
          pending = [];
          for (const status of batch) {
            if (status === last) continue;
            last = status;
            yield { status };
          }
          if (pending.length === 0 && !call.signal.aborted)
            await new Promise<void>((resolve) => {
              wake = resolve;
            });
          wake = undefined;
        }
      } finally {
        off();
        call.signal.removeEventListener("abort", onAbort);
      }
    },
  };
}

/** `text` as a header value: printable ASCII only, cut to {@link MAX_DETAIL_BYTES}. */
function headerText(text: string): string {
  const ascii = text.replace(/[^\x20-\x7e]+/g, " ").trim();
  return ascii.length <= MAX_DETAIL_BYTES ? ascii : `${ascii.slice(0, MAX_DETAIL_BYTES - 3)}...`;
}
