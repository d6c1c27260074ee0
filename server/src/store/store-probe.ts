/**
 * Is the store usable? One cheap request answers it: a get of a key that
 * never needs to exist (a missing key is a perfectly good answer; only a
 * failure counts). `casq serve` probes once before it listens, and the
 * health monitor probes every few seconds while it runs.
 *
 * A failure is *permanent* when it is a {@link StoreMisconfiguredError}: no
 * or wrong credentials, access denied, a missing bucket, a store directory
 * that cannot be created or written. Those fail every request the same way
 * until an operator changes the configuration. Anything else (connection
 * refused, 5xx, a timeout) may pass by itself.
 */

import type { ObjectStore } from "./object-store.ts";
import { openStore } from "./open-store.ts";
import { misconfiguredCause } from "./store-errors.ts";

/** The key probed in the store; it never needs to exist. */
export const STORE_PROBE_KEY = "casq-health-probe";

/** The outcome of one probe. */
export type StoreProbe =
  | { readonly ok: true }
  | {
      readonly ok: false;
      /** True when retrying cannot help (see the module header). */
      readonly permanent: boolean;
      /** What failed, in one line. */
      readonly reason: string;
      /** The error as raised. */
      readonly error: unknown;
    };

/** Probes `store` once (see the module header). Never rejects. */
export async function probeStore(store: ObjectStore, signal?: AbortSignal): Promise<StoreProbe> {
  try {
    await store.get(STORE_PROBE_KEY, signal ? { signal } : undefined);
    return { ok: true };
  } catch (error) {
    return failed(error);
  }
}

/** Default bound on the startup probe: longer than one S3 connect timeout (5 s). */
export const STARTUP_PROBE_TIMEOUT_MS = 10_000;

/**
 * Opens the store a URL names, probes it once (at most `timeoutMs`), and
 * closes it again. A store that cannot even be opened (e.g. a `file:`
 * directory that cannot be created) is a failed probe, not an exception.
 * A probe that runs out of time is not permanent: the store may be slow.
 */
export async function probeStoreUrl(url: string, timeoutMs = STARTUP_PROBE_TIMEOUT_MS): Promise<StoreProbe> {
  let store: ObjectStore;
  try {
    store = openStore(url);
  } catch (error) {
    return failed(error);
  }
  try {
    return await probeStore(store, AbortSignal.timeout(timeoutMs));
  } finally {
    await store.close().catch(() => {});
  }
}

function failed(error: unknown): StoreProbe {
  const misconfigured = misconfiguredCause(error);
  const reason = (misconfigured ?? (error instanceof Error ? error : undefined))?.message ?? String(error);
  return { ok: false, permanent: misconfigured !== undefined, reason, error };
}
