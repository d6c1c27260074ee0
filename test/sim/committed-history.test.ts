/**
 * Tests of the simulation's judge: feed hand-made committed versions (built
 * with the real model, then edited the way a broken broker or model would
 * write them) to {@link CommittedHistory} and check that each invariant fires
 * — and that a correct history raises nothing. A checker that cannot fail
 * proves nothing.
 */
import { describe, expect, it } from "vitest";
import { applyOperation } from "../../server/src/model/apply-operation.ts";
import { ShardState } from "../../server/src/model/shard-state.ts";
import { CommittedHistory } from "./committed-history.ts";

const T = 1_704_067_200_000;
const payload = (text: string) => new TextEncoder().encode(text);
/** The parts of a stored document these tests edit (each test's shard has one subscription and one delivery). */
interface DocJson {
  counters: { delivered: number };
  subscriptions: [
    {
      counters: { delivered: number };
      deliveries: [
        { offset: number; attempts: number; lease: { worker: string; claimed_at: number; deadline: number } },
      ];
    },
  ];
}

function harness() {
  const violations: string[] = [];
  const acks = new Set<string>();
  /** Nacks sent, with when they were sent. */
  const nacks = new Map<string, number>();
  const history = new CommittedHistory(
    {
      ackSent: (_shard, sub, offset, attempt) => acks.has(`${sub}/${offset}#${attempt}`),
      nackSent: (_shard, sub, offset, attempt) => nacks.has(`${sub}/${offset}#${attempt}`),
      nackSentAt: (_shard, sub, offset, attempt) => nacks.get(`${sub}/${offset}#${attempt}`),
    },
    (invariant) => violations.push(invariant),
  );
  let etag = 0;
  let previous: string | undefined;
  const commit = (doc: ShardState | DocJson, at: number) => {
    const bytes = doc instanceof ShardState ? doc.encode() : new TextEncoder().encode(JSON.stringify(doc));
    const next = `"e${++etag}"`;
    history.record(
      "queues/jobs/0.json",
      bytes,
      next,
      previous ? { ifMatch: previous } : { ifAbsent: true },
      at,
    );
    previous = next;
  };
  return { violations, acks, nacks, commit, history };
}

/** A shard led by broker `b` (epoch 1) holding one message, claimed once by w1 (lease 1 s). */
function claimedShard(): ShardState {
  const state = ShardState.create({ queue: "jobs", shard: 0, config: { leaseTtlMs: 1_000 }, now: T });
  state.broker = { id: "b", address: "b:1", epoch: 1, leaseUntil: T + 10_000 };
  applyOperation(state, { kind: "enqueue", messages: [{ id: "m0", payload: payload("0") }] }, T);
  applyOperation(state, { kind: "claim", subscription: "default", workerId: "w1", max: 1 }, T + 10);
  return state;
}

const json = (state: ShardState): DocJson => JSON.parse(new TextDecoder().decode(state.encode()));

describe("CommittedHistory (the simulation's transition checks)", () => {
  it("accepts a correct history: enqueue, claim, expiry, redelivery, ack", () => {
    const h = harness();
    const state = claimedShard();
    h.commit(state, T + 20);
    applyOperation(state, { kind: "expire" }, T + 2_000);
    applyOperation(state, { kind: "claim", subscription: "default", workerId: "w2", max: 1 }, T + 2_000);
    h.commit(state, T + 2_010);
    h.acks.add("default/0#2");
    applyOperation(
      state,
      { kind: "ack", subscription: "default", receipts: [{ offset: 0, attempt: 2 }] },
      T + 2_100,
    );
    h.commit(state, T + 2_110);
    expect(h.violations).toEqual([]);
    expect(h.history.deliveriesOf(0, "default", 0)).toBe(2);
    expect(h.history.stats().redeliveries).toBe(1);
  });

  it("flags a message settled without any ack having been sent (it vanished)", () => {
    const h = harness();
    const state = claimedShard();
    h.commit(state, T + 20);
    applyOperation(
      state,
      { kind: "ack", subscription: "default", receipts: [{ offset: 0, attempt: 1 }] },
      T + 30,
    );
    h.commit(state, T + 40);
    expect(h.violations).toContain("no-vanishing");
  });

  it("flags a redelivery that reuses the previous attempt number (a receipt handed out twice)", () => {
    const h = harness();
    const state = claimedShard();
    h.commit(state, T + 20);
    applyOperation(state, { kind: "expire" }, T + 2_000);
    applyOperation(state, { kind: "claim", subscription: "default", workerId: "w2", max: 1 }, T + 2_000);
    const doc = json(state);
    doc.subscriptions[0].deliveries[0].attempts = 1; // what a model that does not bump attempts would write
    h.commit(doc, T + 2_010);
    expect(h.violations).toContain("receipts-unique");
  });

  it("flags a new lease granted while the previous one was still running", () => {
    const h = harness();
    const state = claimedShard();
    h.commit(state, T + 20);
    const doc = json(state);
    const delivery = doc.subscriptions[0].deliveries[0];
    delivery.attempts = 2;
    delivery.lease = { ...delivery.lease, worker: "w2", claimed_at: T + 500, deadline: T + 1_500 };
    doc.counters.delivered += 1;
    doc.subscriptions[0].counters.delivered += 1;
    h.commit(doc, T + 510);
    expect(h.violations).toContain("one-holder");
  });

  it("flags a lease released early without a nack, and accepts it with one", () => {
    const state = claimedShard();
    const released = state.clone();
    applyOperation(
      released,
      { kind: "nack", subscription: "default", receipts: [{ offset: 0, attempt: 1 }] },
      T + 100,
    );
    const without = harness();
    without.commit(state, T + 20);
    without.commit(released, T + 110);
    expect(without.violations).toContain("leases");
    const withNack = harness();
    withNack.nacks.set("default/0#1", T + 100);
    withNack.commit(state, T + 20);
    withNack.commit(released, T + 110);
    expect(withNack.violations).toEqual([]);
  });

  it("accepts a release and the next claim in one commit, but not a claim before the release was sent", () => {
    const state = claimedShard();
    const next = state.clone();
    applyOperation(
      next,
      { kind: "nack", subscription: "default", receipts: [{ offset: 0, attempt: 1 }], release: true },
      T + 100,
    );
    applyOperation(next, { kind: "claim", subscription: "default", workerId: "w2", max: 1 }, T + 100);
    const released = harness();
    released.nacks.set("default/0#1", T + 99.5);
    released.commit(state, T + 20);
    released.commit(next, T + 110);
    expect(released.violations).toEqual([]);
    const early = harness();
    early.nacks.set("default/0#1", T + 300);
    early.commit(state, T + 20);
    early.commit(next, T + 310);
    expect(early.violations).toContain("one-holder");
  });

  it("flags a claim that passes over a runnable message of higher priority", () => {
    const state = ShardState.create({ queue: "jobs", shard: 0, now: T });
    state.broker = { id: "b", address: "b:1", epoch: 1, leaseUntil: T + 10_000 };
    const messages = [
      { id: "low", payload: payload("l"), priority: 0 },
      { id: "high", payload: payload("h"), priority: 5 },
    ];
    applyOperation(state, { kind: "enqueue", messages }, T);
    const enqueued = state.clone();
    applyOperation(state, { kind: "claim", subscription: "default", workerId: "w", max: 1 }, T + 10);
    const correct = json(state);
    expect(correct.subscriptions[0].deliveries[0].offset).toBe(1);
    const right = harness();
    right.commit(enqueued, T + 5);
    right.commit(correct, T + 20);
    expect(right.violations).toEqual([]);

    const inverted = json(state);
    inverted.subscriptions[0].deliveries[0].offset = 0; // the lease went to the low-priority message
    const wrong = harness();
    wrong.commit(enqueued, T + 5);
    wrong.commit(inverted, T + 20);
    expect(wrong.violations).toContain("claim-order");
  });

  it("flags an acked message that comes back (a lost update after a stale overwrite)", () => {
    const h = harness();
    const state = claimedShard();
    const stale = state.clone();
    h.commit(state, T + 20);
    h.acks.add("default/0#1");
    applyOperation(
      state,
      { kind: "ack", subscription: "default", receipts: [{ offset: 0, attempt: 1 }] },
      T + 30,
    );
    h.commit(state, T + 40);
    expect(h.violations).toEqual([]);
    h.commit(stale, T + 50);
    expect(h.violations).toContain("settled-is-final");
    expect(h.violations).toContain("offsets");
  });

  it("flags epochs going back and one epoch with two owners", () => {
    const h = harness();
    const state = claimedShard();
    h.commit(state, T + 20);
    state.broker = { id: "c", address: "c:1", epoch: 2, leaseUntil: T + 20_000 };
    h.commit(state, T + 30);
    state.broker = { id: "b", address: "b:1", epoch: 1, leaseUntil: T + 20_000 };
    h.commit(state, T + 40);
    expect(h.violations).toContain("epoch");
    const twice = harness();
    const other = claimedShard();
    twice.commit(other, T + 20);
    other.broker = { id: "c", address: "c:1", epoch: 1, leaseUntil: T + 20_000 };
    twice.commit(other, T + 30);
    expect(twice.violations).toContain("epoch");
  });

  it("flags a write that does not follow the previous etag, and a document that does not load", () => {
    const violations: string[] = [];
    const history = new CommittedHistory(
      { ackSent: () => false, nackSent: () => false, nackSentAt: () => undefined },
      (invariant) => violations.push(invariant),
    );
    const state = claimedShard();
    history.record("queues/jobs/0.json", state.encode(), '"e1"', { ifAbsent: true }, T);
    history.record("queues/jobs/0.json", state.encode(), '"e2"', { ifMatch: '"e0"' }, T + 1);
    history.record(
      "queues/jobs/0.json",
      payload('{"format":"casq.shard.v1"}'),
      '"e3"',
      { ifMatch: '"e2"' },
      T + 2,
    );
    expect(violations).toEqual(["cas-chain", "decodable"]);
  });
});
