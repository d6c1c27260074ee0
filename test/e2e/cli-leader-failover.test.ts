/**
 * The `casq` CLI after a leader was killed (SIGKILL): the surviving broker
 * redirects to the dead leader until the leader's lease runs out. A request
 * sent to the survivor waits that out, bounded by --retry-timeout, with a
 * note on stderr, and then succeeds there, as the SDKs do.
 */
import { afterAll, describe, expect, it } from "vitest";
import { type CasqServerProcess, casq, startServer, tempDir } from "./support/processes.ts";

const store = tempDir("cli-leader-failover");
const servers: CasqServerProcess[] = [];

afterAll(async () => {
  await Promise.all(servers.map((s) => s.stop("SIGKILL")));
  store.remove();
});

/** Two brokers on one store with a 3 s leader lease; the first leads queue `q` (one message in it). */
async function killedLeader(queue: string) {
  const args = ["--leader-lease", "3s"];
  const [leader, survivor] = await Promise.all([
    startServer({ store: `file:${store.path}`, args }),
    startServer({ store: `file:${store.path}`, args }),
  ]);
  if (!leader || !survivor) throw new Error("brokers did not start");
  servers.push(leader, survivor);
  expect((await casq(["queue", "create", queue, "--server", leader.address])).code).toBe(0);
  const before = await casq(["enqueue", queue, "before the kill", "--server", leader.address]);
  expect(before.code, before.stderr).toBe(0);
  await leader.stop("SIGKILL");
  return { leader, survivor };
}

describe("casq CLI when the leader was killed", () => {
  it("waits for the dead leader's lease at the surviving broker, says so, and succeeds there", async () => {
    const { leader, survivor } = await killedLeader("waits");
    const after = await casq(["enqueue", "waits", "after the kill", "--server", survivor.address]);
    expect(after.code, after.stderr).toBe(0);
    expect(after.stderr).toContain(
      `waiting for the leader lease of queue waits shard 0 to expire (broker ${leader.address} unreachable)`,
    );
    const stats = await casq(["stats", "waits", "--json", "--server", survivor.address]);
    expect(stats.code, stats.stderr).toBe(0);
    const queue = JSON.parse(stats.stdout) as {
      totals?: { messages?: number };
      shards?: { leader?: { address?: string } }[];
    };
    expect(queue.totals?.messages).toBe(2);
    expect(queue.shards?.[0]?.leader?.address).toBe(survivor.address);
  });

  it("gives up after --retry-timeout with exit 4 and says why", async () => {
    const { leader, survivor } = await killedLeader("gives-up");
    const r = await casq([
      "enqueue",
      "gives-up",
      "too soon",
      "--retry-timeout",
      "0s",
      "--server",
      survivor.address,
    ]);
    expect(r.code, r.stderr).toBe(4);
    expect(r.stderr).toContain(leader.address);
  });
});
