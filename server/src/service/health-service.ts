/**
 * gRPC health checking (`grpc.health.v1.Health`).
 *
 * The server is SERVING while the object store answers and the server is not
 * shutting down: a {@link HealthMonitor} reads one small key from the store
 * every few seconds (a missing key is a perfectly good answer; only failures
 * count) and flips to NOT_SERVING after two failures in a row, back to
 * SERVING on the next success. A graceful shutdown flips it to NOT_SERVING
 * first, so load balancers stop sending traffic before the listener closes.
 *
 * `service` may be empty (the server as a whole) or the name of a served
 * service (e.g. `casq.v1.QueueService`); they all share the one status.
 * Check answers NOT_FOUND for any other name; Watch sends SERVICE_UNKNOWN
 * for it, as the health protocol asks, and keeps the stream open.
 */
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import type { Logger } from "pino";
import type { ObjectStore } from "../store/object-store.ts";
import type { Clock } from "../util/clock.ts";
import { type Health, ServingStatus } from "./grpc-descriptors.ts";

/** The key probed in the store; it never needs to exist. */
export const HEALTH_PROBE_KEY = "casq-health-probe";

/** Tracks whether this server can do its job. */
export class HealthMonitor {
  private current = ServingStatus.NOT_SERVING;
  private failures = 0;
  private shuttingDown = false;
  private readonly listeners = new Set<(status: ServingStatus) => void>();
  private readonly stopTimer = new AbortController();
  private running: Promise<void> | undefined;

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
    try {
      await this.store.get(HEALTH_PROBE_KEY);
      this.failures = 0;
      if (!this.shuttingDown) this.set(ServingStatus.SERVING);
    } catch (error) {
      this.failures += 1;
      if (this.failures >= 2 || this.current !== ServingStatus.SERVING) {
        if (this.current === ServingStatus.SERVING)
          this.logger.warn(
            { err: error, store: this.store.description },
            "object store unreachable: NOT_SERVING",
          );
        this.set(ServingStatus.NOT_SERVING);
      }
    }
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
    check(req) {
      if (!known.has(req.service))
        throw new ConnectError(`unknown service ${JSON.stringify(req.service)}`, Code.NotFound);
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
