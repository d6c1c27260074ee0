/**
 * The nemesis: during the chaos phase, at random intervals, it hurts one
 * broker machine.
 *
 * - **crash**: the process dies without a goodbye; a new process with a new
 *   identity starts on the machine a little later.
 * - **graceful stop**: buffered work is committed and the leases are handed
 *   back; a new process starts later.
 * - **partition**: the machine's link to the store fails every call for
 *   longer than a leadership lease, so another broker takes its shards over
 *   (a rival steals the lease); then the link heals and the old leader must
 *   find out it was deposed (its next write is fenced by CAS).
 * - **storm**: the link's fault rates are multiplied for a few seconds.
 *
 * Follow-up actions (restart, heal, end of storm) run even after the chaos
 * phase ended; the world's `calm()` makes sure every machine ends up healthy.
 */
import type { BrokerSlot } from "./broker-slot.ts";
import type { SimRandom } from "./sim-random.ts";
import type { SimContext } from "./sim-world.ts";

type Event = "crash" | "stop" | "partition" | "storm";

/** The chaos actor (see module header). */
export class Nemesis {
  constructor(
    private readonly world: SimContext,
    private readonly random: SimRandom,
  ) {}

  /** Runs until the chaos phase ends. */
  async run(): Promise<void> {
    const { clock, config, slots } = this.world;
    while (this.world.phase === "chaos") {
      await clock.sleep(this.random.exp(config.nemesisGapMs, 1_000));
      if (this.world.phase !== "chaos") break;
      const slot = this.random.pick(slots);
      const event = this.random.weighted<Event>({ crash: 3, stop: 2, partition: 3, storm: 2 });
      if (!slot.isUp) continue;
      switch (event) {
        case "crash":
          slot.crash();
          void this.later(this.random.int(300, 5_000), () => slot.start());
          break;
        case "stop":
          void this.stopAndRestart(slot);
          break;
        case "partition":
          if (slot.isPartitioned) break;
          slot.partition();
          void this.later(config.leadershipLeaseMs + this.random.int(200, 4_000), () => slot.heal());
          break;
        case "storm":
          slot.setStorm(this.random.uniform(3, 8));
          void this.later(this.random.int(2_000, 8_000), () => slot.setStorm(1));
          break;
      }
    }
  }

  private async stopAndRestart(slot: BrokerSlot): Promise<void> {
    await slot.stop();
    await this.world.clock.sleep(this.random.int(300, 5_000));
    slot.start();
  }

  private async later(ms: number, action: () => void): Promise<void> {
    await this.world.clock.sleep(ms);
    action();
  }
}
