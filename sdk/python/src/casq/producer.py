"""Producer: durable enqueues (synchronous)."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping

from casq._messages import EnqueueResult, NewMessage, Payload, build_message, to_results
from casq.client import Client
from casq.v1 import queue_service_pb2


class Producer:
    """Enqueues messages; each call returns once the messages are durable."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def enqueue(
        self,
        queue: str,
        payload: Payload,
        *,
        key: str | None = None,
        priority: int = 0,
        delay: float | datetime.timedelta | None = None,
        headers: Mapping[str, str] | None = None,
        max_attempts: int | None = None,
        dedup_id: str | None = None,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> EnqueueResult:
        message = NewMessage(payload, key, priority, delay, headers, max_attempts, dedup_id)
        return self.enqueue_batch(queue, [message], traceparent=traceparent, tracestate=tracestate)[0]

    def enqueue_batch(
        self,
        queue: str,
        messages: Iterable[NewMessage],
        *,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> list[EnqueueResult]:
        request = queue_service_pb2.EnqueueRequest(queue=queue, messages=[build_message(m) for m in messages])
        metadata = self.client.metadata(traceparent, tracestate)
        response = self.client.call(
            lambda address: self.client.queue_stub(address).Enqueue(
                request, timeout=self.client.timeout, metadata=metadata
            )
        )
        return to_results(response)
