"""Merging of concurrent ``Producer.enqueue`` calls, without I/O: one logic for both producers.

Why: the client's cost of an RPC (HTTP/2, protobuf, a task or thread per
call) is far above the cost of one more message in a request, and the broker
commits a batch in one write; 64 callers awaiting ``enqueue`` at once need a
few requests, not 64.

How (group commit with a leader, no timer): each queue has a lane with at
most ``LANE_FLIGHTS`` requests in flight. A call that finds a free flight
leads: it sends its own message together with every call waiting in the lane
(up to ``max_messages`` / ``max_bytes``), at once, so a lone call goes out as
it would unmerged. A call that finds both flights taken waits in the lane;
when a leader's request is answered it hands its flight to the first call
still waiting, which leads the next request with everything that came
meanwhile. The batch size follows the load, and no call waits more than one
round trip longer than it would alone (the broker writes one commit per
shard at a time; two requests in flight keep it fed: one being written, one
buffered for the next write).

A lane holds either messages that all have a dedup id, or messages that have
neither dedup id nor key (calls with a key and no dedup id are not merged):
see :func:`lane_of`. With dedup ids, a retried or split request, and the
per-message resend, store each message once. Without them, the broker puts
every message of the request on one shard, so the request is stored all or
none, like a single call. A merged request that fails with an error that may
be about one of its messages (``MAY_BE_ONE_MESSAGES_FAULT``; without dedup
ids only those that say nothing was stored, ``NOTHING_STORED_FAULT``) is
resent as one request per message, so that each caller sees the outcome it
would have seen alone; other
failures (outages after the client's retries, a missing queue, auth) reach
every caller of the request. The drivers (casq/aio/producer.py, and the
threaded casq/producer.py generated from it) own the futures and the calls.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import grpc

from casq._messages import Batch
from casq.v1 import message_pb2, queue_service_pb2

# Requests of one queue in flight at once.
LANE_FLIGHTS = 2
# Defaults of the producer's max_batch_messages (the broker's most per Enqueue) and max_batch_bytes.
DEFAULT_BATCH_MESSAGES = 1000
DEFAULT_BATCH_BYTES = 4 * 1024 * 1024

# Codes of a failed Enqueue that may be caused by one of its messages (a bad field,
# a payload over a limit, a batch above the queue's max_batch, a shard too full
# for all of them but not for each), or by the shard of some of them only (a shard
# refused as unreadable, DATA_LOSS; a fault of one shard's write, INTERNAL) while the
# other shards stored their parts: the merged request is resent message by message.
MAY_BE_ONE_MESSAGES_FAULT = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.DATA_LOSS,
        grpc.StatusCode.INTERNAL,
    }
)


# The codes of MAY_BE_ONE_MESSAGES_FAULT that say a request applied on one shard stored
# nothing (INTERNAL does not): after one of these a merged request without dedup ids is
# resent message by message.
NOTHING_STORED_FAULT = MAY_BE_ONE_MESSAGES_FAULT - {grpc.StatusCode.INTERNAL}


def mergeable(message: message_pb2.NewMessage) -> bool:
    """Whether ``message`` may share a merged request: it has a dedup id, or neither dedup id nor key."""
    return bool(message.dedup_id) or not message.key


def lane_of(queue: str, message: message_pb2.NewMessage) -> str:
    """The lane of a mergeable message of ``queue``: one for messages with dedup ids, one for those without."""
    return ("d" if message.dedup_id else "u") + queue


def resendable_faults(calls: list[Call]) -> frozenset[grpc.StatusCode]:
    """The codes after which a merged request of ``calls`` (one lane's) is resent message by message."""
    return MAY_BE_ONE_MESSAGES_FAULT if calls[0].message.dedup_id else NOTHING_STORED_FAULT


class Lead:
    """What a waiting call's future is set to when the flight is handed to it."""


LEAD = Lead()


@dataclass(eq=False)
class Call:
    """One caller's message: its one-message batch (for its result), trace context and future."""

    batch: Batch
    traceparent: str | None
    tracestate: str | None
    future: Any  # the caller's asyncio or concurrent.futures Future
    bytes: int = 0

    @property
    def message(self) -> message_pb2.NewMessage:
        return self.batch.request.messages[0]


def message_bytes(message: message_pb2.NewMessage) -> int:
    """Rough size of a message in a request, for ``max_bytes``."""
    size = 32 + len(message.payload) + len(message.key) + len(message.dedup_id)
    for name, value in message.headers.items():
        size += len(name) + len(value) + 4
    return size


@dataclass
class _Lane:
    waiting: deque[Call] = field(default_factory=deque)
    flights: int = 0


class Lanes:
    """The lanes of one producer. Not thread-safe: the threaded producer calls it under its lock."""

    def __init__(self, max_messages: int = DEFAULT_BATCH_MESSAGES, max_bytes: int = DEFAULT_BATCH_BYTES) -> None:
        if not 1 <= max_messages <= DEFAULT_BATCH_MESSAGES:
            raise ValueError(f"max_batch_messages must be between 1 and {DEFAULT_BATCH_MESSAGES}")
        if max_bytes < 1:
            raise ValueError("max_batch_bytes must be positive")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._lanes: dict[str, _Lane] = {}

    def join(self, lane_name: str, call: Call) -> bool:
        """True: ``call`` leads now (a flight was free); False: it waits in the lane for its outcome or ``LEAD``."""
        call.bytes = message_bytes(call.message)
        lane = self._lanes.setdefault(lane_name, _Lane())
        if lane.flights < LANE_FLIGHTS:
            lane.flights += 1
            return True
        lane.waiting.append(call)
        return False

    def take(self, lane_name: str, leader: Call) -> list[Call]:
        """The calls of the leader's request: the leader, then waiting calls within the limits."""
        lane = self._lanes[lane_name]
        calls, size = [leader], leader.bytes
        while lane.waiting and len(calls) < self.max_messages:
            nxt = lane.waiting[0]
            if size + nxt.bytes > self.max_bytes:
                break
            lane.waiting.popleft()
            if nxt.future.done():  # its caller left (cancelled): not sent
                continue
            calls.append(nxt)
            size += nxt.bytes
        return calls

    def release(self, lane_name: str) -> Call | None:
        """A leader's request is over: the waiting call its flight goes to (set its future to ``LEAD``), or None."""
        lane = self._lanes[lane_name]
        while lane.waiting:
            nxt = lane.waiting.popleft()
            if not nxt.future.done():
                return nxt
        lane.flights -= 1
        if lane.flights == 0:
            del self._lanes[lane_name]
        return None


def merged_request(queue: str, calls: list[Call]) -> tuple[queue_service_pb2.EnqueueRequest, str | None, str | None]:
    """One request for ``calls``, and the trace context of the call.

    Callers with one trace context (the usual case) share it as the call's;
    otherwise each message carries its caller's in ``trace_context`` and the
    call has none.
    """
    first = calls[0]
    same = all(c.traceparent == first.traceparent and c.tracestate == first.tracestate for c in calls)
    request = queue_service_pb2.EnqueueRequest(queue=queue)
    for c in calls:
        message = request.messages.add()
        message.CopyFrom(c.message)
        if not same and c.traceparent and not message.HasField("trace_context"):
            message.trace_context.traceparent = c.traceparent
            message.trace_context.tracestate = c.tracestate or ""
    if same:
        return request, first.traceparent, first.tracestate
    return request, None, None


RESEND_PARALLEL = 16
"""Most requests in flight at once while a refused merged request is resent message by message."""


def resend_lanes(calls: list[Call]) -> list[list[Call]]:
    """The calls of a refused merged request in at most :data:`RESEND_PARALLEL` lanes, resent side by side.

    A lane's calls go one after another; one key's calls are all in one lane,
    in call order (their order in the shard). Unkeyed calls and different keys
    are spread over the lanes, so that one bad message among 1,000 unkeyed ones
    costs ~1,000 / 16 round trips, not 1,000.
    """
    groups: list[list[Call]] = []
    by_key: dict[str, list[Call]] = {}
    for c in calls:
        key = c.message.key
        if key == "":
            groups.append([c])
        elif key in by_key:
            by_key[key].append(c)
        else:
            by_key[key] = [c]
            groups.append(by_key[key])
    lanes: list[list[Call]] = [[] for _ in range(min(RESEND_PARALLEL, len(groups)))]
    for i, group in enumerate(groups):
        lanes[i % len(lanes)].extend(group)
    return lanes


def settle(call: Call, result: Any = None, error: BaseException | None = None) -> None:
    """Gives a waiting call its outcome (unless its caller left)."""
    if call.future.done():
        return
    if error is not None:
        call.future.set_exception(error)
    else:
        call.future.set_result(result)
