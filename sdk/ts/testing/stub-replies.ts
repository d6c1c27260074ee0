import type { MessageInitShape } from "@bufbuild/protobuf";
import type { WorkResponseSchema } from "@casq/api/casq/v1/work_pb.ts";

/**
 * A stub broker's `opened` answer on queue "q": stream number `stream` of the
 * broker leading `shard`, with a 30 s lease, the given heartbeat interval and
 * the routing of `leaders` (addresses by shard).
 */
export function openedReply(
  requestId: bigint,
  shard: number,
  stream: number,
  leaders: readonly string[],
  heartbeatSeconds: bigint,
): MessageInitShape<typeof WorkResponseSchema> {
  return {
    requestId,
    event: {
      case: "opened",
      value: {
        sessionId: `s-${shard}-${stream}`,
        brokerId: `broker-${shard}`,
        queue: "q",
        leaseTtl: { seconds: 30n },
        heartbeatInterval: { seconds: heartbeatSeconds },
        maxCredits: 1000,
        routing: {
          servingShards: [shard],
          shards: leaders.map((address, s) => ({ shard: s, leader: { brokerId: `broker-${s}`, address } })),
        },
      },
    },
  };
}
