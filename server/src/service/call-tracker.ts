/**
 * Calls in flight, and the switch that refuses new ones while the server
 * shuts down gracefully.
 *
 * Every casq.v1 call is counted from the moment it arrives until its
 * response (or its response stream) is finished. Once draining, new casq.v1
 * calls are refused with UNAVAILABLE "broker shutting down" (and the
 * `casq-not-applied` trailer) so clients go to another broker, while the
 * calls already running finish. Health checks and reflection are neither
 * counted nor refused: a health check during shutdown should answer
 * NOT_SERVING, not fail.
 */
import { NOT_APPLIED_TRAILER } from "@casq/sdk/errors.ts";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";

/** Counts calls in flight and refuses new ones while draining. */
export class CallTracker {
  private count = 0;
  private isDraining = false;
  private idleWaiters: (() => void)[] = [];

  /** Calls in flight. */
  get inFlight(): number {
    return this.count;
  }

  /** True once {@link drain} was called. */
  get draining(): boolean {
    return this.isDraining;
  }

  /** Refuses new calls from now on. */
  drain(): void {
    this.isDraining = true;
  }

  /** Resolves when no call is in flight (at once if none is). */
  idle(): Promise<void> {
    if (this.count === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** The interceptor that counts and gates calls. */
  interceptor(): Interceptor {
    return (next) => async (req) => {
      if (!isTracked(req.service.typeName)) return next(req);
      if (this.isDraining)
        throw new ConnectError("broker shutting down: retry at another broker", Code.Unavailable, {
          [NOT_APPLIED_TRAILER]: "true",
        });
      this.count += 1;
      let res: Awaited<ReturnType<typeof next>>;
      try {
        res = await next(req);
      } catch (error) {
        this.done();
        throw error;
      }
      if (!res.stream) {
        this.done();
        return res;
      }
      return { ...res, message: onFinish(res.message, () => this.done()) };
    };
  }

  private done(): void {
    this.count -= 1;
    if (this.count === 0) for (const resolve of this.idleWaiters.splice(0)) resolve();
  }
}

/**
 * Wraps an async iterable so that `finish` runs exactly once when iteration
 * ends: exhausted, failed, or stopped early (even before the first item).
 */
function onFinish<T>(source: AsyncIterable<T>, finish: () => void): AsyncIterable<T> {
  let finished = false;
  const once = () => {
    if (finished) return;
    finished = true;
    finish();
  };
  return {
    [Symbol.asyncIterator](): AsyncIterator<T> {
      const it = source[Symbol.asyncIterator]();
      return {
        async next() {
          try {
            const r = await it.next();
            if (r.done) once();
            return r;
          } catch (error) {
            once();
            throw error;
          }
        },
        async return(value?: unknown) {
          once();
          return (await it.return?.(value)) ?? { done: true, value: undefined };
        },
        async throw(error?: unknown) {
          once();
          if (it.throw) return it.throw(error);
          throw error;
        },
      };
    },
  };
}

function isTracked(service: string): boolean {
  return !service.startsWith("grpc.health.") && !service.startsWith("grpc.reflection.");
}
