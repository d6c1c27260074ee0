/**
 * A client connection policy, as an SDK would have it: talk to one broker,
 * follow `redirect` errors to the leader they name, move to another broker
 * and back off on `unavailable` or a missed deadline, and give up after a
 * bounded number of tries.
 *
 * A call that gives up has an UNKNOWN outcome (the operation may or may not
 * have been committed); only a returned value is an acknowledgement. The
 * client never pretends otherwise, and neither do the actors built on it.
 *
 * Its users: the direct actors (the producers' `DirectEnqueue`, `worker.ts`)
 * and the world's setup. Seeds whose workers and producers are all the SDK's
 * (`sdkWorkers: "instead"`) use it only for the setup.
 */
import type { Broker } from "../../server/src/broker/broker.ts";
import { isCasqError } from "../../server/src/errors.ts";
import type { ManualClock } from "../../server/testing/manual-clock.ts";
import type { Auditor } from "./auditor.ts";
import type { BrokerSlot } from "./broker-slot.ts";
import type { SimRandom } from "./sim-random.ts";

/** The answer of a call, or why it gave up. */
export type CallResult<T> =
  | { readonly ok: true; readonly value: T }
  | { readonly ok: false; readonly error: unknown };

/** Retries and redirects for one actor (see module header). */
export class SimClient {
  private preferred: BrokerSlot;

  constructor(
    private readonly slots: readonly BrokerSlot[],
    private readonly clock: ManualClock,
    private readonly random: SimRandom,
    private readonly auditor: Auditor,
    private readonly maxTries = 8,
  ) {
    this.preferred = random.pick(slots);
  }

  /**
   * Runs `call` against some broker until it answers or the tries run out.
   * Each try has a deadline (`deadlineMs`); a try that misses it counts like
   * `unavailable` (its outcome is unknown) and is retried.
   */
  async call<T>(
    kind: string,
    call: (broker: Broker, signal: AbortSignal) => Promise<T>,
    deadlineMs = 5_000,
  ): Promise<CallResult<T>> {
    this.auditor.requestSent(kind);
    // Spread load the way a client pool would: sometimes start at another broker.
    let slot = this.random.chance(0.2) ? this.random.pick(this.slots) : this.preferred;
    for (let attempt = 1; ; attempt++) {
      try {
        const value = await slot.invoke(call, deadlineMs);
        this.preferred = slot;
        return { ok: true, value };
      } catch (error) {
        const redirect = isCasqError(error, "redirect");
        const retryable = redirect || isCasqError(error, "unavailable") || isCasqError(error, "cancelled");
        if (attempt >= this.maxTries || !retryable) {
          this.auditor.requestFailed(kind, error);
          return { ok: false, error };
        }
        const leader = redirect
          ? this.slots.find((s) => s.address === error.details.leaderAddress)
          : undefined;
        if (leader !== undefined && leader !== slot) {
          slot = leader;
          continue;
        }
        slot = this.random.pick(this.slots);
        await this.clock.sleep(this.random.int(20, 40 * 2 ** Math.min(attempt, 4)));
      }
    }
  }
}
