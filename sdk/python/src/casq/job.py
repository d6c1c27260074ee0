"""Job: one delivery handed to a worker handler."""

from __future__ import annotations

import datetime
import json
import threading
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from casq.v1 import message_pb2


def _datetime(stamp: Timestamp | None) -> datetime.datetime | None:
    """A Timestamp as an aware UTC datetime; None when unset."""
    return None if stamp is None else stamp.ToDatetime(tzinfo=datetime.timezone.utc)


# Makes each Job's ``lost`` Event once, whichever thread reads it first.
_LOST_LOCK = threading.Lock()


class Job:
    """One delivery of one message to a worker handler.

    The message: ``id``, ``queue``, ``shard``, ``offset`` (in its shard),
    ``payload``, ``headers``, ``key`` ("" when none), ``priority``,
    ``dedup_id`` ("" when none; the producers set a random one by default),
    ``enqueued_at`` and ``trace_context``. The delivery: ``subscription``,
    ``receipt``, ``attempt`` (from 1), ``max_attempts`` and
    ``lease_deadline``, when the lease runs out as granted with the claim
    (the worker's heartbeats move the broker's deadline later than this).
    Times are aware UTC ``datetime`` objects (None when the broker sent
    none), as the TypeScript SDK's are ``Date`` objects. ``lost`` is set when
    the worker no longer holds the job.
    """

    def __init__(self, claimed: message_pb2.ClaimedMessage) -> None:
        message = claimed.message
        self.id: str = message.id
        self.queue: str = message.queue
        self.shard: int = message.shard
        self.offset: int = message.offset
        self.payload: bytes = message.payload
        self.headers: dict[str, str] = dict(message.headers)
        self.key: str = message.key
        self.priority: int = message.priority
        self.dedup_id: str = message.dedup_id
        self.attempt: int = claimed.attempt
        self.max_attempts: int = claimed.max_attempts
        self.receipt: str = claimed.receipt
        self.subscription: str = claimed.subscription
        self.trace_context: dict[str, str] = {}
        if message.trace_context.traceparent:
            self.trace_context["traceparent"] = message.trace_context.traceparent
            if message.trace_context.tracestate:
                self.trace_context["tracestate"] = message.trace_context.tracestate
        # Made when first read: a reader thread that builds thousands of jobs a
        # second spent a fifth of its time on the two datetimes and the Event.
        self._claimed = claimed
        self._times: tuple[datetime.datetime | None, datetime.datetime | None] | None = None
        self._lost: threading.Event | None = None

    @property
    def enqueued_at(self) -> datetime.datetime | None:
        """When the message was enqueued (aware UTC; None when the broker sent none)."""
        return self._datetimes()[0]

    @property
    def lease_deadline(self) -> datetime.datetime | None:
        """When the lease runs out as granted with the claim (aware UTC; None when the broker sent none)."""
        return self._datetimes()[1]

    @property
    def lost(self) -> threading.Event:
        """Set when the worker no longer holds the job (its lease was lost)."""
        event = self._lost
        if event is None:
            with _LOST_LOCK:
                if self._lost is None:
                    self._lost = threading.Event()
                event = self._lost
        return event

    def _lost_set(self) -> bool:
        """Whether ``lost`` is set, without making its Event."""
        event = self._lost
        return event is not None and event.is_set()

    def _datetimes(self) -> tuple[datetime.datetime | None, datetime.datetime | None]:
        times = self._times
        if times is None:
            claimed = self._claimed
            message = claimed.message
            times = (
                _datetime(message.enqueued_at if message.HasField("enqueued_at") else None),
                _datetime(claimed.lease_deadline if claimed.HasField("lease_deadline") else None),
            )
            self._times = times
        return times

    def text(self) -> str:
        return self.payload.decode()

    def json(self) -> Any:
        return json.loads(self.payload)

    def __repr__(self) -> str:
        return (
            f"Job(id={self.id!r}, queue={self.queue!r}, shard={self.shard}, "
            f"offset={self.offset}, attempt={self.attempt})"
        )
