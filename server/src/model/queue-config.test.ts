import { describe, expect, it } from "vitest";
import { expectCasqError } from "../../testing/model-test-helpers.ts";
import { isCasqError } from "../errors.ts";
import { DEFAULT_QUEUE_CONFIG, mergeConfig, sameConfig, validateConfigPatch } from "./queue-config.ts";

describe("queue config", () => {
  it("has the documented defaults", () => {
    expect(DEFAULT_QUEUE_CONFIG).toMatchObject({
      leaseTtlMs: 60_000,
      maxAttempts: 5,
      backoff: { initialMs: 1000, multiplier: 2, maxMs: 300_000, jitter: 0.2 },
      dedupWindowMs: 300_000,
      retentionMs: 0,
      maxPayloadBytes: 1024 * 1024,
      maxDocumentBytes: 64 * 1024 * 1024,
      maxBatch: 1000,
      deadLetterLimit: 10_000,
    });
    expect(Object.isFrozen(DEFAULT_QUEUE_CONFIG)).toBe(true);
  });

  it("accepts valid patches, including a partial backoff", () => {
    expect(() => validateConfigPatch({ leaseTtlMs: 30_000, backoff: { jitter: 0 } })).not.toThrow();
    const merged = mergeConfig(DEFAULT_QUEUE_CONFIG, { maxAttempts: 3, backoff: { initialMs: 10 } });
    expect(merged.maxAttempts).toBe(3);
    expect(merged.backoff).toEqual({ initialMs: 10, multiplier: 2, maxMs: 300_000, jitter: 0.2 });
    expect(DEFAULT_QUEUE_CONFIG.maxAttempts).toBe(5);
  });

  it("ignores undefined fields", () => {
    expect(mergeConfig(DEFAULT_QUEUE_CONFIG, { maxAttempts: undefined })).toEqual(DEFAULT_QUEUE_CONFIG);
  });

  it.each([
    [{ leaseTtlMs: 0 }, "lease_ttl_ms"],
    [{ leaseTtlMs: 1.5 }, "lease_ttl_ms"],
    [{ maxAttempts: "3" }, "max_attempts"],
    [{ maxBatch: -1 }, "max_batch"],
    [{ backoff: { jitter: 2 } }, "backoff.jitter"],
    [{ backoff: { multiplier: 0.5 } }, "backoff.multiplier"],
    [{ backoff: { bogus: 1 } }, "backoff.bogus"],
    [{ backoff: 5 }, "backoff"],
    [{ nonsense: 1 }, "unknown config field nonsense"],
    [{ retentionMs: Number.NaN }, "retention_ms"],
  ])("rejects %j naming the field", (patch, field) => {
    const message = expectCasqError(() => validateConfigPatch(patch), "invalid_argument");
    expect(message).toContain(field);
  });

  it("rejects a non-object patch", () => {
    expectCasqError(() => validateConfigPatch(null), "invalid_argument");
    expectCasqError(() => validateConfigPatch([1]), "invalid_argument");
  });

  it("checks cross-field rules on merge", () => {
    const m1 = expectCasqError(
      () => mergeConfig(DEFAULT_QUEUE_CONFIG, { maxDocumentBytes: 100_000, maxPayloadBytes: 200_000 }),
      "invalid_argument",
    );
    expect(m1).toContain("max_payload_bytes");
    const m2 = expectCasqError(
      () => mergeConfig(DEFAULT_QUEUE_CONFIG, { backoff: { initialMs: 10_000, maxMs: 5_000 } }),
      "invalid_argument",
    );
    expect(m2).toContain("initial_ms");
  });

  it("compares configs by value", () => {
    expect(sameConfig(DEFAULT_QUEUE_CONFIG, mergeConfig(DEFAULT_QUEUE_CONFIG, {}))).toBe(true);
    expect(
      sameConfig(DEFAULT_QUEUE_CONFIG, mergeConfig(DEFAULT_QUEUE_CONFIG, { backoff: { jitter: 0 } })),
    ).toBe(false);
  });

  it("throws CasqError, never TypeError", () => {
    try {
      validateConfigPatch({ backoff: null });
    } catch (error) {
      expect(isCasqError(error, "invalid_argument")).toBe(true);
    }
  });
});
