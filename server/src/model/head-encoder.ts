/**
 * The v2 head encoder (`"format": "casq.shard.v2"`): everything mutable about
 * a shard, and nothing that grows with its backlog of sealed messages.
 *
 * Compared with v1 the head replaces the full message list by the *tail*
 * (messages not yet sealed, and every redriven message, whose `targets` may
 * still change) and an index of sealed *segments* (`segments`), and writes
 * each subscription's settled offsets above `acked_below` as inclusive
 * ranges. Canonical like v1: the same state gives the same bytes.
 *
 * Cost: O(head) — subscriptions with their live deliveries and settled
 * ranges, the head's own dedup ids (already in offset order: no sort), the
 * head's own dead letters, the tail and one cached entry per segment the
 * head lists itself, index segment, dedup segment and dead-letter segment.
 * Sealed messages, dedup ids and dead letters are not touched.
 *
 * Most of a busy head is lists that change little between two commits: the
 * tail's messages (an enqueue adds a few at the end, a seal takes many from
 * the front), the head's dedup ids (likewise), the segment index (a claim
 * or ack changes one entry), each subscription's deliveries (a commit
 * claims, settles or heartbeats a few of up to a thousand). Each encode
 * copies their bytes from the last encode's output but for the entries that
 * changed (`spliced-list.ts`), and writes every part straight into one
 * buffer of the head's size (`byte-pieces.ts`): a commit makes one
 * head-sized allocation, not several head-sized strings and buffers of
 * garbage.
 */
import { BytePieces } from "./byte-pieces.ts";
import { SHARD_FORMAT } from "./document-formats.ts";
import { segmentsListedByHead } from "./index-segments.ts";
import {
  cachedDeliveryJson,
  configJson,
  deadLettersJson,
  dedupEntryJson,
  deliveryOffsets,
  headerJson,
  rangesJson,
  segmentJson,
  subscriptionCountersJson,
  writeMessageJson,
} from "./record-encoder.ts";
import { requireBody } from "./segment-mechanics.ts";
import type { ShardData } from "./shard-data.ts";
import { compactAckState } from "./shard-mechanics.ts";
import type {
  DeadLetterSegmentState,
  DedupEntry,
  DedupSegmentState,
  Delivery,
  IndexSegmentState,
  MessageRecord,
  RetainedMessage,
  SegmentState,
  SubscriptionState,
} from "./shard-records.ts";
import { SplicedList } from "./spliced-list.ts";

const json = JSON.stringify;

/**
 * Writes a subscription's entry. Its deliveries (as many as its workers hold
 * leases: a worker's credit window keeps up to a thousand live) are copied
 * from the last encode but for those that changed since; returns their list,
 * to be remembered once the whole head is made.
 */
function writeSubscription(
  out: BytePieces,
  state: ShardData,
  sub: SubscriptionState,
  lists: HeadLists,
): SplicedList<number> {
  compactAckState(state, sub);
  const acked = [...sub.settled].sort((a, b) => a - b);
  out.text(
    `{"name":${json(sub.name)},"created_at":${sub.createdAt},"acked_below":${sub.start},"acked":${rangesJson(acked)},"deliveries":[`,
  );
  const deliveries = deliveryListOf(lists, sub);
  deliveries.write(out, deliveryOffsets(sub));
  let sealed = "";
  if (sub.deadSegments.size > 0) {
    const refs: string[] = [];
    for (const seg of sub.deadSegments.values()) refs.push(deadLetterSegmentJson(seg));
    sealed = `,"dead_letter_segments":[${refs.join(",")}]`;
  }
  out.text(
    `],"dead_letters":${deadLettersJson(sub.headDead.values())}${sealed},"counters":{${subscriptionCountersJson(sub.counters)}}}`,
  );
  return deliveries;
}

/** The spliced deliveries list of `sub` (one per subscription object: a re-created subscription starts afresh). */
function deliveryListOf(lists: HeadLists, sub: SubscriptionState): SplicedList<number> {
  let list = lists.deliveries.get(sub);
  if (list === undefined) {
    const live = (offset: number) => sub.deliveries.get(offset) as Delivery;
    list = new SplicedList<number>({
      // A delivery changes in place: its cached JSON is a new string then.
      keyOf: live,
      secondKeyOf: (offset) => cachedDeliveryJson(offset, live(offset)),
      offsetOf: (offset) => offset,
      writeJson: (out, offset) => out.text(cachedDeliveryJson(offset, live(offset))),
    });
    lists.deliveries.set(sub, list);
  }
  return list;
}

/** The head's index entry of a dead-letter segment (cached until its `gone` set changes). */
function deadLetterSegmentJson(seg: DeadLetterSegmentState): string {
  if (seg.json !== undefined) return seg.json;
  const gone = [...seg.gone].sort((a, b) => a - b);
  seg.json = `{"name":${json(seg.name)},"first":${seg.first},"last":${seg.last},"count":${seg.count},"bytes":${seg.bytes},"sha256":"${seg.sha256}","created_at":${seg.createdAt},"gone":${rangesJson(gone)}}`;
  return seg.json;
}

/** The head's entry of an index segment (immutable, so cached). */
function indexSegmentJson(idx: IndexSegmentState): string {
  idx.json ??= `{"name":${json(idx.name)},"first":${idx.first},"last":${idx.last},"count":${idx.segments.length},"bytes":${idx.bytes},"sha256":"${idx.sha256}","created_at":${idx.createdAt}}`;
  return idx.json;
}

/** The head's index entry of a dedup segment (immutable, so cached). */
function dedupSegmentJson(seg: DedupSegmentState): string {
  seg.json ??= `{"name":${json(seg.name)},"first":${seg.first},"last":${seg.last},"count":${seg.count},"bytes":${seg.bytes},"sha256":"${seg.sha256}","created_at":${seg.createdAt},"expires_at":${seg.expiresAt}}`;
  return seg.json;
}

/** The lists of a head that each encode copies from the last one (see `spliced-list.ts`). */
interface HeadLists {
  readonly dedup: SplicedList<DedupEntry>;
  readonly dedupSegments: SplicedList<DedupSegmentState>;
  readonly segments: SplicedList<SegmentState>;
  readonly tail: SplicedList<RetainedMessage>;
  /** Each subscription's deliveries. */
  readonly deliveries: WeakMap<SubscriptionState, SplicedList<number>>;
}

const headLists = new WeakMap<ShardData, HeadLists>();

function listsOf(state: ShardData): HeadLists {
  let lists = headLists.get(state);
  if (lists === undefined) {
    lists = {
      // Entries only ever join the head's dedup list at its end (dedup-segments.ts), in offset order.
      dedup: new SplicedList<DedupEntry>({
        keyOf: (e) => e,
        secondKeyOf: () => undefined,
        offsetOf: (e) => e.offset,
        writeJson: (out, e) => out.text(dedupEntryJson(e)),
      }),
      dedupSegments: new SplicedList<DedupSegmentState>({
        keyOf: (seg) => seg,
        secondKeyOf: () => undefined,
        offsetOf: (seg) => seg.first,
        writeJson: (out, seg) => out.text(dedupSegmentJson(seg)),
      }),
      // An entry changes with its `gone` set, which makes a new `json` string.
      segments: new SplicedList<SegmentState>({
        keyOf: (seg) => seg,
        secondKeyOf: segmentJson,
        offsetOf: (seg) => seg.first,
        writeJson: (out, seg) => out.text(segmentJson(seg)),
      }),
      // A redriven message's `targets` are replaced (never changed in place) as it settles.
      tail: new SplicedList<RetainedMessage>({
        keyOf: (m) => m.msg,
        secondKeyOf: (m) => m.targets,
        offsetOf: (m) => m.msg.offset,
        writeJson: (out, m) => writeMessageJson(out, requireBody(m.msg), m.targets), // the tail holds whole records
      }),
      deliveries: new WeakMap(),
    };
    headLists.set(state, lists);
  }
  return lists;
}

/**
 * The JSON bytes of tail message `m` (without `targets`) in the last head
 * encoded for `state`, or undefined when that head did not hold it so: a
 * segment sealing the tail copies them rather than encoding every message
 * (most of it, the payload's base64) a second time.
 */
export function encodedTailMessage(state: ShardData, m: MessageRecord): Uint8Array | undefined {
  return headLists.get(state)?.tail.remembered(m, undefined, m.offset);
}

/** The JSON bytes of dedup entry `e` in the last head encoded for `state` (see {@link encodedTailMessage}). */
export function encodedDedupEntry(state: ShardData, e: DedupEntry): Uint8Array | undefined {
  return headLists.get(state)?.dedup.remembered(e, undefined, e.offset);
}

/**
 * The canonical v2 head bytes of a shard. O(head), and one allocation of
 * head size: the parts are written straight into the output, and the lists
 * that make up most of a head (the tail's messages, the dedup ids, the
 * segment indexes) are copied from the last encode's output but for the
 * entries that changed since (`spliced-list.ts`).
 */
export function encodeHead(state: ShardData): Uint8Array {
  const c = state.counters;
  const lists = listsOf(state);
  const out = new BytePieces();
  out.text(headerJson(state, SHARD_FORMAT));
  out.text(`,"next_offset":${state.nextOffset},"config":${configJson(state.config)}`);
  out.text(`,"counters":{${subscriptionCountersJson(c)},"dropped":${c.dropped}}`);
  out.text(`,"subscriptions":[`);
  const deliveryLists: SplicedList<number>[] = [];
  state.subscriptionNames().forEach((name, i) => {
    const sub = state.subs.get(name);
    if (sub === undefined) return;
    if (i > 0) out.text(",");
    deliveryLists.push(writeSubscription(out, state, sub, lists));
  });
  out.text(`],"dedup":[`);
  lists.dedup.write(out, state.recentDedup.values());
  out.text("]");
  // Written (and remembered) when empty too, so that it holds no bytes of an old head.
  if (state.dedupSegments.size > 0) out.text(`,"dedup_segments":[`);
  lists.dedupSegments.write(out, state.dedupSegments.values());
  if (state.dedupSegments.size > 0) out.text("]");
  if (state.indexSegments.size > 0) {
    const entries: string[] = [];
    for (const idx of state.indexSegments.values()) entries.push(indexSegmentJson(idx));
    out.text(`,"index_segments":[${entries.join(",")}]`);
  }
  out.text(`,"segments":[`);
  lists.segments.write(out, segmentsListedByHead(state));
  out.text(`],"messages":[`);
  lists.tail.write(out, state.sortedTail());
  out.text("]}");
  const bytes = out.toBytes();
  // Only now, with the whole head made: the next encode copies from these bytes.
  lists.dedup.remember(bytes);
  lists.dedupSegments.remember(bytes);
  lists.segments.remember(bytes);
  lists.tail.remember(bytes);
  for (const deliveries of deliveryLists) deliveries.remember(bytes);
  return bytes;
}
