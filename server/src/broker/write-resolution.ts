/**
 * Did a write land? After a lost race or an ambiguous write (a PUT whose
 * answer was lost: it may or may not have landed) the leader re-reads the
 * document and looks for the ids of its own attempts in the document's write
 * chain: `recent_write_ids` (oldest first) followed by `write_id`.
 *
 * - An attempt id in the chain: that attempt landed — its results are the
 *   truth, even when other brokers wrote on top of it since.
 * - Otherwise an ambiguous attempt did not land if the chain still shows what
 *   came after the version it was based on: CAS lets exactly one write follow
 *   a version, and that one was not ours. (Lost races — 412 / 409 — never
 *   landed.)
 * - An ambiguous attempt whose base version has left the history (more than
 *   `WRITE_HISTORY` writes since) cannot be decided: the caller must be told
 *   the outcome is unknown, and the batch must not be applied again.
 */

/** One CAS attempt of a batch. */
export interface WriteAttempt<T> {
  /** What the attempt would have answered, had it landed. */
  readonly value: T;
  /** `write_id` of the version the attempt was based on (undefined: creating the document, or a version without one). */
  readonly basedOn: string | undefined;
  /** True when the store could not say whether it landed. */
  readonly ambiguous: boolean;
}

/** The verdict on a batch's attempts. */
export type WriteVerdict<T> =
  | { readonly kind: "landed"; readonly value: T }
  | { readonly kind: "not_landed" }
  | { readonly kind: "unknown" };

/**
 * Decides a batch's attempts (keyed by write id) against the re-read
 * document's chain of write ids (oldest first, latest last). `complete` says
 * the chain reaches back to the document's first write (its history was
 * never truncated).
 */
export function resolveWrites<T>(
  chain: readonly string[],
  complete: boolean,
  attempts: ReadonlyMap<string, WriteAttempt<T>>,
): WriteVerdict<T> {
  for (const id of chain) {
    const attempt = attempts.get(id);
    if (attempt) return { kind: "landed", value: attempt.value };
  }
  for (const attempt of attempts.values()) {
    if (!attempt.ambiguous) continue;
    // What followed the attempt's base version is known if the base is in the chain
    // (or, for a first write, if the chain goes back to the document's creation).
    const decided = attempt.basedOn === undefined ? complete : chain.includes(attempt.basedOn);
    if (!decided) return { kind: "unknown" };
  }
  return { kind: "not_landed" };
}
