"""Job: one delivery handed to a worker handler."""

from __future__ import annotations

import json
import threading
from typing import Any

from casq.v1 import message_pb2


class Job:
    """A claimed message. ``lost`` is set when the worker no longer holds it."""

    def __init__(self, claimed: message_pb2.ClaimedMessage) -> None:
        message = claimed.message
        self.id: str = message.id
        self.payload: bytes = message.payload
        self.headers: dict[str, str] = dict(message.headers)
        self.key: str = message.key
        self.priority: int = message.priority
        self.attempt: int = claimed.attempt
        self.max_attempts: int = claimed.max_attempts
        self.receipt: str = claimed.receipt
        self.subscription: str = claimed.subscription
        self.trace_context: dict[str, str] = {}
        if message.trace_context.traceparent:
            self.trace_context["traceparent"] = message.trace_context.traceparent
            if message.trace_context.tracestate:
                self.trace_context["tracestate"] = message.trace_context.tracestate
        self.lost = threading.Event()

    def text(self) -> str:
        return self.payload.decode()

    def json(self) -> Any:
        return json.loads(self.payload)

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, receipt={self.receipt!r}, attempt={self.attempt})"
