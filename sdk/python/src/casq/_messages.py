"""Building NewMessage protos from Python values."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import grpc
from google.protobuf.duration_pb2 import Duration

from casq.errors import BatchRedirectError, CasqError
from casq.v1 import message_pb2, queue_service_pb2

# How many times one enqueue_batch splits a batch the broker answered with a
# BatchRedirect (a sub-batch split again counts as one more). Leadership that
# moves while a split is under way needs one more split, rarely two; more
# means it keeps moving, and failing tells the caller instead of looping.
MAX_BATCH_SPLITS = 3

Payload = bytes | str


@dataclass(frozen=True)
class EnqueueResult:
    """A stored message: its id, shard, offset, and whether the dedup id had been seen."""

    id: str
    shard: int
    offset: int
    duplicate: bool


@dataclass
class NewMessage:
    """One message of an ``enqueue_batch``."""

    payload: Payload
    key: str | None = None
    priority: int = 0
    delay: float | datetime.timedelta | None = None
    headers: Mapping[str, str] | None = field(default=None)
    max_attempts: int | None = None
    dedup_id: str | None = None


def to_duration(value: float | datetime.timedelta) -> Duration:
    seconds = value.total_seconds() if isinstance(value, datetime.timedelta) else float(value)
    duration = Duration()
    duration.FromNanoseconds(int(seconds * 1e9))
    return duration


def build_message(message: NewMessage, dedup_id: str | None = None) -> message_pb2.NewMessage:
    """The proto of ``message``; ``dedup_id`` is used when the message has none of its own."""
    payload = message.payload.encode() if isinstance(message.payload, str) else bytes(message.payload)
    proto = message_pb2.NewMessage(
        payload=payload,
        headers=dict(message.headers or {}),
        key=message.key or "",
        priority=message.priority,
        max_attempts=message.max_attempts or 0,
        dedup_id=message.dedup_id or dedup_id or "",
    )
    if message.delay is not None:
        proto.delay.CopyFrom(to_duration(message.delay))
    return proto


@dataclass(frozen=True)
class Batch:
    """The request of one ``enqueue_batch`` call and which of its dedup ids the producer chose."""

    request: queue_service_pb2.EnqueueRequest
    auto: list[bool]

    def results(self, results: list[EnqueueResult]) -> list[EnqueueResult]:
        """``results`` as the caller sees them: a message with a dedup id of the producer's own
        was stored by this call, so it is never a duplicate (a retry of the call found it stored)."""
        return [replace(r, duplicate=False) if auto else r for r, auto in zip(results, self.auto, strict=True)]


def build_batch(queue: str, messages: Iterable[NewMessage], auto_dedup: bool) -> Batch:
    """The Enqueue request for ``messages``; with ``auto_dedup``, one without a dedup id gets a random one.

    The ids are chosen once per call, so every retry of the call (at another
    broker, after a timeout whose attempt may have been stored) resends the
    same ones, and the shard that stored the message answers with it instead
    of storing it twice. A message without key is routed by its dedup id, so a
    retry meets the original on the same shard.
    """
    protos: list[message_pb2.NewMessage] = []
    auto: list[bool] = []
    for message in messages:
        generated = auto_dedup and not message.dedup_id
        protos.append(build_message(message, uuid.uuid4().hex if generated else None))
        auto.append(generated)
    return Batch(queue_service_pb2.EnqueueRequest(queue=queue, messages=protos), auto)


def to_results(response: queue_service_pb2.EnqueueResponse, count: int) -> list[EnqueueResult]:
    """The results of an Enqueue of ``count`` messages (one each, in request order)."""
    if len(response.messages) != count:
        raise CasqError(
            grpc.StatusCode.INTERNAL, f"Enqueue answered {len(response.messages)} results for {count} messages"
        )
    return [EnqueueResult(m.id, m.shard, m.offset, m.duplicate) for m in response.messages]


@dataclass(frozen=True)
class SubBatch:
    """The part of a split batch that one broker can store."""

    address: str
    indexes: list[int]
    request: queue_service_pb2.EnqueueRequest


def split_batch(
    request: queue_service_pb2.EnqueueRequest, redirect: BatchRedirectError, splits: int
) -> list[SubBatch]:
    """The sub-batches of ``request`` by the routes of ``redirect``, its ``splits``-th split.

    Raises ``redirect`` itself (with the reason) when the split limit is used
    up, and INTERNAL when the routes do not list every message exactly once:
    results could not be put back in request order.
    """
    if splits > MAX_BATCH_SPLITS:
        raise BatchRedirectError(
            f"{redirect.message} (the batch still spans several leaders after {MAX_BATCH_SPLITS} splits: "
            "leadership keeps moving; retry the batch later, its dedup ids keep it stored once)",
            redirect.redirect,
        )
    count = len(request.messages)
    seen = sorted(i for _, indexes in redirect.routes for i in indexes)
    if seen != list(range(count)) or any(not address for address, _ in redirect.routes):
        raise CasqError(
            grpc.StatusCode.INTERNAL,
            f"malformed BatchRedirect for a batch of {count} messages: routes {redirect.routes}",
        )
    return [
        SubBatch(
            address,
            indexes,
            # Same messages, fields untouched (dedup ids included), in request order.
            queue_service_pb2.EnqueueRequest(queue=request.queue, messages=[request.messages[i] for i in indexes]),
        )
        for address, indexes in redirect.routes
        if indexes
    ]


def merge_results(count: int, parts: list[tuple[SubBatch, list[EnqueueResult]]]) -> list[EnqueueResult]:
    """The results of the sub-batches, back in the order of the original request."""
    merged: list[EnqueueResult | None] = [None] * count
    for part, results in parts:
        for index, result in zip(part.indexes, results, strict=True):
            merged[index] = result
    return [result for result in merged if result is not None]
