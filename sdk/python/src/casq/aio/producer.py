"""Producer for the asyncio API: durable enqueues."""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Iterable, Mapping

from casq._messages import (
    EnqueueResult,
    NewMessage,
    Payload,
    SubBatch,
    build_batch,
    merge_results,
    split_batch,
    to_results,
)
from casq.aio.client import Client
from casq.client import Metadata, attempt_timeout
from casq.errors import BatchRedirectError
from casq.v1 import queue_service_pb2


class Producer:
    """Enqueues messages; each call returns once the messages are durable.

    A batch spanning shards led by different brokers is split and sent to
    them in parallel, as by :class:`casq.Producer`; cancelling the call
    cancels every sub-batch. ``auto_dedup`` as for :class:`casq.Producer`.
    """

    def __init__(self, client: Client, *, auto_dedup: bool = True) -> None:
        self.client = client
        self.auto_dedup = auto_dedup

    async def enqueue(
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
        results = await self.enqueue_batch(queue, [message], traceparent=traceparent, tracestate=tracestate)
        return results[0]

    async def enqueue_batch(
        self,
        queue: str,
        messages: Iterable[NewMessage],
        *,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> list[EnqueueResult]:
        batch = build_batch(queue, messages, self.auto_dedup)
        metadata = self.client.metadata(traceparent, tracestate)
        deadline = time.monotonic() + self.client.retry_timeout
        return batch.results(await self._send(batch.request, metadata, deadline, None, 0))

    async def _send(
        self,
        request: queue_service_pb2.EnqueueRequest,
        metadata: Metadata,
        deadline: float,
        start: str | None,
        splits: int,
    ) -> list[EnqueueResult]:
        """Enqueue ``request`` starting at ``start``, splitting it on a BatchRedirect (``splits`` done so far)."""

        async def attempt(address: str) -> queue_service_pb2.EnqueueResponse:
            return await self.client.queue_stub(address).Enqueue(
                request, timeout=attempt_timeout(self.client.timeout, deadline), metadata=metadata
            )

        try:
            response = await self.client.call(attempt, start=start, deadline=deadline)
        except BatchRedirectError as redirect:
            parts = split_batch(request, redirect, splits + 1)
            return merge_results(len(request.messages), await self._send_parts(parts, metadata, deadline, splits + 1))
        return to_results(response, len(request.messages))

    async def _send_parts(
        self, parts: list[SubBatch], metadata: Metadata, deadline: float, splits: int
    ) -> list[tuple[SubBatch, list[EnqueueResult]]]:
        """Send the sub-batches concurrently, each to its broker; raises the first failure (in route order)."""
        # return_exceptions: wait for every sub-batch even when one failed, so
        # that once the call is over nothing more is stored on its behalf (as
        # in casq.Producer). Cancelling the call still cancels them all.
        outcomes = await asyncio.gather(
            *(self._send(part.request, metadata, deadline, part.address, splits) for part in parts),
            return_exceptions=True,
        )
        parts_results: list[tuple[SubBatch, list[EnqueueResult]]] = []
        for part, outcome in zip(parts, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                raise outcome
            parts_results.append((part, outcome))
        return parts_results
