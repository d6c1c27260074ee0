/**
 * The format version strings of casq's stored documents, which every encoder
 * writes and every parser checks first. See `docs/document-format.md`.
 *
 * Compatibility rule: a newer format gets a new version string, and an older
 * casq refuses it instead of downgrading it.
 */

/** The format version this casq writes. */
export const SHARD_FORMAT = "casq.shard.v2";

/** The older format this casq still reads (and upgrades to v2 with its first write). */
export const SHARD_FORMAT_V1 = "casq.shard.v1";

/** The format of a segment object. */
export const SEGMENT_FORMAT = "casq.segment.v1";

/** The format of a dedup segment object. */
export const DEDUP_SEGMENT_FORMAT = "casq.dedup.v1";

/** The format of a dead-letter segment object. */
export const DEAD_LETTER_SEGMENT_FORMAT = "casq.deadletters.v1";

/** The format of an index segment object (index entries of sealed segments). */
export const INDEX_SEGMENT_FORMAT = "casq.segindex.v1";
