/**
 * callWithFailover when the leader dies: the surviving broker keeps
 * redirecting to the dead leader until the leader's lease runs out. The call
 * must wait at the survivor instead of bouncing between the two, which would
 * burn every attempt long before the survivor takes the shard over.
 */
import { create } from "@bufbuild/protobuf";
import { LeaderRedirectSchema } from "@casq/api/casq/v1/errors_pb.ts";
import { describe, expect, it } from "vitest";
import { resolveClientOptions } from "./client-options.ts";
import { CasqError, Code, RedirectError, UnavailableError } from "./errors.ts";
import { callWithFailover } from "./failover.ts";
import { BrokerPool } from "./transport.ts";

const DEAD = "127.0.0.1:1";
const SURVIVOR = "127.0.0.1:2";

function redirectTo(address: string): RedirectError {
  return new RedirectError(
    "shard led elsewhere",
    create(LeaderRedirectSchema, { leaderAddress: address, queue: "q", shard: 0 }),
  );
}

/** A cluster whose leader is gone: the survivor redirects to it `redirects` times, then serves. */
function deadLeaderCluster(redirects: number) {
  const calls: string[] = [];
  let left = redirects;
  const attempt = async ({ address }: { address: string }): Promise<string> => {
    calls.push(address);
    if (address === DEAD) throw new UnavailableError("connect ECONNREFUSED");
    if (left-- > 0) throw redirectTo(DEAD);
    return "stored";
  };
  return { calls, attempt };
}

describe("callWithFailover", () => {
  it("waits at the survivor while it still redirects to a leader that failed in this call", async () => {
    const pool = new BrokerPool(
      resolveClientOptions({
        brokers: [DEAD, SURVIVOR],
        maxAttempts: 8,
        backoffInitialMs: 1,
        backoffMaxMs: 2,
      }),
    );
    // Six redirects: bouncing DEAD, SURVIVOR, DEAD, ... would spend the 8 attempts on four.
    const { calls, attempt } = deadLeaderCluster(6);
    await expect(callWithFailover(pool, attempt)).resolves.toBe("stored");
    expect(calls).toEqual([DEAD, ...Array(7).fill(SURVIVOR)]);
    expect(pool.preferred()).toBe(SURVIVOR);
  });

  it("still follows a redirect to a broker that has not failed", async () => {
    const pool = new BrokerPool(
      resolveClientOptions({ brokers: [SURVIVOR], maxAttempts: 3, backoffInitialMs: 1, backoffMaxMs: 2 }),
    );
    const leader = "127.0.0.1:3";
    const calls: string[] = [];
    const result = await callWithFailover(pool, async ({ address }) => {
      calls.push(address);
      if (address !== leader) throw redirectTo(leader);
      return "stored";
    });
    expect(result).toBe("stored");
    expect(calls).toEqual([SURVIVOR, leader]);
    expect(pool.preferred()).toBe(leader);
  });

  it("gives up after maxAttempts with the last error", async () => {
    const pool = new BrokerPool(
      resolveClientOptions({
        brokers: [DEAD, SURVIVOR],
        maxAttempts: 4,
        backoffInitialMs: 1,
        backoffMaxMs: 2,
      }),
    );
    const { calls, attempt } = deadLeaderCluster(100);
    await expect(callWithFailover(pool, attempt)).rejects.toBeInstanceOf(RedirectError);
    expect(calls).toHaveLength(4);
  });

  it("leaves a broker whose attempt ran into its own timeout (a hung broker) for the next one", async () => {
    const pool = new BrokerPool(
      resolveClientOptions({
        brokers: [DEAD, SURVIVOR],
        timeoutMs: 50,
        backoffInitialMs: 1,
        backoffMaxMs: 2,
      }),
    );
    const calls: string[] = [];
    const result = await callWithFailover(pool, async ({ address, timeoutMs }) => {
      calls.push(address);
      expect(timeoutMs).toBe(50);
      if (address === DEAD) throw new CasqError(Code.DeadlineExceeded, "the operation timed out");
      return "stored";
    });
    expect(result).toBe("stored");
    expect(calls).toEqual([DEAD, SURVIVOR]);
    expect(pool.preferred()).toBe(SURVIVOR);
  });

  it("does not retry a DEADLINE_EXCEEDED of the caller's own deadline", async () => {
    const pool = new BrokerPool(
      resolveClientOptions({ brokers: [DEAD, SURVIVOR], timeoutMs: 60_000, backoffInitialMs: 1 }),
    );
    const calls: string[] = [];
    const call = callWithFailover(
      pool,
      async ({ address, timeoutMs }) => {
        calls.push(address);
        // The attempt got the caller's remaining time, not the pool's 60 s.
        expect(timeoutMs).toBeLessThanOrEqual(10_000);
        throw new CasqError(Code.DeadlineExceeded, "the operation timed out");
      },
      { deadline: Date.now() + 10_000 },
    );
    await expect(call).rejects.toMatchObject({ code: Code.DeadlineExceeded });
    expect(calls).toEqual([DEAD]);
  });

  it("does not retry after the caller aborted", async () => {
    const pool = new BrokerPool(resolveClientOptions({ brokers: [DEAD, SURVIVOR], backoffInitialMs: 1 }));
    const controller = new AbortController();
    const calls: string[] = [];
    const call = callWithFailover(
      pool,
      async ({ address }) => {
        calls.push(address);
        controller.abort();
        throw new CasqError(Code.DeadlineExceeded, "the operation timed out");
      },
      { signal: controller.signal },
    );
    await expect(call).rejects.toMatchObject({ code: Code.Canceled });
    expect(calls).toEqual([DEAD]);
  });

  it("retryOutages: false fails at once at the first broker, but waits out a dead leader it was redirected to", async () => {
    const options = { brokers: [SURVIVOR], backoffInitialMs: 1, backoffMaxMs: 2 };
    const down = new BrokerPool(resolveClientOptions(options));
    const calls: string[] = [];
    const outage = callWithFailover(
      down,
      async ({ address }) => {
        calls.push(address);
        throw new UnavailableError("connect ECONNREFUSED");
      },
      { retryOutages: false },
    );
    await expect(outage).rejects.toBeInstanceOf(UnavailableError);
    expect(calls).toEqual([SURVIVOR]);

    const waits: string[] = [];
    const { calls: cluster, attempt } = deadLeaderCluster(3);
    const result = await callWithFailover(new BrokerPool(resolveClientOptions(options)), attempt, {
      retryOutages: false,
      onLeaderWait: (redirect) => waits.push(redirect.leaderAddress),
    });
    expect(result).toBe("stored");
    expect(cluster).toEqual([SURVIVOR, DEAD, SURVIVOR, SURVIVOR, SURVIVOR]);
    expect(waits).toEqual([DEAD, DEAD]);
  });

  it("idempotent: false is not resent after an attempt that may have been applied", async () => {
    const options = { brokers: [DEAD, SURVIVOR], timeoutMs: 50, backoffInitialMs: 1, backoffMaxMs: 2 };
    const reset = Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" });
    const refused = Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" });
    for (const failure of [
      new CasqError(Code.DeadlineExceeded, "the operation timed out"),
      new UnavailableError("read ECONNRESET", { cause: reset }),
    ]) {
      const calls: string[] = [];
      const call = callWithFailover(
        new BrokerPool(resolveClientOptions(options)),
        async ({ address }) => {
          calls.push(address);
          if (address === DEAD) throw failure;
          return "stored again";
        },
        { idempotent: false },
      );
      await expect(call).rejects.toBe(failure);
      expect(calls).toEqual([DEAD]);
    }
    // A connection never made, or an UNAVAILABLE answer, applied nothing: resent.
    for (const failure of [
      new UnavailableError("connect ECONNREFUSED", { cause: refused }),
      new UnavailableError("store unavailable"),
    ]) {
      const calls: string[] = [];
      const result = await callWithFailover(
        new BrokerPool(resolveClientOptions(options)),
        async ({ address, uncertain }) => {
          calls.push(address);
          expect(uncertain).toBe(false);
          if (address === DEAD) throw failure;
          return "stored";
        },
        { idempotent: false },
      );
      expect(result).toBe("stored");
      expect(calls).toEqual([DEAD, SURVIVOR]);
    }
  });

  it("marks the resend of an idempotent call after a possibly applied attempt as uncertain", async () => {
    const pool = new BrokerPool(
      resolveClientOptions({
        brokers: [DEAD, SURVIVOR],
        timeoutMs: 50,
        backoffInitialMs: 1,
        backoffMaxMs: 2,
      }),
    );
    const seen: boolean[] = [];
    const result = await callWithFailover(pool, async ({ address, uncertain }) => {
      seen.push(uncertain);
      if (address === DEAD) throw new CasqError(Code.DeadlineExceeded, "the operation timed out");
      return "stored";
    });
    expect(result).toBe("stored");
    expect(seen).toEqual([false, true]);
  });
});
