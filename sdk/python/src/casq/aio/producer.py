"""Producer: durable enqueues.

The asyncio casq/aio/producer.py is the source of the threaded casq/producer.py, which
sdk/python/scripts/generate-sync.py writes from it with unasync: edit that one.
"""

from __future__ import annotations

import datetime
import functools
import time
from collections.abc import Iterable, Mapping

from casq._connection import Metadata
from casq._messages import (
    EnqueueResult,
    NewMessage,
    Payload,
    build_batch,
    merge_results,
    split_batch,
    to_results,
)
from casq._retry import attempt_timeout
from casq.errors import BatchRedirectError
from casq.v1 import queue_service_pb2

from ._concurrency import run_parallel
from .client import Client


class Producer:
    """Enqueues messages; each call returns once the messages are durable.

    A batch whose messages fall on shards led by different brokers is
    answered with a BatchRedirect; the producer then sends each broker its
    part in parallel (following redirects, splitting again up to
    ``MAX_BATCH_SPLITS`` times if leadership moved meanwhile) and returns
    the results in request order, all within the call's ``retry_timeout``
    (+ ``timeout``). ``casq.Producer`` sends the parts from threads,
    ``casq.aio.Producer`` as tasks (cancelling the call cancels every part).

    A call is retried after failures that leave it unknown whether the
    broker stored the messages (an attempt that timed out at a hung broker),
    so with ``auto_dedup`` (the default) every message enqueued without a
    ``dedup_id`` gets a random one, chosen once per call: a retry that meets
    the stored original is answered with it instead of storing it twice.
    Such a message is routed by that id (like a key) and its result never
    says ``duplicate``. The id costs ~150 bytes of the shard document for the
    queue's dedup window (5 min by default); ``auto_dedup=False`` saves that
    at the price of possible duplicates after such retries.
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
        # Computed once, by the caller: the sub-batches of a split run in other
        # threads (casq.Producer), which do not see the caller's active span.
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
            sends = [functools.partial(self._send, p.request, metadata, deadline, p.address, splits + 1) for p in parts]
            # Every part is over before this returns, also when one failed: once
            # the call is over, nothing more is stored on its behalf.
            results = await run_parallel(sends)
            return merge_results(len(request.messages), list(zip(parts, results, strict=True)))
        return to_results(response, len(request.messages))
