/**
 * `FaultInjectingStore` — makes any store slow and unreliable on purpose,
 * reproducibly.
 *
 * Why it exists: casq's promises (nothing acknowledged is ever lost, an
 * ambiguous write is resolved before anyone is told, two brokers cost
 * contention and never correctness) only mean something if they hold while
 * the store misbehaves the way real object stores do. This wrapper injects
 * those misbehaviours in front of a real backend, driven by an injected
 * {@link Random} and {@link Clock}, so the seeded simulation and the tests can
 * replay the exact same run from a seed.
 *
 * Latency: each operation draws a latency from its {@link LatencySpec} and
 * sleeps it on the clock (simulated time under a `ManualClock`). The request
 * "travels" for the first part of the latency (`applyAt`, default half),
 * then the inner store is called (that is when the write becomes visible to
 * other readers), then the response travels for the rest. So, as on a real
 * store, a write can be visible to others before its writer hears back.
 *
 * Faults ({@link FaultKind}), chosen per call by {@link FaultRule}s that match an
 * operation and a key prefix with a probability:
 * - `unavailable`: a 5xx / throttling answer; the request did not happen.
 * - `timeout_before_send`: the request never left (connect timeout); reported
 *   as `unavailable`, did not happen.
 * - `conflict`: an S3 409 on a conditional write; did not happen.
 * - `ambiguous_applied`: the write WAS applied by the inner store, then the
 *   response was lost: `AmbiguousWriteError`. A re-read sees the write. (If
 *   the inner write itself fails, e.g. with 412, the caller still only sees
 *   the ambiguous error, as a real client would; {@link FaultStats} counts
 *   what actually happened.)
 * - `ambiguous_not_applied`: the request was lost in flight:
 *   `AmbiguousWriteError`, and the write did NOT happen.
 * - `ambiguous_late`: the caller hears `AmbiguousWriteError` after the first
 *   part of the latency (its client timed out), while the request is still
 *   on its way: the inner store acts on it after the rest of the latency,
 *   with its condition checked then — so it lands after writes the caller
 *   made meanwhile, or is refused by them (a 412 nobody hears).
 *   {@link FaultStats.landedLate} counts those that landed.
 * - `delay`: no error; the call takes the rule's latency instead of the
 *   normal one (a slow store, a GC pause, a throttled link).
 *
 * Aborting a call while it is in flight behaves like a real client timeout:
 * a read rejects `unavailable`; a write rejects `ambiguous` whether or not the
 * inner store was reached (the caller cannot know which), except under
 * `timeout_before_send`, where nothing was sent and it rejects `unavailable`.
 * A signal already aborted when the call starts rejects `unavailable`.
 *
 * Determinism: all random draws of a call happen synchronously when the call
 * starts, in a fixed order (one draw per matching rule with a positive rate
 * until one fires, then one for the latency unless it is `none` or `fixed`),
 * so a given seed, call sequence and rule history always produce the same
 * faults and latencies.
 *
 * Rules can be added and removed at any time (the simulation flips faults on
 * and off); `stats()` counts calls and injected faults.
 */

import { STORE_OPERATIONS, type StoreOperation } from "../src/store/instrumented-store.ts";
import type {
  CallOptions,
  ListedObject,
  ObjectStore,
  PutCondition,
  PutResult,
  StoredObject,
} from "../src/store/object-store.ts";
import { AmbiguousWriteError, ConflictError, UnavailableError } from "../src/store/store-errors.ts";
import { type Clock, systemClock } from "../src/util/clock.ts";
import { type Random, systemRandom } from "../src/util/random.ts";

/**
 * A latency distribution, in milliseconds:
 * - `none`: 0.
 * - `fixed`: always `ms`.
 * - `uniform`: uniform in [minMs, maxMs).
 * - `exponential`: `minMs` (default 0) plus an exponential tail of mean
 *   `meanMs`, cut at `maxMs` (default 20 x mean) — a cheap stand-in for the
 *   long tail of real store latencies.
 */
export type LatencySpec =
  | { readonly kind: "none" }
  | { readonly kind: "fixed"; readonly ms: number }
  | { readonly kind: "uniform"; readonly minMs: number; readonly maxMs: number }
  | {
      readonly kind: "exponential";
      readonly meanMs: number;
      readonly minMs?: number;
      readonly maxMs?: number;
    };

/** What a {@link FaultRule} injects. See the module header for each kind's meaning. */
export type FaultKind =
  | "unavailable"
  | "timeout_before_send"
  | "conflict"
  | "ambiguous_applied"
  | "ambiguous_not_applied"
  | "ambiguous_late"
  | "delay";

/** Every {@link FaultKind}, in a stable order. */
export const FAULT_KINDS: readonly FaultKind[] = [
  "unavailable",
  "timeout_before_send",
  "conflict",
  "ambiguous_applied",
  "ambiguous_not_applied",
  "ambiguous_late",
  "delay",
];

/** The operations each fault kind can apply to; a rule's `ops` default to these. */
export const FAULT_OPERATIONS: Readonly<Record<FaultKind, readonly StoreOperation[]>> = {
  unavailable: STORE_OPERATIONS,
  timeout_before_send: STORE_OPERATIONS,
  delay: STORE_OPERATIONS,
  conflict: ["put", "delete"],
  ambiguous_applied: ["put", "delete"],
  ambiguous_not_applied: ["put", "delete"],
  ambiguous_late: ["put", "delete"],
};

/** A fault to inject into matching calls with some probability. */
export interface FaultRule {
  /** Name used by `removeRule` and in stats; generated (`rule-1`, ...) when omitted. Must be unique. */
  readonly id?: string;
  /** What to inject. */
  readonly fault: FaultKind;
  /** Probability in [0, 1] that a matching call gets the fault. */
  readonly rate: number;
  /** Operations it applies to; default all that the fault kind supports (see {@link FAULT_OPERATIONS}). */
  readonly ops?: readonly StoreOperation[];
  /** Only keys (list prefixes) starting with this; default `""` (every key). */
  readonly keyPrefix?: string;
  /** Stop after injecting this many faults (e.g. "fail the next 2 puts"); default unlimited. */
  readonly limit?: number;
  /** Latency of a faulted call instead of the operation's normal one (e.g. a 5 s timeout); required for `delay`. */
  readonly latency?: LatencySpec;
}

/** A rule as held by the store: id and defaults filled in. */
export interface ActiveFaultRule {
  readonly id: string;
  readonly fault: FaultKind;
  readonly rate: number;
  readonly ops: readonly StoreOperation[];
  readonly keyPrefix: string;
  readonly limit: number | undefined;
  readonly latency: LatencySpec | undefined;
  /** Faults injected by this rule so far. */
  readonly injected: number;
}

/** One injected fault, as told to `onFault`. */
export interface InjectedFault {
  /** 1-based index of the call among all calls to this store. */
  readonly call: number;
  readonly op: StoreOperation;
  readonly key: string;
  readonly fault: FaultKind;
  readonly ruleId: string;
  /** The latency the call was given, ms. */
  readonly latencyMs: number;
  /** Clock time when the call started. */
  readonly atMs: number;
}

/** Counters of a {@link FaultInjectingStore} since creation or the last `resetStats()`. */
export interface FaultStats {
  /** Calls per operation. */
  readonly calls: Readonly<Record<StoreOperation, number>>;
  /** Injected faults per kind. */
  readonly injected: Readonly<Record<FaultKind, number>>;
  /** Injected faults per rule id (rules removed since keep their count here). */
  readonly byRule: Readonly<Record<string, number>>;
  /** `ambiguous_applied` faults whose inner write succeeded (the write landed, the answer was lost). */
  readonly appliedButLost: number;
  /** `ambiguous_late` faults whose inner write succeeded when it arrived (after its caller gave up on it). */
  readonly landedLate: number;
  /** Sum of all latencies given to calls, ms. */
  readonly totalLatencyMs: number;
}

/** Options of a {@link FaultInjectingStore}. */
export interface FaultInjectingStoreOptions {
  /** Seeded randomness for fault choice and latencies. Default `systemRandom`. */
  readonly random?: Random;
  /** Clock the latencies are slept on. Default `systemClock`. */
  readonly clock?: Clock;
  /** Latency of every operation, or per operation (missing ones: none). Default none. */
  readonly latency?: LatencySpec | Partial<Record<StoreOperation, LatencySpec>>;
  /** Rules installed at construction. */
  readonly rules?: readonly FaultRule[];
  /** Fraction of a call's latency that passes before the inner store is called, in [0, 1]. Default 0.5. */
  readonly applyAt?: number;
  /** Told about every injected fault (e.g. to log it or to compare runs). Must not throw. */
  readonly onFault?: (fault: InjectedFault) => void;
}

interface MutableRule {
  readonly id: string;
  readonly fault: FaultKind;
  readonly rate: number;
  readonly ops: readonly StoreOperation[];
  readonly keyPrefix: string;
  readonly limit: number | undefined;
  readonly latency: LatencySpec | undefined;
  injected: number;
}

/** The fault and latency decided for one call. */
interface Plan {
  readonly call: number;
  readonly rule: MutableRule | undefined;
  readonly latencyMs: number;
}

/** An {@link ObjectStore} wrapper that injects latency and faults. See the module header. */
export class FaultInjectingStore implements ObjectStore {
  /** `fault-injecting(<inner description>)`, so logs show faults are on. */
  readonly description: string;
  private readonly random: Random;
  private readonly clock: Clock;
  private readonly applyAt: number;
  private readonly onFault: ((fault: InjectedFault) => void) | undefined;
  private readonly latencies = new Map<StoreOperation, LatencySpec>();
  private activeRules: MutableRule[] = [];
  private nextRuleId = 1;
  private callCount = 0;
  private counters = emptyCounters();

  constructor(
    private readonly inner: ObjectStore,
    options: FaultInjectingStoreOptions = {},
  ) {
    this.description = `fault-injecting(${inner.description})`;
    this.random = options.random ?? systemRandom;
    this.clock = options.clock ?? systemClock;
    this.applyAt = options.applyAt ?? 0.5;
    if (!(this.applyAt >= 0 && this.applyAt <= 1))
      throw new RangeError(`applyAt must be within [0, 1], got ${this.applyAt}`);
    this.onFault = options.onFault;
    if (options.latency !== undefined) this.setLatency(options.latency);
    for (const rule of options.rules ?? []) this.addRule(rule);
  }

  /**
   * Sets the latency of every operation (a single spec) or of the operations
   * named in a per-operation record (others keep theirs).
   */
  setLatency(latency: LatencySpec | Partial<Record<StoreOperation, LatencySpec>>): void {
    if ("kind" in latency) {
      validateLatency(latency as LatencySpec);
      for (const op of STORE_OPERATIONS) this.latencies.set(op, latency as LatencySpec);
      return;
    }
    for (const op of STORE_OPERATIONS) {
      const spec = (latency as Partial<Record<StoreOperation, LatencySpec>>)[op];
      if (spec === undefined) continue;
      validateLatency(spec);
      this.latencies.set(op, spec);
    }
  }

  /** Adds a rule (checked after the rules added before it) and returns its id. Throws `RangeError` on a bad rule. */
  addRule(rule: FaultRule): string {
    if (!FAULT_KINDS.includes(rule.fault)) throw new RangeError(`unknown fault kind ${String(rule.fault)}`);
    if (!(rule.rate >= 0 && rule.rate <= 1))
      throw new RangeError(`fault rule rate must be within [0, 1], got ${rule.rate}`);
    const supported = FAULT_OPERATIONS[rule.fault];
    const ops = rule.ops ?? supported;
    for (const op of ops)
      if (!supported.includes(op))
        throw new RangeError(`fault ${rule.fault} cannot apply to ${op} (only ${supported.join(", ")})`);
    if (rule.limit !== undefined && !(Number.isInteger(rule.limit) && rule.limit >= 0))
      throw new RangeError(`fault rule limit must be an integer >= 0, got ${rule.limit}`);
    if (rule.fault === "delay" && rule.latency === undefined)
      throw new RangeError(`a "delay" fault rule needs a latency`);
    if (rule.latency !== undefined) validateLatency(rule.latency);
    const id = rule.id ?? this.generateId();
    if (this.activeRules.some((r) => r.id === id)) throw new RangeError(`a fault rule with id ${id} exists`);
    this.activeRules.push({
      id,
      fault: rule.fault,
      rate: rule.rate,
      ops: [...ops],
      keyPrefix: rule.keyPrefix ?? "",
      limit: rule.limit,
      latency: rule.latency,
      injected: 0,
    });
    return id;
  }

  /** Removes a rule; returns whether it existed. Calls already in flight keep their planned fault. */
  removeRule(id: string): boolean {
    const before = this.activeRules.length;
    this.activeRules = this.activeRules.filter((r) => r.id !== id);
    return this.activeRules.length !== before;
  }

  /** Removes every rule (latencies stay). */
  clearRules(): void {
    this.activeRules = [];
  }

  /** The rules in force, in the order they are checked. */
  rules(): ActiveFaultRule[] {
    return this.activeRules.map((r) => ({ ...r, ops: [...r.ops] }));
  }

  /** A snapshot of the counters. */
  stats(): FaultStats {
    const c = this.counters;
    return {
      calls: { ...c.calls },
      injected: { ...c.injected },
      byRule: { ...c.byRule },
      appliedButLost: c.appliedButLost,
      landedLate: c.landedLate,
      totalLatencyMs: c.totalLatencyMs,
    };
  }

  /** Zeroes the counters (rules keep their `limit` progress). */
  resetStats(): void {
    this.counters = emptyCounters();
  }

  /** Reads through the inner store, possibly slowly or failing. */
  async get(key: string, options?: CallOptions): Promise<StoredObject | undefined> {
    return this.execute("get", key, options, () => this.inner.get(key, options));
  }

  /** Writes through the inner store, possibly slowly, failing, or ambiguously. */
  async put(
    key: string,
    body: Uint8Array,
    condition: PutCondition,
    options?: CallOptions,
  ): Promise<PutResult> {
    return this.execute("put", key, options, () => this.inner.put(key, body, condition, options));
  }

  /** Deletes through the inner store, possibly slowly, failing, or ambiguously. */
  async delete(key: string, options?: CallOptions & { readonly ifMatch?: string }): Promise<void> {
    return this.execute("delete", key, options, () => this.inner.delete(key, options));
  }

  /** Lists through the inner store, possibly slowly or failing. */
  async list(prefix: string, options?: CallOptions): Promise<ListedObject[]> {
    return this.execute("list", prefix, options, () => this.inner.list(prefix, options));
  }

  /** Closes the inner store. */
  close(): Promise<void> {
    return this.inner.close();
  }

  private generateId(): string {
    for (;;) {
      const id = `rule-${this.nextRuleId++}`;
      if (!this.activeRules.some((r) => r.id === id)) return id;
    }
  }

  /** Decides, synchronously and in a fixed draw order, the fault and latency of a call. */
  private plan(op: StoreOperation, key: string): Plan {
    const call = ++this.callCount;
    this.counters.calls[op]++;
    let chosen: MutableRule | undefined;
    for (const rule of this.activeRules) {
      if (!rule.ops.includes(op) || !key.startsWith(rule.keyPrefix)) continue;
      if (rule.limit !== undefined && rule.injected >= rule.limit) continue;
      if (rule.rate <= 0) continue;
      if (this.random.next() < rule.rate) {
        chosen = rule;
        break;
      }
    }
    const spec = chosen?.latency ?? this.latencies.get(op) ?? NO_LATENCY;
    const latencyMs = drawLatency(spec, this.random);
    this.counters.totalLatencyMs += latencyMs;
    if (chosen) {
      chosen.injected++;
      this.counters.injected[chosen.fault]++;
      this.counters.byRule[chosen.id] = (this.counters.byRule[chosen.id] ?? 0) + 1;
      this.onFault?.({
        call,
        op,
        key,
        fault: chosen.fault,
        ruleId: chosen.id,
        latencyMs,
        atMs: this.clock.now(),
      });
    }
    return { call, rule: chosen, latencyMs };
  }

  private async execute<T>(
    op: StoreOperation,
    key: string,
    options: CallOptions | undefined,
    call: () => Promise<T>,
  ): Promise<T> {
    const { rule, latencyMs } = this.plan(op, key);
    const fault = rule?.fault;
    const isWrite = op === "put" || op === "delete";
    const signal = options?.signal;
    const before = latencyMs * this.applyAt;
    const after = latencyMs - before;
    const lostInFlight = (detail: string): never => {
      if (isWrite) throw new AmbiguousWriteError(key, detail);
      throw new UnavailableError(key, detail);
    };

    if (signal?.aborted) throw new UnavailableError(key, "the call was aborted before it started");

    // The request travels.
    if (fault === "timeout_before_send") {
      await this.wait(latencyMs, signal, () => new UnavailableError(key, "aborted while connecting"));
      throw new UnavailableError(key, "injected fault: timed out before the request was sent");
    }
    await this.wait(before, signal, () => lostInFlight("aborted while the request was in flight"));

    // The store acts (or refuses).
    let result: T | undefined;
    let innerError: unknown;
    let innerFailed = false;
    switch (fault) {
      case "unavailable":
        await this.wait(after, signal, () => lostInFlight("aborted while waiting for the answer"));
        throw new UnavailableError(key, "injected fault: 503 service unavailable");
      case "conflict":
        await this.wait(after, signal, () => lostInFlight("aborted while waiting for the answer"));
        throw new ConflictError(key, "injected fault: 409 conditional request conflict");
      case "ambiguous_not_applied":
        await this.wait(after, signal, () => lostInFlight("aborted after the request was lost"));
        throw new AmbiguousWriteError(key, "injected fault: request lost in flight (it was NOT applied)");
      case "ambiguous_late":
        // Sent: no abort reaches it now. It arrives after the rest of the latency.
        void this.clock
          .sleep(after)
          .then(call)
          .then(
            () => {
              this.counters.landedLate++;
            },
            () => {},
          );
        throw new AmbiguousWriteError(
          key,
          "injected fault: no answer; the request is still in flight and may land later",
        );
      default:
        try {
          result = await call();
        } catch (error) {
          innerFailed = true;
          innerError = error;
        }
    }

    // The response travels.
    if (fault === "ambiguous_applied") {
      if (!innerFailed) this.counters.appliedButLost++;
      await this.wait(after, signal, () => undefined);
      throw new AmbiguousWriteError(
        key,
        "injected fault: response lost after the request was sent (it was applied)",
        innerFailed ? { cause: innerError } : undefined,
      );
    }
    await this.wait(after, signal, () =>
      lostInFlight(
        innerFailed ? "aborted while the response was in flight" : "aborted after the write landed",
      ),
    );
    if (innerFailed) throw innerError;
    return result as T;
  }

  /**
   * Sleeps `ms` on the clock (skipped when <= 0). If the signal aborts during the sleep, throws
   * what `onAbort` returns, or returns quietly when it returns `undefined`.
   */
  private async wait(
    ms: number,
    signal: AbortSignal | undefined,
    onAbort: () => Error | undefined,
  ): Promise<void> {
    // No time passes, so nothing can be lost in transit: an abort now is noticed by the caller itself.
    if (ms <= 0) return;
    try {
      await this.clock.sleep(ms, signal);
    } catch (reason) {
      const error = onAbort();
      if (error) throw error;
      if (!signal?.aborted) throw reason;
    }
  }
}

const NO_LATENCY: LatencySpec = { kind: "none" };

/** Draws one latency in ms from `spec`; uses one `random` value unless the spec is `none` or `fixed`. */
export function drawLatency(spec: LatencySpec, random: Random): number {
  switch (spec.kind) {
    case "none":
      return 0;
    case "fixed":
      return spec.ms;
    case "uniform":
      return spec.minMs + random.next() * (spec.maxMs - spec.minMs);
    case "exponential": {
      const min = spec.minMs ?? 0;
      const max = spec.maxMs ?? min + 20 * spec.meanMs;
      // 1 - u is in (0, 1], so the log is finite.
      const tail = -Math.log(1 - random.next()) * spec.meanMs;
      return Math.min(max, min + tail);
    }
  }
}

function validateLatency(spec: LatencySpec): void {
  const ok = (n: number | undefined) => n === undefined || (Number.isFinite(n) && n >= 0);
  switch (spec.kind) {
    case "none":
      return;
    case "fixed":
      if (!ok(spec.ms)) throw new RangeError(`fixed latency must be a finite ms >= 0, got ${spec.ms}`);
      return;
    case "uniform":
      if (!ok(spec.minMs) || !ok(spec.maxMs) || spec.maxMs < spec.minMs)
        throw new RangeError(`uniform latency needs 0 <= minMs <= maxMs, got ${spec.minMs}..${spec.maxMs}`);
      return;
    case "exponential":
      if (!ok(spec.meanMs) || !ok(spec.minMs) || !ok(spec.maxMs))
        throw new RangeError("exponential latency needs finite meanMs, minMs, maxMs >= 0");
      if (spec.maxMs !== undefined && spec.maxMs < (spec.minMs ?? 0))
        throw new RangeError(
          `exponential latency needs maxMs >= minMs, got ${spec.maxMs} < ${spec.minMs ?? 0}`,
        );
      return;
    default:
      throw new RangeError(`unknown latency kind ${String((spec as { kind: unknown }).kind)}`);
  }
}

interface Counters {
  calls: Record<StoreOperation, number>;
  injected: Record<FaultKind, number>;
  byRule: Record<string, number>;
  appliedButLost: number;
  landedLate: number;
  totalLatencyMs: number;
}

function emptyCounters(): Counters {
  return {
    calls: { get: 0, put: 0, delete: 0, list: 0 },
    injected: {
      unavailable: 0,
      timeout_before_send: 0,
      conflict: 0,
      ambiguous_applied: 0,
      ambiguous_not_applied: 0,
      ambiguous_late: 0,
      delay: 0,
    },
    byRule: {},
    appliedButLost: 0,
    landedLate: 0,
    totalLatencyMs: 0,
  };
}
