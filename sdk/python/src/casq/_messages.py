"""Building NewMessage protos from Python values."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field

from google.protobuf.duration_pb2 import Duration

from casq.v1 import message_pb2, queue_service_pb2

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


def build_message(message: NewMessage) -> message_pb2.NewMessage:
    payload = message.payload.encode() if isinstance(message.payload, str) else bytes(message.payload)
    proto = message_pb2.NewMessage(
        payload=payload,
        headers=dict(message.headers or {}),
        key=message.key or "",
        priority=message.priority,
        max_attempts=message.max_attempts or 0,
        dedup_id=message.dedup_id or "",
    )
    if message.delay is not None:
        proto.delay.CopyFrom(to_duration(message.delay))
    return proto


def to_results(response: queue_service_pb2.EnqueueResponse) -> list[EnqueueResult]:
    return [EnqueueResult(m.id, m.shard, m.offset, m.duplicate) for m in response.messages]
